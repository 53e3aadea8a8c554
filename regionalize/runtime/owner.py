"""The owner of the blocks compiled whole, its blocks nested regions; per block where it cannot be."""

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
    """regionalize: compile `block` as a nested region of `owner`, which is compiled whole: the block traced
    once and stamped out, a call one compiled frame. Where torch reuses no traced region (2.11) the owner's
    graph is compiled in pieces, each distinct block once (`pieces_backend`); per block
    (`block.compile()`) where the owner cannot be compiled whole, with another backend than Inductor there,
    and on torch without nested compile regions. Blocks that update a transformers cache
    (`cache_index="layer_idx"`, the attribute their update takes) are regions taking their layer's tensors,
    the cache written outside. With `nested=False` (or another cache) the owner is compiled whole without
    regions, as a full compile would be. An owner of one block compiles it on its own, nothing to stamp
    out, unless it updates a cache or runs in CUDA graphs. A CUDA-graph mode serves the calls it can in one
    CUDA graph (no grad, no hooks, CUDA tensors), the others per block. `guard_bypass` ("filter" or
    "depyf") applies to the owner's frame. `saved` saves the owner's compiled frame for a later process
    (`saved.py`). The forms' figures: docs/compile-forms.md."""
    # Models built in two threads at once: a class's `forward` made a region once, the hook set once.
    with setup_lock:
        if not reuses():  # torch 2.11, whose traces in threads crash after a thread that traced has ended
            keep_device_guard()
        if guard_bypass == "filter":
            compile_kwargs["options"] = {**compile_kwargs.get("options", {}), "guard_filter_fn": guard_filter}
        direct = guard_bypass == "depyf"
        state = owner.__dict__.get("_regionalize_owner") or OwnerState(
            [], compile_kwargs, direct, wanted(saved)
        )
        # A stage, the owner of blocks, is taken by an owner of owners (`outer.py`), where it may be; a
        # block that holds owners is no region, which would inline them.
        inner = block.__dict__.get("_regionalize_owner")
        if not takes(owner, inner, compile_kwargs, direct) if inner is not None else holds_owners(block):
            return refuse(owner, entry)
        if inner is not None:
            return take(owner, block, state, register_block, compile_kwargs)
        owner.__dict__["_regionalize_owner"] = state
        state.blocks.append(block)
        if process.replaced is None:  # never removed: compiled frames that traced it guard on it
            process.replaced = 0
            torch.nn.modules.module.register_module_module_registration_hook(registered)
        if not hasattr(torch.compiler, "nested_compile_region"):
            state.plan = Plan(Form.PER_BLOCK, "this torch has no nested compile regions", True)
        elif compile_kwargs.get("backend") == "eager":  # no AOTAutograd: a region's backward raises
            state.plan = Plan(Form.PER_BLOCK, "the eager backend cannot differentiate nested regions", True)
        if state.plan.form is Form.PER_BLOCK:
            per_block(owner)
            return
        # `handoff`: what may be handed over.
        if (is_opaque(state) or cache_index) and not hasattr(type(owner).forward, "_regionalize_owned"):
            type(owner).forward = owned(type(owner).forward)
        # Compiled by its first call, once it holds all its parameters.
        if compiled_call(owner) is None:
            set_compiled_call(owner, entry(owner, None))
        cls = type(block)
        if cache_index or not nested:  # traced in the owner's frame until its first call says how
            block.__dict__["_regionalize_layer"] = None
            state.indexed.append((block, cache_index))
        block.__dict__.setdefault("_regionalize_structure", None)  # set up: its class's region serves it
        if region_of(cls) is None:  # the class's forward is not made a region yet
            region = cls._regionalize_region = Region(cls.forward)
            cls.forward = region.forward


def registered(
    module, name, submodule, process=process, modules=submodules, compiling=torch.compiler.is_compiling
):
    """A global hook on every submodule assignment, counting those that replace one: a block's structure
    may have changed (an adapter put on some layers after the first call), which its owner's compiled
    frame would not notice, as torch 2.13 guards the classes of a reused region's modules for the traced
    block only. New names are not counted: transformers slices its layers into a new `ModuleList` on
    every call (`self.layers[: self.config.num_hidden_layers]`), and Dynamo traces this hook there, in
    any model. So it reads no globals, which Dynamo would look up in a module that may be gone."""
    if not compiling() and modules(module).get(name, submodule) is not submodule:
        process.replaced += 1


def owner_compiled(owner, compile_kwargs):
    """Compile the owner whole, its calls routed through `owner_call` (with its guards skipped
    under `guard_bypass="depyf"`), and return what that call runs.

    Compiled as a function of the owner's class and the shapes, dtypes and devices of its parameters, not its
    `forward`: Dynamo keeps compiled code, its recompile limit and its automatic dynamic shapes per code
    object (its name, file and line). transformers gives every `GradientCheckpointingLayer` subclass a
    `forward` of one code object, so an owner such as Swin's stage would share its limit with every such layer
    compiled in the process. And owners of one class at other widths (Swin's stages, a draft model and its
    target) would mark their widths dynamic, which torch 2.13 cannot stamp a region out at (a `KeyError`
    naming the width): they compile as functions of their own, each static at first as any new frame, and
    owners alike (a model built again) share theirs, named uniquely in the process and made in the globals
    of the owner's code (`frames.py`)."""
    cls = type(owner)
    shapes = tuple((name, tuple(p.shape), p.dtype, p.device) for name, p in owner.named_parameters())
    frames = process.owner_frames.setdefault(cls, {})
    frame = frames.get(shapes)
    if frame is None:  # in the globals of the owner's code (`frames.py`)
        frame = frames[shapes] = new_frame(cls, "forward")
    state = owner.__dict__["_regionalize_owner"]
    kwargs = compile_kwargs
    if state.plan.form is Form.PIECES:  # `pieces_backend`
        options = dict(compile_kwargs.get("options", {}))
        kwargs = {k: v for k, v in compile_kwargs.items() if k not in ("mode", "options")}
        if "guard_filter_fn" in options:  # Dynamo's, for the frame; the rest are Inductor's, for the pieces
            kwargs["options"] = {"guard_filter_fn": options.pop("guard_filter_fn")}
        classes = {type(block) for block in state.blocks}
        kwargs["backend"] = pieces_backend(classes, state, compile_kwargs.get("mode"), options)
    whole = torch_compile(frame, kwargs, fullgraph=True)
    if state.save:  # asked for: saved where it can be
        why = why_not(owner, state)
        state.saved = why and f"not saved: {why}"
        whole = whole if why else Saved(whole, frame, state)
    whole = functools.partial(whole, owner)
    if state.direct:
        whole = Direct(owner, whole, frame)
    # Kept out of the module's state, which must pickle: a copy runs eagerly, as torch's would.
    set_compiled_call(owner, entry(owner, whole))
    return whole


def entry(owner, whole):
    """The owner's calls: opaque to a compile around them where `is_opaque`."""
    opaque = is_opaque(owner.__dict__["_regionalize_owner"])
    return functools.partial(opaque_call if opaque else owner_call, owner, whole)


def owner_call(owner, whole, *args, **kwargs):
    """A call of `owner`, one thread's at a time where torch cannot take two at once (`one_at_a_time`). A
    call that a compile around the model traces and hands over (`handoff`) breaks its graph here."""
    if handoff(owner, args, kwargs):
        return outside(owner, args, kwargs)
    return one_at_a_time(owner_warned, owner, whole, args, kwargs)


def owner_warned(owner, whole, args, kwargs):
    """A call of `owner`, where the warnings filter makes no warning an error; otherwise with torch's own
    warnings kept at Python's default. torch warns as it compiles (a deprecation, on 2.11 and 2.13), and
    under `filterwarnings = error` the first call would raise it and the owner fall back for a reason not
    its own. Warnings of other modules (the model's) stay errors."""
    if not any(action == "error" for action, *_ in warnings.filters):
        return owner_serve(owner, whole, args, kwargs)
    if traced():  # Dynamo's trace, which takes `catch_warnings` but no lock
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
        locked(refuse, owner, entry)  # a form: no warning
        state = owner.__dict__.get("_regionalize_owner")
        if state is None:  # no blocks of its own: each stage compiled whole at its call
            return module_call(owner)(*args, **kwargs)
    # In CUDA graphs: in a CUDA-graph mode, or a call handed over by a compile around the model.
    graphs = state.kwargs.get("mode") in graph_modes or this_call.handed is owner
    if (
        not state.settled
        or state.version != process.replaced
        or (state.plan.form is Form.PIECES and state.first != [first_parameter(owner)])
        or whole is None  # called before another thread's first call, which set the owner up, compiled it
    ):
        whole = locked(owner_setup, owner, whole, graphs)
        if "_regionalize_owner" not in owner.__dict__:  # stages given back, no blocks of its own
            return per_block(owner)(*args, **kwargs)
    per_call = None if graphs else per_call_reason(state, args, kwargs)
    if per_call is not None:
        setattr(state, per_call, True)
    # Looked for until a call hands a cache that holds keys, or one hands no cache (not a decoder's call).
    if not state.growing and per_call is None and not traced() and kv_growing(args, kwargs) is not False:
        state.growing = True
    # With autograd the per-block path: in torch 2.13 Inductor's backward of a graph holding repeated
    # regions returns wrong gradients (where a full compile's are exact). Under no_grad the owner runs whole.
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
    if state.plan.form is Form.PER_BLOCK:  # stages given back without blocks of its own run as they are
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
    """Set the owner up on its first call, and compile it again where its blocks or its parameters changed
    since; return the compiled frame its calls run. Under the set-up lock: a thread whose first call waited
    on another's takes the frame that one compiled, not the None its call was made with."""
    state = owner.__dict__["_regionalize_owner"]
    entry = compiled_call(owner)
    if not traced() and isinstance(entry, functools.partial) and entry.args[0] is owner:
        whole = entry.args[1]
    if not state.settled:  # by the first call, every module of the model is built and set up
        state.settled = True
        inductor = state.kwargs.get("backend", "inductor") == "inductor"
        parameter = first_parameter(owner)  # its first parameter's (dtype, device), None without one
        if inductor and parameter is not None and parameter[1].type == "cpu":
            start_cpu_check()  # while Dynamo traces
        indexed = state.indexed
        kv = bool(indexed) and all(attribute and region_of(type(b)).name for b, attribute in indexed)
        if kv and process.kv is None:
            process.kv = kv_holds()
            process.static = static_checked()
        kv = kv and process.kv
        for block, attribute in indexed if kv else ():
            block.__dict__["_regionalize_layer"] = layer_idx(block, attribute)
        process.reusing = reuses()
        if state.plan.form is not Form.PER_BLOCK:  # not one its registration took
            state.plan = plan_for(owner, state, graphs, inductor)
        whole = owner_compiled(owner, state.kwargs)  # its parameters all there by now
        if state.plan.fallback:
            fell_back(owner, state)
    if state.version != process.replaced:  # a submodule replaced somewhere since the last call
        # Compiled again where a name changed, the direct calls of a guard bypass forgotten.
        if name_structures(state.blocks) and state.version is not None:
            whole = owner_compiled(owner, state.kwargs)
        state.version = process.replaced  # once compiled: other threads' checks skip the lock
    # torch 2.11 skips the guards on a module's parameters while its dictionaries are unchanged, so a frame
    # runs on after `.double()` or `.to()` changed them in place (a full compile then raises in an Inductor
    # kernel of the old dtype): an owner in pieces (2.11) takes a frame of its own for its first
    # parameter's new dtype or device.
    if state.plan.form is Form.PIECES and state.first != [first := first_parameter(owner)]:
        if state.first:  # known, and changed since
            whole = owner_compiled(owner, state.kwargs)
        state.first = [first]
    return whole


def fell_back(owner, state):
    """Warn that `owner` takes a fallback (`state.plan`): in pieces where its blocks cannot be regions,
    else per block, where an owner of owners gives its stages their blocks back, each compiled whole."""
    name, plan = type(owner).__name__, state.plan
    if plan.form is Form.PIECES:
        message = f"{name}'s {plan.reason.removeprefix('its ')}; it is compiled whole in pieces instead"
    else:
        instead = "its stages own their blocks" if state.inner else "its blocks are compiled one by one"
        message = f"{name} cannot be compiled whole ({plan.reason}); {instead} instead"
    warnings.warn(f"regionalize: {message}", stacklevel=caller())
    if state.inner and plan.form is Form.PER_BLOCK:
        locked(refuse, owner, entry)


def first_parameter(owner):
    first = next(owner.parameters(), None)
    return None if first is None else (first.dtype, first.device)


def run_whole(owner, state, whole, args, kwargs):
    """The owner's compiled frame run, or None with a per-block plan when it cannot be compiled: a graph
    break in a region, a Dynamo or Inductor error, the recompile limit (a frame that fails to compile has
    run nothing yet). Three failures are retried first: regions whose outputs alias (each block then
    returns copies of its tensors); blocks of a class that updates a cache made regions (a cache stood in
    for, whose attribute the block reads that the stand-in lacks, or which it updates other than once; or
    a call that hands the block no cache): each such block is then traced layer by layer in the owner's
    frame, as a full compile would; and then, with Inductor, a trace that failed (not the compile after
    it): blocks that cannot be regions at all (an argument that Dynamo cannot pass into one, such as
    whisper's cache, a dict keyed by modules). The owner is then traced whole as a full compile would be
    and its graph compiled in pieces: a call stays one frame, where the blocks compiled one by one would
    share a frame that compiles again for each block's cache."""
    while True:
        try:
            return whole(*args, **kwargs)
        except Exception as error:
            if not compiling(error):
                raise  # raised by the compiled code as it ran: the original raises it too
            why = why_failed(error)
            aliasing = is_aliasing(error)
            backend = backend_failed(error)  # traced, failed in the backend
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
            state.plan, state.first = Plan(Form.PIECES, reason, fallback=True), [first_parameter(owner)]
            this_call.tracing = "flat"
            whole = owner_compiled(owner, state.kwargs)
        else:
            state.plan = Plan(Form.PER_BLOCK, why, fallback=True)
            return None
