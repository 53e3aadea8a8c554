"""Serving code calls models from several threads: calls of one rewritten model, or of two, made at once
give what the same calls give one at a time, and what one thread's call sets is not seen by another's.
The models make their blocks regions as a rewrite does (`_regionalize_blocks` in the owner's `__init__`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

import regionalize
from regionalize.runtime import forms, owner, saved, threads
from regionalize.runtime.internals import aot
from regionalize.runtime.internals.tracer import compiles_seen_in_every_thread
from regionalize.runtime.owner import register_block
from regionalize.runtime.threads import setup_lock, this_call

THREADS = 4


def concurrently(calls: list[Callable[[], Any]]) -> list[Any]:
    """Each of `calls` in a thread of its own, all started together (a barrier) so that they overlap."""
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], Any]) -> Any:
        barrier.wait()
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def stack(activation: str, regionalized: bool, **compile_kwargs: Any) -> type[torch.nn.Module]:
    """A model of blocks, its blocks regions of it where `regionalized`. New classes each time: the
    runtime makes a block class's `forward` a region."""

    class Block(torch.nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + getattr(torch, activation)(self.fc(x))

    class Model(torch.nn.Module):
        def __init__(self, d: int = 8, n: int = 4) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block(d) for _ in range(n)])
            for block in self.blocks if regionalized else ():
                register_block(block, self, **compile_kwargs)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return x

    return Model


def pair(activation: str, **compile_kwargs: Any) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A rewritten model and the original with the same weights."""
    torch.manual_seed(0)
    model = stack(activation, True, **compile_kwargs)().eval()
    twin = stack(activation, False)().eval()
    twin.load_state_dict(model.state_dict())
    return model, twin


def calls(model: torch.nn.Module, inputs: list[torch.Tensor], grad: bool = False) -> Callable[[], list[Any]]:
    """One thread's work: `model` called on each of `inputs` in turn (grad mode is the thread's own)."""

    def run() -> list[Any]:
        with torch.set_grad_enabled(grad):
            return [model(x).detach() for x in inputs]

    return run


def inputs(seed: int, rows: int = 2) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, 8, generator=generator) for _ in range(3)]


def test_a_flag_one_thread_sets_is_not_seen_by_another() -> None:
    barrier = threading.Barrier(2)

    def setting() -> tuple[Any, Any]:
        this_call.tracing = "flat"
        this_call.standing_in = True
        barrier.wait()  # the other thread reads now
        barrier.wait()
        seen = this_call.tracing, this_call.standing_in
        this_call.tracing = this_call.standing_in = False
        return seen

    def reading() -> tuple[Any, Any]:
        barrier.wait()
        seen = this_call.tracing, this_call.standing_in
        barrier.wait()
        return seen

    assert concurrently([setting, reading]) == [("flat", True), (False, False)]
    assert (this_call.tracing, this_call.standing_in) == (False, False)


def test_threads_calling_one_model_at_once_get_what_calls_one_at_a_time_get() -> None:
    """The first calls too, which set the owner up and compile it: one thread sets it up, and the others
    run the frame it compiled."""
    model, twin = pair("tanh")
    work = [inputs(seed, rows=2 + seed % 2) for seed in range(THREADS)]
    together = concurrently([calls(model, xs) for xs in work])
    alone = [calls(model, xs)() for xs in work]
    expected = [calls(twin, xs)() for xs in work]
    torch.testing.assert_close(together, alone)
    torch.testing.assert_close(together, expected)
    state = model.__dict__["_regionalize_owner"]
    assert not state.report.plan.fallback  # no fallback: this torch's form


class Tanh(torch.nn.Module):
    """A block of module-level classes, which a saved frame can name (unlike `stack`'s)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


@torch.library.custom_op("regionalize_tests::beside", mutates_args=())
def beside(x: torch.Tensor) -> torch.Tensor:
    """Runs `BESIDE` in another thread while AOTAutograd traces it (its fake), then returns a copy."""
    return x.clone()


BESIDE: list[Callable[[], object]] = []  # what `beside` runs in another thread, once
BESIDE_RAN: list[object] = []  # what that returned or raised


def is_fx_tracing() -> bool:
    """Returns FX's tracing flag: the process's on torch 2.13 and before, the calling thread's from 2.14."""
    fx = torch.fx._symbolic_trace
    read = getattr(fx, "_get_is_fx_tracing", None)
    return bool(read() if read is not None else fx._is_fx_tracing_flag)


@beside.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    if is_fx_tracing() and BESIDE and not BESIDE_RAN:  # AOTAutograd's trace
        thread = threading.Thread(target=lambda: BESIDE_RAN.append(BESIDE[0]()))
        thread.start()
        thread.join(60)
    return torch.empty_like(x)


class Beside(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return beside(self.fc(x))


def test_a_call_beside_a_first_call_that_compiles_ahead_waits_for_its_frame(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A saved owner's first call compiles its frame ahead; a second thread's call made meanwhile waits and
    runs that frame. Compiling its own beside it would undo FX's process-wide patches wrongly."""
    if aot.saving() is None:
        pytest.skip("this torch saves no compiled frame")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # nothing saved yet, whatever ran before
    torch.manual_seed(0)
    model, x = torch.nn.Sequential(*(Tanh() for _ in range(4))).eval(), inputs(0)[0]
    with torch.no_grad():
        expected = model(x)
    regionalize.compile_regions(model, saved=True)
    calling, done = threading.Event(), []

    def call_beside() -> None:
        calling.set()
        with torch.no_grad():
            done.append(model(x))

    other = threading.Thread(target=call_beside)
    real = saved.aot_compile

    def ahead(*args: Any, **kwargs: Any) -> Any:
        if not other.is_alive() and not done:  # the first call's compile: the other thread calls now
            other.start()
            calling.wait(30)
            time.sleep(0.5)  # long enough for its call to pass the point where it waits
        return real(*args, **kwargs)

    monkeypatch.setattr(saved, "aot_compile", ahead)
    counters = torch._dynamo.utils.counters
    counters.clear()
    with torch.no_grad():
        first = model(x)
    other.join(60)
    torch.testing.assert_close(first, expected)
    torch.testing.assert_close(done[0], expected)
    assert counters["stats"]["unique_graphs"] == 1  # the frame compiled ahead, and no other
    assert regionalize.describe(model)[0].saved == "saved"


def test_a_compiled_call_beside_a_compile_ahead_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Another thread's call of compiled code runs while AOTAutograd traces a saved owner's frame compiled
    ahead: that compile marks a compile session, as Dynamo's compiles do, so FX's process-wide tracing
    flag is not taken for the other thread's."""
    if aot.saving() is None or not compiles_seen_in_every_thread():
        pytest.skip("this torch saves no compiled frame, or marks no compile for every thread")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    compiled = torch.compile(torch.sin, backend="aot_eager")
    compiled(torch.ones(2))  # compiled before, so the call beside compiles nothing

    def call() -> object:
        try:
            return compiled(torch.ones(2))
        except RuntimeError as error:
            return error

    monkeypatch.setattr(sys.modules[__name__], "BESIDE", [call])
    monkeypatch.setattr(sys.modules[__name__], "BESIDE_RAN", [])
    model = regionalize.compile_regions(torch.nn.Sequential(*(Beside() for _ in range(3))), saved=True)
    with torch.no_grad():
        model(torch.randn(2, 8))
    assert len(BESIDE_RAN) == 1 and isinstance(BESIDE_RAN[0], torch.Tensor), BESIDE_RAN
    assert regionalize.describe(model)[0].saved == "saved"


def test_a_failed_call_after_another_thread_stepped_the_owner_down_to_the_last_form_stays_there() -> None:
    """A call whose frame failed to compile after another thread's call had moved the owner to the ladder's
    last form keeps that form, rather than finding none below it."""
    model, _ = pair("tanh")
    with torch.no_grad():
        model(inputs(0)[0])
    state = model.__dict__["_regionalize_owner"]
    assert forms.next_form(forms.PER_BLOCK, forms.Failure("a backend error", True), state) is forms.PER_BLOCK


def test_threads_calling_two_models_at_once_each_get_their_own_outputs() -> None:
    first, first_twin = pair("tanh", backend="aot_eager")
    second, second_twin = pair("relu", backend="aot_eager")
    models = [(first, first_twin), (second, second_twin)] * (THREADS // 2)
    work = [inputs(seed) for seed in range(THREADS)]
    together = concurrently([calls(model, xs) for (model, _), xs in zip(models, work, strict=True)])
    alone = [calls(model, xs)() for (model, _), xs in zip(models, work, strict=True)]
    expected = [calls(twin, xs)() for (_, twin), xs in zip(models, work, strict=True)]
    torch.testing.assert_close(together, alone)
    torch.testing.assert_close(together, expected)


def test_calls_with_and_without_autograd_at_once_take_their_own_paths() -> None:
    """With autograd a call takes the per-block path, without it the owner's whole frame: two threads'
    calls of one model, one of each kind, at once."""
    model, twin = pair("tanh", backend="aot_eager")
    work = [inputs(seed) for seed in range(THREADS)]
    grads = [seed % 2 == 0 for seed in range(THREADS)]
    together = concurrently([calls(model, xs, grad) for xs, grad in zip(work, grads, strict=True)])
    expected = [calls(twin, xs)() for xs in work]
    torch.testing.assert_close(together, expected)


def test_calls_at_once_under_error_filters_leave_the_filters_as_they_were() -> None:
    """Where warnings are errors, a call keeps torch's at their default while it runs: overlapping calls
    must not restore each other's filters and leave that one on."""
    model, twin = pair("sigmoid", backend="aot_eager")
    work = [inputs(seed) for seed in range(THREADS)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        before = list(warnings.filters)
        together = concurrently([calls(model, xs) for xs in work])
        assert warnings.filters == before
    torch.testing.assert_close(together, [calls(twin, xs)() for xs in work])


@pytest.mark.parametrize("seen", [False, True])
def test_where_torch_cannot_call_while_it_compiles_an_owners_calls_run_one_at_a_time(
    monkeypatch: pytest.MonkeyPatch, seen: bool
) -> None:
    """torch 2.11 and 2.12 set FX's tracing flag for the process while AOTAutograd traces, and another
    thread's call of a compiled frame meanwhile raised: there an owner's call, and any compile it makes,
    holds the set-up lock, which another thread's call waits on. Elsewhere calls hold it not."""
    monkeypatch.setattr(threads, "compiles_seen_in_every_thread", lambda: seen)
    serve, held = owner.serve_call, []

    def observed(*args: Any) -> Any:
        def try_lock() -> None:  # from another thread, as another call would
            taken = setup_lock.acquire(blocking=False)
            held.append(not taken)
            if taken:
                setup_lock.release()

        other = threading.Thread(target=try_lock)
        other.start()
        other.join()
        return serve(*args)

    monkeypatch.setattr(owner, "serve_call", observed)
    model, twin = pair("tanh", backend="aot_eager")
    x = inputs(0)[0]
    with torch.no_grad():
        torch.testing.assert_close(model(x), twin(x))
    assert held == [not seen]


def test_threads_that_first_called_and_ended_leave_later_threads_compiling() -> None:
    """A server's worker threads come and go: one makes a model's first call and ends, and another makes
    another model's. torch 2.11's Dynamo crashed there (a segfault in `FakeTensorMode.__enter__`): the
    no-op CUDA device guard that its trace sets where CUDA is unavailable was the first tracing thread's,
    gone with it. In a process of its own, the crash being one."""
    script = textwrap.dedent(
        """
        import sys, threading, torch
        sys.path.insert(0, sys.argv[1])
        from test_threads import calls, inputs, pair

        models = [pair(activation) for activation in ("tanh", "relu", "sigmoid")]
        for model, twin in models:  # each first called, and compiled, in a thread that then ends
            outs = []
            thread = threading.Thread(target=lambda: outs.append(calls(model, inputs(0))()))
            thread.start()
            thread.join()
            torch.testing.assert_close(outs, [calls(twin, inputs(0))()])
        print("same")
        """
    )
    tests = str(Path(__file__).resolve().parent)
    done = subprocess.run([sys.executable, "-c", script, tests], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["same"]


DECODER = """
class Attention(torch.nn.Module):
    def __init__(self, d, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.k = torch.nn.Linear(d, d)
        self.v = torch.nn.Linear(d, d)

    def forward(self, x, past_key_values=None):
        k, v = self.k(x)[:, None], self.v(x)[:, None]
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        return x + (k.mean(dim=-2) * v.mean(dim=-2))


class Block(torch.nn.Module):
    def __init__(self, d, layer_idx):
        super().__init__()
        self.attn = Attention(d, layer_idx)
        self.mlp = torch.nn.Linear(d, d)

    def forward(self, x, past_key_values=None):
        return self.mlp(self.attn(x, past_key_values=past_key_values)).tanh()


class Decoder(torch.nn.Module):
    def __init__(self, d=8, depth=4):
        super().__init__()
        self.layers = torch.nn.ModuleList([Block(d, i) for i in range(depth)])
        for block in self.layers if REGIONALIZED else ():
            _regionalize_blocks(block, self, cache_index="layer_idx", backend="aot_eager")

    def forward(self, x, past_key_values=None):
        for layer in self.layers:
            x = layer(x, past_key_values)
        return x
"""


def decoder(regionalized: bool) -> type[torch.nn.Module]:
    space: dict[str, Any] = {"torch": torch, "_regionalize_blocks": register_block}
    space["REGIONALIZED"] = regionalized
    exec(compile(DECODER, f"threads_decoder_{regionalized}", "exec"), space)
    return space["Decoder"]


def test_threads_decoding_with_dynamic_caches_at_once_each_get_their_own_tokens() -> None:
    """Blocks whose cache a region stands in for: each thread decodes with a `DynamicCache` of its own, a
    prompt then tokens, and gets the outputs and cache it would alone."""
    cache_utils = pytest.importorskip("transformers.cache_utils")
    torch.manual_seed(0)
    model = decoder(True)().eval()
    twin = decoder(False)().eval()
    twin.load_state_dict(model.state_dict())

    def generation(seed: int, module: torch.nn.Module) -> Callable[[], list[Any]]:
        def run() -> list[Any]:
            generator = torch.Generator().manual_seed(seed)
            cache, out = cache_utils.DynamicCache(), []
            with torch.no_grad():
                for length in (3, 1, 1, 1):
                    out.append(module(torch.randn(1, length, 8, generator=generator), cache))
            return [*out, *(tensor for layer in cache.layers for tensor in (layer.keys, layer.values))]

        return run

    together = concurrently([generation(seed, model) for seed in range(THREADS)])
    alone = [generation(seed, model)() for seed in range(THREADS)]
    expected = [generation(seed, twin)() for seed in range(THREADS)]
    torch.testing.assert_close(together, alone)
    torch.testing.assert_close(together, expected)
