"""Compiles the owner of the blocks whole, with its blocks as nested regions, and serves its calls.

Where the owner cannot be compiled whole, it retries in another form or compiles its blocks one by one
(docs/form-torch-versions.md)."""

import functools
import warnings

import torch

from .around import handoff, is_opaque, outside, owned
from .bypass import Direct, guard_filter
from .cpu_answers import start_cpu_check
from .frames import caller, new_frame, torch_compile
from .graphs import graphable, kept
from .internals.compiler import inductor_pieces
from .internals.hooks import compiled_call, module_call, set_compiled_call, submodules
from .internals.tracer import (
    backend_failed,
    compiling,
    counters,
    is_aliasing,
    keep_device_guard,
    traced,
    why_failed,
)
from .kv import kv_growing, kv_holds, layer_idx
from .nested import name_structures, reuses
from .outer import holds_owners, mostly_stages, refuse, take, takes
from .per_block import graph_modes, per_block, per_call_reason
from .pieces import pieces_backend
from .plan import plan_for
from .regions import Region, region_of
from .saved import Saved, wanted, why_not
from .stack import fresh_stack
from .state import Form, OwnerState, Plan, process
from .static import static_checked
from .threads import locked, one_at_a_time, setup_lock, this_call, torch_warnings


def register_block(
    block, owner, nested=True, cache_index=None, guard_bypass=None, saved=None, **compile_kwargs
):
    """regionalize: registers `block` as a nested region of `owner`, which its first call compiles whole.

    The block is traced once and stamped out for the other blocks, so each call runs one compiled frame.
    The form the owner takes for this torch and these blocks is planned at its first call (`plan.py`); the
    forms are described in docs/compile-forms.md. `cache_index` names the attribute that a block's cache
    update takes, `nested=False` compiles the owner without regions, `guard_bypass` applies to the owner's
    frame, and `saved` saves the owner's compiled frame for a later process (`saved.py`)."""
    # Under the lock, models built in two threads at once make a class's `forward` a region only once.
    with setup_lock:
        if not reuses():  # on torch 2.11, a trace crashes once a thread that traced before has ended
            keep_device_guard()
        if guard_bypass == "filter":
            compile_kwargs["options"] = {**compile_kwargs.get("options", {}), "guard_filter_fn": guard_filter}
        direct = guard_bypass == "depyf"
        state = owner.__dict__.get("_regionalize_owner") or OwnerState(
            [], compile_kwargs, direct, wanted(saved)
        )
        # An owner of owners takes a stage's blocks where it may (`outer.py`); a block that holds owners is
        # not made a region, which would inline them.
        inner = block.__dict__.get("_regionalize_owner")
        if not takes(owner, inner, compile_kwargs, direct) if inner is not None else holds_owners(block):
            return refuse(owner, entry)
        if inner is not None:
            return take(owner, block, state, register_block, compile_kwargs)
        owner.__dict__["_regionalize_owner"] = state
        state.blocks.append(block)
        if process.replaced is None:  # never removed (docs/design.md#how-a-run-flows)
            process.replaced = 0
            torch.nn.modules.module.register_module_module_registration_hook(registered)
        if not hasattr(torch.compiler, "nested_compile_region"):
            state.plan = Plan(Form.PER_BLOCK, "this torch has no nested compile regions", True)
        elif compile_kwargs.get("backend") == "eager":  # without AOTAutograd a region's backward raises
            state.plan = Plan(Form.PER_BLOCK, "the eager backend cannot differentiate nested regions", True)
        if state.plan.form is Form.PER_BLOCK:
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
            region = cls._regionalize_region = Region(cls.forward)
            cls.forward = region.forward


def registered(
    module, name, submodule, process=process, modules=submodules, compiling=torch.compiler.is_compiling
):
    """Counts the submodule assignments that replace a submodule, as a global hook on every assignment."""
    # A replaced submodule, such as an adapter, can change a block's structure unseen by the owner's frame.
    # Dynamo traces this hook in every model, so it counts no new names and reads no globals.
    if not compiling() and modules(module).get(name, submodule) is not submodule:
        process.replaced += 1


def owner_compiled(owner, compile_kwargs):
    """Compiles the owner whole, routes its calls through `owner_call`, and returns what that call runs.

    The compiled function belongs to the owner's class and its parameters' shapes, dtypes and devices, not to
    its `forward`, because Dynamo keeps its limits and dynamic shapes per code object
    (docs/form-hierarchical.md#owners-of-one-class-at-several-widths)."""
    cls = type(owner)
    shapes = tuple((name, tuple(p.shape), p.dtype, p.device) for name, p in owner.named_parameters())
    frames = process.owner_frames.setdefault(cls, {})
    frame = frames.get(shapes)
    if frame is None:  # made in the globals of the owner's code (`frames.py`)
        frame = frames[shapes] = new_frame(cls, "forward")
    state = owner.__dict__["_regionalize_owner"]
    kwargs = compile_kwargs
    if state.plan.form is Form.PIECES:  # `pieces_backend`
        options = dict(compile_kwargs.get("options", {}))
        kwargs = {k: v for k, v in compile_kwargs.items() if k not in ("mode", "options")}
        if "guard_filter_fn" in options:  # Dynamo's option goes to the frame, Inductor's to the pieces
            kwargs["options"] = {"guard_filter_fn": options.pop("guard_filter_fn")}
        classes = {type(block) for block in state.blocks}
        kwargs["backend"] = pieces_backend(classes, state, compile_kwargs.get("mode"), options)
    whole = torch_compile(frame, kwargs, fullgraph=True)
    if state.save:  # saved where it can be
        why = why_not(owner, state)
        state.saved = why and f"not saved: {why}"
        whole = whole if why else Saved(whole, frame, state)
    whole = functools.partial(whole, owner)
    if state.direct:
        whole = Direct(owner, whole, frame)
    # Kept out of the module's state, which must pickle; a copy runs eagerly, as a copy of torch's would.
    set_compiled_call(owner, entry(owner, whole))
    return whole


def entry(owner, whole):
    """Returns the owner's calls, opaque to a compile around them where `is_opaque`."""
    opaque = is_opaque(owner.__dict__["_regionalize_owner"])
    return functools.partial(opaque_call if opaque else owner_call, owner, whole)


def owner_call(owner, whole, *args, **kwargs):
    """Serves a call of `owner`, one thread at a time where torch needs it (`one_at_a_time`).

    A call that a compile around the model hands over (`handoff`) breaks that compile's graph here."""
    if handoff(owner, args, kwargs):
        return outside(owner, args, kwargs)
    return one_at_a_time(owner_warned, owner, whole, args, kwargs)


def owner_warned(owner, whole, args, kwargs):
    """Serves a call of `owner` with torch's own warnings at Python's default where warnings are errors.

    torch warns as it compiles, and the owner must not fall back for such a warning; the model's own
    warnings stay errors (docs/form-torch-versions.md#torch-versions)."""
    if not any(action == "error" for action, *_ in warnings.filters):
        return owner_serve(owner, whole, args, kwargs)
    if traced():  # Dynamo's trace takes `catch_warnings` but no lock
        with warnings.catch_warnings():
            warnings.filterwarnings("default", module=r"torch(\.|$)")
            return owner_serve(owner, whole, args, kwargs)
    with torch_warnings:
        return owner_serve(owner, whole, args, kwargs)


opaque_call = torch.compiler.disable(owner_call)


@fresh_stack
def owner_serve(owner, whole, args, kwargs):
    state = owner.__dict__["_regionalize_owner"]
    if state.inner and not state.settled and not mostly_stages(owner, state):
        locked(refuse, owner, entry)  # a planned form, so no warning
        state = owner.__dict__.get("_regionalize_owner")
        if state is None:  # without blocks of its own, each stage is compiled whole at its call
            return module_call(owner)(*args, **kwargs)
    # CUDA graphs serve a CUDA-graph mode, and a call that a compile around the model handed over.
    graphs = state.kwargs.get("mode") in graph_modes or this_call.handed is owner
    if (
        not state.settled
        or state.version != process.replaced
        or (state.plan.form is Form.PIECES and state.first != first_parameter(owner))
        or whole is None  # another thread's first call set the owner up while this call waited
    ):
        whole = locked(owner_setup, owner, whole, graphs)
        if "_regionalize_owner" not in owner.__dict__:  # stages given back and no blocks of its own
            return per_block(owner)(*args, **kwargs)
    per_call = None if graphs else per_call_reason(state, args, kwargs)
    if per_call is not None:
        setattr(state, per_call, True)
    # Checked until a call hands over a cache that holds keys, or hands over no cache at all.
    if not state.growing and per_call is None and not traced() and kv_growing(args, kwargs) is not False:
        state.growing = True
    # Calls with autograd take the per-block path, because Inductor's backward of a graph of repeated
    # regions can return wrong gradients (docs/form-hierarchical.md). Under no_grad the owner runs whole.
    if (
        state.plan.form in (Form.PER_BLOCK, Form.ALONE)
        or per_call is not None
        or torch.is_grad_enabled()
        or (graphs and not graphable(owner, args, kwargs))
    ):
        return per_block(owner)(*args, **kwargs)
    skips = counters()["inductor"] if graphs else {}
    before = skips.get("cudagraph_skips", 0)
    planned = state.plan
    this_call.tracing = "flat" if planned.form is Form.PIECES else True
    this_call.graphing = graphs
    try:
        out = run_whole(owner, state, whole, args, kwargs)
    finally:
        this_call.tracing = this_call.graphing = False
    if state.plan is not planned:
        fell_back(owner, state)
    if state.plan.form is Form.PER_BLOCK:  # stages given back, without blocks of its own
        return per_block(owner)(*args, **kwargs)
    if graphs and skips.get("cudagraph_skips", 0) > before and not state.skipped:
        state.skipped = True
        warnings.warn(
            f"regionalize: {type(owner).__name__}: CUDA graphs skipped (TORCH_LOGS=perf_hints says why); "
            "such calls run compiled without them",
            stacklevel=caller(),
        )
    return out if not graphs or state.plan.form is Form.PIECES else kept(out, args, kwargs)


def owner_setup(owner, whole, graphs):
    """Sets the owner up on its first call, compiles it again where its blocks or parameters changed since,
    and returns the compiled frame. It runs under the set-up lock, and a call that waited takes the frame
    that the other thread compiled."""
    state = owner.__dict__["_regionalize_owner"]
    entry = compiled_call(owner)
    if not traced() and isinstance(entry, functools.partial) and entry.args[0] is owner:
        whole = entry.args[1]
    if not state.settled:  # by the first call every module of the model is built and set up
        state.settled = True
        inductor = state.kwargs.get("backend", "inductor") == "inductor"
        parameter = first_parameter(owner)  # its first parameter's (dtype, device), or () without one
        if inductor and parameter and parameter[1].type == "cpu":
            start_cpu_check()  # it runs while Dynamo traces
        indexed = state.indexed
        kv = bool(indexed) and all(attribute and region_of(type(b)).name for b, attribute in indexed)
        if kv and process.kv is None:
            process.kv = kv_holds()
            process.static = static_checked()
        kv = kv and process.kv
        for block, attribute in indexed if kv else ():
            block.__dict__["_regionalize_layer"] = layer_idx(block, attribute)
        process.reusing = reuses()
        if state.plan.form is not Form.PER_BLOCK:  # unless registration already chose per block
            state.plan = plan_for(owner, state, graphs, inductor)
        whole = owner_compiled(owner, state.kwargs)  # all its parameters are there by now
        if state.plan.fallback:
            fell_back(owner, state)
    if state.version != process.replaced:  # a submodule was replaced somewhere since the last call
        # Compiled again where a structure's name changed, which also drops a guard bypass's direct calls.
        if name_structures(state.blocks) and state.version is not None:
            whole = owner_compiled(owner, state.kwargs)
        state.version = process.replaced  # set after compiling, so other threads' checks skip the lock
    # torch 2.11 skips the guards on a module's parameters while its dicts are unchanged, so a frame would
    # run on after `.to()` changed them in place. An owner in pieces therefore compiles a new frame when its
    # first parameter's dtype or device changes.
    if state.plan.form is Form.PIECES and state.first != (first := first_parameter(owner)):
        if state.first is not None:  # known before, and changed since
            whole = owner_compiled(owner, state.kwargs)
        state.first = first
    return whole


def fell_back(owner, state):
    """Warns that `owner` takes a fallback form (`state.plan`), and gives stages their blocks back.

    The fallback is the form in pieces where its blocks cannot be regions, and per block otherwise."""
    name, plan = type(owner).__name__, state.plan
    if plan.form is Form.PIECES:
        message = f"{name}'s {plan.reason.removeprefix('its ')}; it is compiled whole in pieces instead"
    else:
        instead = "its stages own their blocks" if state.inner else "its blocks are compiled one by one"
        message = f"{name} cannot be compiled whole ({plan.reason}); {instead} instead"
    warnings.warn(f"regionalize: {message}", stacklevel=caller())
    if state.inner and plan.form is Form.PER_BLOCK:
        locked(refuse, owner, entry)


def first_parameter(owner: torch.nn.Module) -> tuple:
    """Returns the (dtype, device) of the owner's first parameter, or () where it has none."""
    first = next(owner.parameters(), None)
    return () if first is None else (first.dtype, first.device)


def run_whole(owner, state, whole, args, kwargs):
    """Runs the owner's compiled frame, or returns None with a per-block plan where it cannot be compiled.

    A frame that fails to compile has run nothing yet, so three failures are retried first. Regions whose
    outputs alias return copies of their tensors. Blocks whose cache the stand-in cannot serve are traced
    layer by layer in the owner's frame. Then, with Inductor, blocks that cannot be regions at all are
    traced inline and the owner's graph is compiled in pieces, so that each call stays one frame
    (docs/form-torch-versions.md)."""
    while True:
        try:
            return whole(*args, **kwargs)
        except Exception as error:
            if not compiling(error):
                raise  # the compiled code raised it as it ran, so the original raises it too
            why = why_failed(error)
            aliasing = is_aliasing(error)
            backend = backend_failed(error)  # the trace worked and the backend failed
        classes = {region_of(type(block)) for block in state.blocks} - {None}
        uncopied = [region for region in classes if not region.copies]
        regions = [b for b, _ in state.indexed if b.__dict__["_regionalize_layer"] is not False]
        if aliasing and uncopied:
            for region in uncopied:
                region.copies = True
        elif regions:
            state.kv = why
            for block in regions:
                block.__dict__["_regionalize_layer"] = False
        elif (
            state.plan.form is Form.WHOLE
            and not backend
            and state.kwargs.get("backend", "inductor") == "inductor"
            and inductor_pieces()
        ):
            reason = f"its blocks cannot be nested regions ({why})"
            state.plan, state.first = Plan(Form.PIECES, reason, fallback=True), first_parameter(owner)
            this_call.tracing = "flat"
            whole = owner_compiled(owner, state.kwargs)
        else:
            state.plan = Plan(Form.PER_BLOCK, why, fallback=True)
            return None
