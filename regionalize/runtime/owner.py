"""Compiles the owner of the blocks whole, with its blocks as nested regions, and serves its calls.

Where the owner cannot be compiled whole, it retries in another form or compiles its blocks one by one
(docs/form-torch-versions.md)."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, cast

import torch

from .around import handoff, is_opaque, outside, owned
from .bypass import Direct, guard_filter
from .cpu_answers import start_cpu_check
from .forms import WHOLE, Failure, next_form
from .frames import caller_level, new_frame, torch_compile
from .graphs import graph_modes, is_graphable
from .internals.hooks import compiled_call, module_call, set_compiled_call, submodules
from .internals.tracer import (
    counters,
    has_region_reuse,
    is_aliasing,
    is_backend_failure,
    is_compile_error,
    is_tracing,
    keep_device_guard,
    why_failed,
)
from .kv import Handed, check_kv, is_one_token, layer_idx, mark_kv_growing
from .nested import name_structures
from .outer import has_inner_owners, has_mostly_stages, may_take, refuse, take
from .per_block import per_block
from .plan import plan_for, registration_plan
from .regions import Region, region_of
from .saved import Saved, wanted, why_not
from .stack import fresh_stack
from .state import Args, Config, Findings, Kwargs, OwnerState, Plan, Process, not_saved, process
from .static import check_static
from .threads import run_locked, run_one_at_a_time, setup_lock, this_call, torch_warnings

Compiled = Callable[..., Any]  # the owner's compiled frame, bound to the owner


def register_block(
    block: torch.nn.Module,
    owner: torch.nn.Module,
    nested: bool = True,
    cache_index: str | None = None,
    guard_bypass: str | None = None,
    saved: bool | None = None,
    **compile_kwargs: Any,
) -> None:
    """regionalize: registers `block` as a nested region of `owner`, which its first call compiles whole.

    The block is traced once and stamped out for the other blocks, so each call runs one compiled frame.
    The form the owner takes for this torch and these blocks is planned at its first call (`plan.py`); the
    forms are described in docs/compile-forms.md. `cache_index` names the attribute that a block's cache
    update takes, `nested=False` compiles the owner without regions, `guard_bypass` applies to the owner's
    frame, and `saved` saves the owner's compiled frame for a later process (`saved.py`)."""
    # Under the lock, models built in two threads at once make a class's `forward` a region only once.
    with setup_lock:
        # On torch 2.11, a trace crashes once a thread that traced before has ended.
        if not has_region_reuse():
            keep_device_guard()
        if guard_bypass == "filter":
            compile_kwargs["options"] = {**compile_kwargs.get("options", {}), "guard_filter_fn": guard_filter}
        direct = guard_bypass == "depyf"
        config = Config(compile_kwargs, direct, wanted(saved))
        state = owner.__dict__.get("_regionalize_owner") or OwnerState(config, Findings(Plan(WHOLE)))
        # An owner of owners takes a stage's blocks where it may (`outer.py`); a block that holds owners is
        # not made a region, which would inline them.
        inner = block.__dict__.get("_regionalize_owner")
        if not may_take(owner, inner, config) if inner is not None else has_inner_owners(block):
            return refuse(owner, entry)
        if inner is not None:
            return take(owner, block, state, register_block, compile_kwargs)
        owner.__dict__["_regionalize_owner"] = state
        state.blocks.append(block)
        if not process.counting:  # never removed (docs/design.md#how-a-run-flows)
            process.counting = True
            torch.nn.modules.module.register_module_module_registration_hook(registered)
        state.report.plan = registration_plan(compile_kwargs) or state.report.plan
        if not state.report.plan.form.runs_whole:
            per_block(owner)
            return
        # A compile around the model may hand the owner's calls over to it (`handoff`).
        if (is_opaque(state) or cache_index) and not hasattr(type(owner).forward, "_regionalize_owned"):
            type(owner).forward = owned(type(owner).forward)
        # The owner is compiled by its first call, once it holds all its parameters.
        if compiled_call(owner) is None:
            set_compiled_call(owner, entry(owner, None))
        cls = type(block)
        if cache_index or not nested:  # traced in the owner's frame until the first call decides
            block.__dict__["_regionalize_layer"] = None
            state.indexed.append((block, cache_index))
        block.__dict__.setdefault("_regionalize_structure", None)  # marks the block as set up by an owner
        if region_of(cls) is None:  # the class's forward is not a region yet
            region = cls._regionalize_region = Region(cls.forward)  # type: ignore[attr-defined]
            cls.forward = region.forward


def registered(
    module: torch.nn.Module,
    name: str,
    submodule: torch.nn.Module | None,
    process: Process = process,
    modules: Callable[[torch.nn.Module], dict[str, Any]] = submodules,
    is_compile_error: Callable[[], bool] = torch.compiler.is_compiling,
) -> None:
    """Counts the submodule assignments that replace a submodule, as a global hook on every assignment."""
    # A replaced submodule, such as an adapter, can change a block's structure unseen by the owner's frame.
    # Dynamo traces this hook in every model, so it counts no new names and reads no globals.
    if not is_compile_error() and modules(module).get(name, submodule) is not submodule:
        process.replaced += 1


def compile_owner(owner: torch.nn.Module, state: OwnerState) -> Compiled:
    """Compiles the owner in its form, routes its calls through `owner_call`, and returns what that call runs.

    The compiled function belongs to the owner's class and its parameters' shapes, dtypes and devices, not to
    its `forward`, because Dynamo keeps its limits and dynamic shapes per code object
    (docs/form-hierarchical.md#owners-of-one-class-at-several-widths)."""
    cls = type(owner)
    shapes = tuple((name, tuple(p.shape), p.dtype, p.device) for name, p in owner.named_parameters())
    frames = process.owner_frames.setdefault(cls, {})
    frame = frames.get(shapes)
    if frame is None:  # made in the globals of the owner's code (`frames.py`)
        frame = frames[shapes] = new_frame(cls, "forward")
    form = state.report.plan.form
    if form.keys_first_parameter:
        state.first = first_parameter(owner)
    options = form.options(state)
    whole = torch_compile(frame, options, fullgraph=True)
    if state.config.save:  # saved where it can be
        why = why_not(owner, state)
        state.report.saved = None if why is None else not_saved(why)
        whole = whole if why else Saved(whole, frame, state, options)
    whole = functools.partial(whole, owner)
    if state.config.direct:
        whole = Direct(owner, whole, frame)
    # Kept out of the module's state, which must pickle; a copy runs eagerly, as a copy of torch's would.
    set_compiled_call(owner, entry(owner, whole))
    return whole


def entry(owner: torch.nn.Module, whole: Compiled | None) -> Compiled:
    """Returns the owner's calls, opaque to a compile around them where `is_opaque`."""
    opaque = is_opaque(owner.__dict__["_regionalize_owner"])
    return functools.partial(opaque_call if opaque else owner_call, owner, whole)


def owner_call(owner: torch.nn.Module, whole: Compiled | None, *args: Any, **kwargs: Any) -> Any:
    """Serves a call of `owner`, one thread at a time where torch needs it (`run_one_at_a_time`).

    A call that a compile around the model hands over (`handoff`) breaks that compile's graph here."""
    if handoff(owner, args, kwargs):
        return outside(owner, args, kwargs)
    return run_one_at_a_time(serve_with_warnings, owner, whole, args, kwargs)


def serve_with_warnings(owner: torch.nn.Module, whole: Compiled | None, args: Args, kwargs: Kwargs) -> Any:
    """Serves a call of `owner` with torch's own warnings at Python's default where warnings are errors.

    torch warns as it compiles, and the owner must not fall back for such a warning; the model's own
    warnings stay errors (docs/form-torch-versions.md#torch-versions)."""
    if not any(action == "error" for action, *_ in warnings.filters):
        return serve_call(owner, whole, args, kwargs)
    if is_tracing():  # Dynamo's trace takes `catch_warnings` but no lock
        with warnings.catch_warnings():
            warnings.filterwarnings("default", module=r"torch(\.|$)")
            return serve_call(owner, whole, args, kwargs)
    with torch_warnings:
        return serve_call(owner, whole, args, kwargs)


opaque_call = torch.compiler.disable(owner_call)  # type: ignore[no-untyped-call]  # untyped in torch


@fresh_stack
def serve_call(owner: torch.nn.Module, whole: Compiled | None, args: Args, kwargs: Kwargs) -> Any:
    """Serves a call of `owner` in its form, setting the owner up first where it needs it."""
    state = owner.__dict__["_regionalize_owner"]
    if state.inner and not state.settled and not has_mostly_stages(owner, state):
        run_locked(refuse, owner, entry)  # a planned form, so no warning
        state = owner.__dict__.get("_regionalize_owner")
        if state is None:  # without blocks of its own, each stage is compiled whole at its call
            return module_call(owner)(*args, **kwargs)
    # CUDA graphs serve a CUDA-graph mode, and a call that a compile around the model handed over.
    graphs = state.config.kwargs.get("mode") in graph_modes or this_call.handed is owner
    if (
        not state.settled
        or state.version != process.replaced
        or (state.report.plan.form.keys_first_parameter and state.first != first_parameter(owner))
        or whole is None  # another thread's first call set the owner up while this call waited
    ):
        whole = run_locked(set_up, owner, whole, graphs)
        if "_regionalize_owner" not in owner.__dict__:  # stages given back and no blocks of its own
            return per_block(owner)(*args, **kwargs)
    report = state.report
    per_call = None if graphs else report.plan.form.per_call_reason(state, args, kwargs)
    if per_call == "static":
        report.static_calls = True
    elif per_call == "prompt":
        report.prompt_calls = True
    # Checked until a call hands over a cache that holds keys, or hands over no cache at all.
    if not state.growing and per_call is None and not is_tracing():
        state.growing = mark_kv_growing(args, kwargs) in (Handed.NONE, Handed.MARKED)
    # Calls with autograd take the per-block path: Inductor's code for a graph of repeated regions returns
    # wrong gradients, and per block starts sooner (docs/form-hierarchical.md). Under no_grad it runs whole.
    grad = torch.is_grad_enabled()
    if grad and not report.grad_calls:
        report.grad_calls = True
    if (
        not report.plan.form.runs_whole
        or per_call is not None
        or grad
        or (graphs and not is_graphable(owner, args, kwargs))
    ):
        return per_block(owner)(*args, **kwargs)
    if is_one_token((*args, *kwargs.values())):  # a frame compiled for it serves no later call
        return module_call(owner)(*args, **kwargs)
    return serve_whole(owner, state, whole, graphs, args, kwargs)


def serve_whole(
    owner: torch.nn.Module, state: OwnerState, whole: Compiled, graphs: bool, args: Args, kwargs: Kwargs
) -> Any:
    """Serves a call with the owner's compiled frame, warning once where CUDA graphs skip it.

    Where compiling fails, the form that takes over serves it (`run_compiled`)."""
    before = counters()["inductor"].get("cudagraph_skips", 0) if graphs else 0
    planned = state.report.plan
    out = run_compiled(owner, state, whole, graphs, args, kwargs)
    if state.report.plan is not planned:
        warn_fallback(owner, state)
    form = state.report.plan.form
    if not form.runs_whole:
        return per_block(owner)(*args, **kwargs)
    if graphs and counters()["inductor"].get("cudagraph_skips", 0) > before and not state.skipped:
        state.skipped = True
        warnings.warn(
            f"regionalize: {type(owner).__name__}: CUDA graphs skipped (TORCH_LOGS=perf_hints says why); "
            "such calls run compiled without them",
            stacklevel=caller_level(),
        )
    return form.finish(out, graphs, args, kwargs)


def set_up(owner: torch.nn.Module, whole: Compiled | None, graphs: bool) -> Compiled:
    """Sets the owner up on its first call, compiles it again where its blocks or parameters changed since,
    and returns the compiled frame. It runs under the set-up lock, and a call that waited takes the frame
    that the other thread compiled."""
    state = owner.__dict__["_regionalize_owner"]
    entry = compiled_call(owner)
    if not is_tracing() and isinstance(entry, functools.partial) and entry.args[0] is owner:
        whole = entry.args[1]
    if not state.settled:  # by the first call every module of the model is built and set up
        whole = settle(owner, state, graphs)
    if state.version != process.replaced:  # a submodule was replaced somewhere since the last call
        # Compiled again where a structure's name changed, which also drops a guard bypass's direct calls.
        if name_structures(state.blocks) and state.version is not None:
            whole = compile_owner(owner, state)
        state.version = process.replaced  # set after compiling, so other threads' checks skip the lock
    # torch 2.11 skips the guards on a module's parameters while its dicts are unchanged, so a frame would
    # run on after `.to()` changed them in place. A form that keys its first parameter therefore compiles a
    # new frame when that parameter's dtype or device changes.
    if state.report.plan.form.keys_first_parameter and state.first != first_parameter(owner):
        whole = compile_owner(owner, state)
    return cast(Compiled, whole)  # set up by now, by this call or by another thread's


def settle(owner: torch.nn.Module, state: OwnerState, graphs: bool) -> Compiled:
    """Plans the owner's form at its first call, once every module of the model is built, and compiles it."""
    state.settled = True
    inductor = state.config.kwargs.get("backend", "inductor") == "inductor"
    parameter = first_parameter(owner)
    if inductor and parameter and parameter[1].type == "cpu":
        start_cpu_check()  # it runs while Dynamo traces
    indexed = state.indexed
    regions = [region_of(type(block)) for block, _ in indexed]
    kv = bool(indexed) and all(a and r and r.name for (_, a), r in zip(indexed, regions, strict=True))
    if kv and not process.caches_checked:
        process.caches_checked = True
        process.kv_init, process.static_stand_ins = check_kv(), check_static()
    for block, attribute in indexed if kv and process.kv_init is not None else ():
        block.__dict__["_regionalize_layer"] = layer_idx(block, cast(str, attribute))
    process.reusing = has_region_reuse()
    if state.report.plan.form.runs_whole:  # unless registration already chose per block
        state.report.plan = plan_for(owner, state, graphs, inductor)
    whole = compile_owner(owner, state)  # all its parameters are there by now
    if state.report.plan.fallback:
        warn_fallback(owner, state)
    return whole


def warn_fallback(owner: torch.nn.Module, state: OwnerState) -> None:
    """Warns that `owner` takes a fallback form; per block, it gives its stages their blocks back."""
    plan = state.report.plan
    message = plan.form.warning(type(owner).__name__, plan.reason or "", bool(state.inner))
    warnings.warn(f"regionalize: {message}", stacklevel=caller_level())
    if state.inner and not plan.form.runs_whole:
        run_locked(refuse, owner, entry)


def first_parameter(owner: torch.nn.Module) -> tuple[torch.dtype, torch.device] | tuple[()]:
    """Returns the (dtype, device) of the owner's first parameter, or () where it has none."""
    first = next(owner.parameters(), None)
    return () if first is None else (first.dtype, first.device)


def run_compiled(
    owner: torch.nn.Module, state: OwnerState, whole: Compiled, graphs: bool, args: Args, kwargs: Kwargs
) -> Any:
    """Runs the owner's compiled frame; where it fails to compile, retries, or steps down the ladder.

    A frame that fails to compile has run nothing yet, so it is retried: regions whose outputs alias
    return copies, and blocks whose cache the stand-in cannot serve are traced layer by layer. Otherwise
    the next form of the ladder that takes the failure over compiles the owner (`forms.py`); it returns
    None where that form runs per block."""
    while True:
        this_call.tracing, this_call.graphing = state.report.plan.form.tracing, graphs
        try:
            return whole(*args, **kwargs)
        except Exception as error:
            if not is_compile_error(error):
                raise  # the compiled code raised it as it ran, so the original raises it too
            failure = Failure(why_failed(error), is_backend_failure(error))
            aliasing = is_aliasing(error)
        finally:
            this_call.tracing = this_call.graphing = False
        if not retry_in_place(state, failure, aliasing):
            form = next_form(state.report.plan.form, failure, state)
            state.report.plan = Plan(form, form.reason(failure), fallback=True)
            if not form.runs_whole:
                return None
            whole = compile_owner(owner, state)


def retry_in_place(state: OwnerState, failure: Failure, aliasing: bool) -> bool:
    """Changes what the owner's frame traces so that it may compile in its form; returns whether it did."""
    classes = {region for block in state.blocks if (region := region_of(type(block))) is not None}
    uncopied = [region for region in classes if not region.copies]
    regions = [b for b, _ in state.indexed if b.__dict__["_regionalize_layer"] is not False]
    if aliasing and uncopied:
        for region in uncopied:
            region.copies = True
        return True
    if regions:
        state.report.layer_by_layer = failure.why
        for block in regions:
            block.__dict__["_regionalize_layer"] = False
        return True
    return False
