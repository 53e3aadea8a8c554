"""The runtime's one door to torch's private names (`regionalize/runtime/internals/`): each probe finds
what it looks for on the running torch, and where torch lacks it takes its fallback with one warning.
Run on every torch CI tests (.ci/torch)."""

from __future__ import annotations

import gc
import inspect
import json
import platform
import subprocess
import sys
import textwrap
import threading
import time
import types
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from regionalize.runtime import forms, owner, plan
from regionalize.runtime.internals import aot, compiler, cpu, hooks, tracer
from regionalize.runtime.owner import register_block

PROBES = (
    tracer.tracing_context,
    tracer.has_region_reuse,
    tracer.cache_entries,
    tracer.config_patch,
    tracer.counters,
    tracer.dynamo_errors,
    tracer.backend_error,
    tracer.has_inlined_module_imports,
    tracer.mark_dynamic_probe,
    tracer.static_attribute,
    hooks.hook_dicts,
    compiler.inductor_pieces,
    cpu.cpu_check,
    cpu.remember_builds,
    aot.saving,
    aot.piece_saving,
    aot.is_gradient_load_supported,
    aot.compile_session,
)


@pytest.fixture(autouse=True)
def fresh_probes() -> Iterator[None]:
    """Each test probes afresh, and leaves no probe that saw a torch patched by it."""
    for probe in PROBES:
        probe.cache_clear()
    yield
    for probe in PROBES:
        probe.cache_clear()


def probed(probe: Any) -> tuple[Any, list[str]]:
    """What `probe` finds, twice, and the warnings it gave: one at most, as the second call is cached."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = probe()
        assert probe() is found
    # torch's own warnings (a deprecation as Inductor is imported) are not the probe's.
    return found, [str(w.message) for w in caught if str(w.message).startswith("regionalize:")]


def test_every_probe_finds_what_it_looks_for_on_this_torch_without_a_warning() -> None:
    found = {probe.__name__: probed(probe) for probe in PROBES}
    assert not [warned for _, warned in found.values() if warned]
    signature = inspect.signature(torch.compiler.nested_compile_region)
    assert found["has_region_reuse"][0] is ("max_reuse_entries" in signature.parameters)
    assert callable(found["cache_entries"][0])
    assert callable(found["config_patch"][0])
    assert found["counters"][0] is torch._dynamo.utils.counters
    assert torch._dynamo.exc.TorchDynamoException in found["dynamo_errors"][0]
    assert found["mark_dynamic_probe"][0] is torch._dynamo.maybe_mark_dynamic
    assert found["static_attribute"][0] == "_dynamo_static_input_type"
    assert len(found["hook_dicts"][0]) == 4
    assert found["tracing_context"][0] is torch._guards.TracingContext.try_get
    assert found["inductor_pieces"][0] is not None
    assert found["cpu_check"][0].name == "regionalize-cpu-check"
    assert callable(found["remember_builds"][0])
    # torch 2.11 keeps `aot_compile` behind a flag, off: nothing is saved there (runtime/saved.py).
    saves = getattr(torch._dynamo.config, "enable_aot_compile", True)
    assert (found["saving"][0] is None) is not saves
    assert (found["piece_saving"][0] is None) is not saves
    if saves:
        assert found["saving"][0].load is torch.compiler.load_compiled_function
        assert isinstance(found["piece_saving"][0].interface, type)
    # torch 2.15 drops a gradient its guard state could not save; 2.11 to 2.14 fail to assign it back.
    version = tuple(int(part) for part in torch.__version__.split(".")[:2])
    assert found["is_gradient_load_supported"][0] is (version >= (2, 15))


def test_without_the_hash_of_traced_lines_no_owner_is_saved(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._dynamo.package

    if not getattr(torch._dynamo.config, "enable_aot_compile", True):
        pytest.skip("this torch keeps aot_compile off (2.11): nothing saved, nothing more probed")

    monkeypatch.delattr(torch._dynamo.package, "_hash_sourcelines")
    fallback(aot.saving, None, "saved owners")


def fallback(probe: Any, expected: Any, needs: str) -> None:
    """`probe` takes its fallback `expected` with one warning naming what it needs."""
    found, warned = probed(probe)
    assert found == expected or found is expected
    assert len(warned) == 1 and warned[0].startswith(f"regionalize: this torch lacks what {needs}")


def test_traced_is_true_in_dynamos_trace_only_and_only_in_the_tracing_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`torch.compiler.is_compiling()` reads a flag of the process's (set while any thread compiles, from
    2.13): an eager call, here with that flag set as another thread's compile sets it, is not traced."""

    def branch(x: torch.Tensor) -> torch.Tensor:
        return x + 1 if tracer.is_tracing() else x - 1

    x = torch.zeros(2)
    assert branch(x).tolist() == [-1, -1]
    assert torch.compile(branch, backend="eager", fullgraph=True)(x).tolist() == [1, 1]
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)
    assert torch.compiler.is_compiling() and not tracer.is_tracing()
    tracer.tracing_context.cache_clear()
    monkeypatch.delattr(torch._guards.TracingContext, "try_get")
    fallback(tracer.tracing_context, None, "is_tracing")
    assert tracer.is_tracing()  # is_compiling() alone, as before


def test_reuse_is_read_from_the_regions_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.compiler, "nested_compile_region", lambda fn=None, is_pure=False: fn)
    assert probed(tracer.has_region_reuse) == (False, [])
    tracer.has_region_reuse.cache_clear()
    monkeypatch.delattr(torch.compiler, "nested_compile_region")  # the owner compiles per block there
    assert probed(tracer.has_region_reuse) == (False, [])
    tracer.has_region_reuse.cache_clear()
    monkeypatch.setattr(torch.compiler, "nested_compile_region", object(), raising=False)  # no signature
    fallback(tracer.has_region_reuse, False, "has_region_reuse")


def test_without_cache_entries_the_guard_bypass_keeps_the_guarded_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def add(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    compiled = torch.compile(add, backend="eager")
    x = torch.zeros(3)
    compiled(x)
    assert tracer.guarded_code(add.__code__, {"x": x}) is not None
    tracer.cache_entries.cache_clear()
    monkeypatch.delattr(torch._C._dynamo.eval_frame, "_debug_get_cache_entry_list")
    fallback(tracer.cache_entries, None, "the guard bypass")
    assert tracer.guarded_code(add.__code__, {"x": x}) is None


def test_a_guard_bypass_without_cache_entries_still_computes_the_original(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(torch._C._dynamo.eval_frame, "_debug_get_cache_entry_list")
    block = torch.nn.Linear(4, 4)
    with pytest.warns(UserWarning, match="the guard bypass"):
        tracer.cache_entries()
    from regionalize.runtime.bypass import dispatch

    expected = block(torch.ones(2, 4))
    dispatch(block, backend="eager")
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(block(torch.ones(2, 4)), expected.detach())


def test_without_the_config_patch_integer_attributes_stay_specialized(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from regionalize.runtime.fixes import symbolic_ints

    def forward(self: Any, x: Any) -> Any:
        return x

    assert symbolic_ints(forward) is not forward
    tracer.config_patch.cache_clear()
    monkeypatch.delattr(torch._dynamo, "patch_dynamo_config")
    fallback(tracer.config_patch, None, "symbolic_ints")
    assert symbolic_ints(forward) is forward


def test_without_dynamos_counters_the_runtime_counts_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch._dynamo.utils, "counters")
    found, warned = probed(tracer.counters)
    assert len(warned) == 1 and "the runtime's counts" in warned[0]
    found["regionalize"]["cuda_graphs_replayed"] += 1
    assert tracer.counters()["regionalize"]["cuda_graphs_replayed"] == 1


def test_without_dynamos_error_types_a_compile_error_is_told_by_its_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert tracer.is_compile_error(torch._dynamo.exc.Unsupported("a graph break"))
    tracer.dynamo_errors.cache_clear()
    monkeypatch.delattr(torch._dynamo.exc, "FailOnRecompileLimitHit")
    fallback(tracer.dynamo_errors, (), "is_compile_error")
    assert not tracer.is_compile_error(torch._dynamo.exc.Unsupported("not raised by Dynamo"))
    dynamo: dict[str, Any] = {"__name__": "torch._dynamo.convert_frame"}
    exec("def trace():\n    raise AssertionError('a tracer bug')", dynamo)
    with pytest.raises(AssertionError) as inside:
        dynamo["trace"]()
    assert tracer.is_compile_error(inside.value)


def test_a_backend_failure_is_told_by_its_type_or_without_it_by_the_error_it_wraps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Wrapped(Exception):
        inner_exception = RuntimeError("a lowering failed")

    failed = torch._dynamo.exc.BackendCompilerFailed.__new__(torch._dynamo.exc.BackendCompilerFailed)
    assert tracer.is_backend_failure(failed)
    assert not tracer.is_backend_failure(Wrapped())  # not torch's type
    assert not tracer.is_backend_failure(torch._dynamo.exc.Unsupported("a graph break"))
    tracer.backend_error.cache_clear()
    monkeypatch.delattr(torch._dynamo.exc, "BackendCompilerFailed")
    fallback(tracer.backend_error, None, "is_backend_failure")
    assert tracer.is_backend_failure(Wrapped())


def test_without_maybe_mark_dynamic_no_length_is_marked(monkeypatch: pytest.MonkeyPatch) -> None:
    tensor = torch.zeros(2, 3)
    tracer.mark_dynamic(tensor, 1)
    assert 1 in getattr(tensor, "_dynamo_weak_dynamic_indices", {1})
    tracer.mark_dynamic_probe.cache_clear()
    monkeypatch.delattr(torch._dynamo, "maybe_mark_dynamic")
    fallback(tracer.mark_dynamic_probe, None, "mark_kv_growing")
    tracer.mark_dynamic(torch.zeros(2, 3), 1)  # a no-op


def test_only_the_runtimes_own_mark_is_taken_off_and_put_back() -> None:
    """A saved frame is checked without the marks of the cache's lengths (runtime/saved.py `fits`): the one
    mark the runtime set comes off and goes back as it was; a tensor marked otherwise keeps its marks."""
    x = torch.randn(2, 5)
    tracer.mark_dynamic(x, 1)
    marks = {name: getattr(x, name) for name in dir(x) if name.startswith(("_dynamo_", "_has_dynamo"))}
    assert marks.get("_dynamo_weak_dynamic_indices") == {1}
    assert tracer.take_mark(x, 0) is None  # not the size it marked
    taken = tracer.take_mark(x, 1)
    assert taken and not [name for name in dir(x) if name.startswith(("_dynamo_", "_has_dynamo"))]
    tracer.put_mark(x, taken)
    assert {name: getattr(x, name) for name in marks} == marks
    torch._dynamo.mark_dynamic(x, 0)  # a mark of the user's: the tensor's marks are not the runtime's alone
    assert tracer.take_mark(x, 1) is None and x._dynamo_weak_dynamic_indices == {1}


def test_a_static_mark_dynamo_no_longer_sets_marks_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    marked = torch.zeros(2)
    torch._dynamo.mark_static_address(marked)
    assert tracer.is_static_marked(marked)
    assert not tracer.is_static_marked(torch.zeros(2))
    tracer.static_attribute.cache_clear()
    monkeypatch.setattr(torch._dynamo, "mark_static_address", lambda tensor, guard=False: None)
    fallback(tracer.static_attribute, None, "CUDA graphs of static caches")
    assert not tracer.is_static_marked(marked)


def test_without_global_hook_dicts_every_call_is_taken_as_hooked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not hooks.has_global_hooks()
    handle = torch.nn.modules.module.register_module_full_backward_hook(lambda *args: None)
    try:
        assert hooks.has_global_hooks() and not hooks.has_global_hooks(backward=False)
    finally:
        handle.remove()
    hooks.hook_dicts.cache_clear()
    monkeypatch.delattr(torch.nn.modules.module, "_global_forward_hooks")
    fallback(hooks.hook_dicts, None, "the checks for global hooks")
    assert hooks.has_global_hooks(backward=False)


def test_without_inductors_pieces_the_probe_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    tools = compiler.inductor_pieces()
    assert str(tools.size_symbol(2)) == "s2"
    compiler.inductor_pieces.cache_clear()
    monkeypatch.setitem(sys.modules, "torch._inductor.compile_fx", None)
    fallback(compiler.inductor_pieces, None, "compiling in pieces")


def test_without_a_saved_form_of_a_backends_output_a_frame_in_pieces_is_not_saved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if aot.saving() is None:
        pytest.skip("this torch saves no compiled frame at all")
    import torch._dynamo.aot_compile

    monkeypatch.delattr(torch._dynamo.aot_compile, "SerializableCallable")
    fallback(aot.piece_saving, None, "saving an owner compiled in pieces")
    assert forms.PIECES.why_not_saved() == "this torch cannot save a frame compiled in pieces"


def test_a_compile_ahead_takes_dynamos_lock_and_session_or_no_ops_without_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch._dynamo.convert_frame import compile_lock

    seen: list[tuple[bool, bool]] = []

    def backend(graph: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
        seen.append((compile_lock._is_owned(), torch.compiler.is_compiling()))  # type: ignore[attr-defined]
        return graph.forward

    def compile_ahead() -> None:
        with aot.as_dynamo_compiles():
            backend(torch.fx.symbolic_trace(torch.nn.Identity()), [])

    compile_ahead()
    assert seen == [(True, hasattr(torch.compiler, "_compile_session_context"))]
    aot.compile_session.cache_clear()
    monkeypatch.delattr(torch._dynamo.convert_frame, "compile_lock")
    _, warned = probed(aot.compile_session)
    assert len(warned) == 1 and "what compiling ahead beside other threads needs" in warned[0]
    compile_ahead()
    assert seen[1] == (False, False)


def test_the_cpu_check_runs_inductors_in_a_thread_which_leaves_it_cached() -> None:
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    valid_vec_isa_list.cache_clear()
    thread = cpu.cpu_check()
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert valid_vec_isa_list.cache_info().currsize == 1


def test_the_cpu_checks_thread_imports_nothing() -> None:
    """The check's imports are made on the caller's thread, since an import beside another thread's can
    fail (setuptools edits `sys.meta_path` as it is imported). In a fresh process, where none is made yet;
    the main thread waits, so what `sys.modules` gains while the check runs is the check's thread's."""
    script = textwrap.dedent(
        """
        import sys
        import torch._inductor.cpu_vec_isa as isa
        from regionalize.runtime.internals import cpu

        check, gained = isa.valid_vec_isa_list, []

        def watched():
            before = set(sys.modules)
            check()
            gained.extend(sorted(set(sys.modules) - before))

        isa.valid_vec_isa_list = watched
        cpu.cpu_check().join(timeout=120)
        print(gained)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64"), reason="other CPUs have one instruction set to check"
)
def test_the_cpu_check_checks_each_instruction_set_at_once_and_inductors_check_builds_nothing_more() -> None:
    """Each set's builds (compiler runs of seconds, here a sleep) run in a thread of their own, beside the
    other sets'; Inductor's check, run after them on the check's thread, finds every answer kept. In a fresh
    process, where no set is checked yet."""
    script = textwrap.dedent(
        """
        import json, threading, time
        import torch._inductor.cpu_vec_isa as isa
        from regionalize.runtime.internals import cpu

        builds = []

        def check_build(self, code):
            start = time.perf_counter()
            time.sleep(0.3)
            builds.append((str(self), threading.current_thread().name, start, time.perf_counter()))
            return True

        isa.VecISA.check_build = check_build
        cpu.cpu_check().join(timeout=120)
        print(json.dumps({"builds": builds, "found": [str(s) for s in isa.valid_vec_isa_list()]}))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    run = json.loads(done.stdout.strip().splitlines()[-1])
    if len(run["found"]) < 2:
        pytest.skip("this CPU reports one instruction set")
    threads = {name: {thread for s, thread, *_ in run["builds"] if s == name} for name in run["found"]}
    assert all(len(names) == 1 for names in threads.values())  # a set's builds, one after another
    assert len(set.union(*threads.values())) == len(run["found"])  # a thread a set
    assert "regionalize-cpu-check" not in set.union(*threads.values())  # Inductor's check built nothing
    firsts = [min(b[2:] for b in run["builds"] if b[0] == name) for name in run["found"]]
    assert max(start for start, _ in firsts) < min(end for _, end in firsts)  # the sets' builds overlap


def test_inductor_picks_its_instruction_set_after_the_cpu_check_not_beside_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check changes an instruction set's flags while it tries them: a kernel Inductor built beside it
    took them into its cache key. A compile's `pick_vec_isa` waits for the check's thread, then finds
    Inductor's own function back in place."""
    import torch._inductor.cpu_vec_isa as isa

    runs: list[tuple[str, float, float]] = []

    def slow_check() -> list[Any]:
        start = time.perf_counter()
        time.sleep(0.5)
        runs.append((threading.current_thread().name, start, time.perf_counter()))
        return []

    monkeypatch.setattr(isa, "valid_vec_isa_list", slow_check)
    cpu.cpu_check()
    assert isa.pick_vec_isa() is isa.invalid_vec_isa  # the check found none
    (checker, _, checked), (picker, picked, _) = runs
    assert checker == "regionalize-cpu-check" and picker == threading.current_thread().name
    assert picked >= checked
    assert isa.valid_vec_isa_list is slow_check


def test_without_inductors_cpu_check_none_is_started(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch._inductor.cpu_vec_isa", None)
    fallback(cpu.cpu_check, None, "the CPU check ahead of compiling")


def test_without_inductors_check_build_every_build_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch._inductor.cpu_vec_isa", None)
    fallback(cpu.remember_builds, None, "the CPU check's answers kept")


@pytest.mark.parametrize(("backend", "started"), [("inductor", 1), ("eager", 0)])
def test_an_owners_first_call_on_the_cpu_starts_the_cpu_check_once(
    monkeypatch: pytest.MonkeyPatch, backend: str, started: int
) -> None:
    """Inductor's CPU check is started on the owner's first call, as Dynamo is about to trace, once, and
    only where Inductor compiles for the CPU."""
    calls = []
    monkeypatch.setattr(owner, "start_cpu_check", lambda: calls.append(1))
    model = model_classes()[1]().eval()
    model.__dict__["_regionalize_owner"].config.kwargs["backend"] = backend
    with torch.no_grad():
        model(torch.randn(2, 8))
        model(torch.randn(2, 8))
    assert len(calls) == started


def model_classes() -> tuple[type[torch.nn.Module], type[torch.nn.Module]]:
    """A block and its owner, whose `__init__` makes each block a region as a rewrite does; new classes
    each time, since the runtime makes their `forward` a region."""

    class Block(torch.nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.fc(x).tanh()

    class Model(torch.nn.Module):
        def __init__(self, d: int = 8, n: int = 3) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block(d) for _ in range(n)])
            for block in self.blocks:
                register_block(block, self)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return x

    return Block, Model


def test_an_owner_that_cannot_be_compiled_in_pieces_compiles_its_blocks_one_by_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a torch that reuses no region and lacks what the pieces need, the owner takes the form of a
    backend other than Inductor: its blocks compiled one by one, the original's outputs."""
    monkeypatch.setattr(owner, "has_region_reuse", lambda: False)
    for part in (forms, plan):  # where the plan is made, and where its retries are
        monkeypatch.setattr(part, "inductor_pieces", lambda: None)
    torch.manual_seed(0)
    model = model_classes()[1]().eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        expected = x
        for block in model.blocks:
            expected = expected + block.fc(expected).tanh()
        torch.testing.assert_close(model(x), expected)
    state = model.__dict__["_regionalize_owner"]
    assert state.report.plan.form.name == "per block" and not state.report.plan.fallback
    assert all(block._compiled_call_impl is not None for block in model.blocks)


@pytest.mark.parametrize("enabled", [True, False])
def test_a_saved_frames_load_runs_with_the_collector_paused_and_leaves_it_as_it_was(
    monkeypatch: pytest.MonkeyPatch, enabled: bool
) -> None:
    seen = []

    def load(file, f_globals):
        seen.append(gc.isenabled())
        raise EOFError("a truncated file")

    monkeypatch.setattr(aot, "saving", lambda: types.SimpleNamespace(load=load))
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        with pytest.raises(EOFError):
            aot.aot_load(None, {})
        after = gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
    assert seen == [False]
    assert after is enabled
