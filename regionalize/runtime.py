# regionalize runtime 5: written by regionalize, which updates it on a later run; do not edit.
"""What a model rewritten by regionalize calls at run time. It needs torch only.

Hierarchical compilation: the owner of the repeated blocks (the module whose `__init__` builds them) is
compiled whole, and while it is traced each block's `forward` is a nested compile region, which Inductor
compiles once and stamps out for the other blocks. A call is one compiled frame with one guard check, as
with a full `torch.compile`, and the start is close to compiling one block.

A graph break in the owner or a block (an error inside a nested region), or any other failure to compile
the owner whole, is raised while compiling, before the compiled frame has run anything. The owner then
warns once and runs eagerly with each block compiled on its own (per-block regional compilation, which
allows graph breaks): the original's result, never an error the original would not raise.

A block that updates a transformers `DynamicCache` is a region too: the region takes its layer's keys and
values as tensors and returns the new ones, and the cache is written outside it, so one trace serves every
layer.

One file, unlike the rest of regionalize: it is the text the codemod copies whole into each package it
rewrites (`_regionalize.py`), or in part into a lone file, and a rewritten model imports nothing else.
"""

import copy
import functools
import inspect
import sys
import warnings
import weakref

import torch

_regionalize_tracing = [False]  # True while an owner runs whole: block forwards are nested regions then
_regionalize_modules = weakref.WeakSet()  # the owners and blocks set up, to find those of one class
_regionalize_kv = [None]  # do transformers' cache layers update as the cache-updating regions assume
_regionalize_frames = weakref.WeakKeyDictionary()  # owner class -> the function its calls are compiled as


def _regionalize_blocks(block, owner, nested=True, cache_index=None, guard_bypass=None, **compile_kwargs):
    """regionalize: compile `block` as a nested region of `owner`, which is compiled whole.

    Per block instead (`block.compile()`) where the owner cannot be compiled whole, and on torch without
    nested compile regions (before 2.8). Blocks that update a cache of their own: with
    `cache_index="layer_idx"` (the attribute their update takes) and a transformers `DynamicCache` (a
    `past_key_values` parameter), each block is a region that returns its layer's new keys and values,
    the cache written outside it. Otherwise (`nested=False`, or another cache) a region would be traced
    again for every block, so the owner is compiled whole without regions, as a full compile would be.
    (Not with Dynamo's graph deduplication: in torch 2.13 it generated other tokens than eager on
    transformers' GPT-2, a full compile with it too.)

    `guard_bypass="filter"` or `"depyf"` applies that guard bypass to the owner's one frame (and to the
    blocks, where they fall back to per-block compilation).

    With a CUDA-graph mode the owner's frame is one CUDA graph for the calls it can serve (no grad, no
    hooks, CUDA tensors and plain values), its outputs copied out of the graph's memory pool; other calls
    take the per-block path.
    """
    if guard_bypass == "filter":
        compile_kwargs["options"] = {
            **compile_kwargs.get("options", {}),
            "guard_filter_fn": _regionalize_guard_filter,
        }
    state = owner.__dict__.setdefault(
        "_regionalize_owner", {"blocks": [], "kwargs": compile_kwargs, "direct": guard_bypass == "depyf"}
    )
    state["blocks"].append(block)
    _regionalize_modules.update((owner, block))
    if not hasattr(torch.compiler, "nested_compile_region"):
        state["why"] = "this torch has no nested compile regions"
    elif compile_kwargs.get("backend") == "eager":  # no AOTAutograd: a region's backward raises
        state["why"] = "the eager backend cannot differentiate nested regions"
    if "why" in state:
        _regionalize_per_block(owner)
        return
    if owner._compiled_call_impl is None:
        _regionalize_owner_compiled(owner, compile_kwargs)
    cls = type(block)
    if cache_index or not nested:  # traced in the owner's frame until its first call says how
        block.__dict__["_regionalize_layer"] = None
        state.setdefault("indexed", []).append((block, cache_index))
    if "_regionalize_kv_param" not in cls.__dict__:  # the class's forward is not made a region yet
        # The parameter that takes a transformers cache, or None: read once from the forward's signature.
        cls._regionalize_kv_param = _regionalize_kv_name(cls.forward)
        cls._regionalize_copies = [False]  # set when the block's outputs alias: _regionalize_run_whole
        cls.forward = _regionalize_region(cls.forward, *cls._regionalize_kv_param, cls._regionalize_copies)


def _regionalize_kv_name(forward):
    """The parameter of a block's `forward` that takes a transformers cache, and its position after `self`."""
    forward = inspect.unwrap(forward)
    names = list(inspect.signature(getattr(forward, "_regionalize_forward", forward)).parameters)
    name = next((n for n in ("past_key_values", "past_key_value") if n in names), None)
    return name, names.index(name) - 1 if name else 0


def _regionalize_region(plain, name, position, copies):
    """`plain` (a block's forward) as a nested region while an owner is traced whole, itself otherwise.
    A cache that its parameter `name` (at `position` after `self`) takes is stood in for. With `copies[0]`
    the region returns copies of its tensors: a region's outputs must not alias each other or its inputs,
    and Flux's single blocks return two views of one tensor."""
    label = f"{plain.__module__}.{plain.__qualname__}".replace(".", "_")
    region = _regionalize_nested(plain, label)

    # Contiguous copies: with torch.clone's default (preserve_format) of a slice, Inductor computed other
    # values than eager in a region of Flux's single blocks (NaN, measured in torch 2.13).
    def copy(tensor):
        return tensor.clone(memory_format=torch.contiguous_format)

    @functools.wraps(plain)
    def copied(self, *args, **kwargs):
        return torch.utils._pytree.tree_map_only(torch.Tensor, copy, plain(self, *args, **kwargs))

    region_copied = _regionalize_nested(copied, f"{label}_copied")

    def plain_region(self, *args, **kwargs):  # a block without a cache to stand in for
        return (region_copied if copies[0] else region)(self, *args, **kwargs)

    def body(self, keys, values, slot, *args, **kwargs):
        cache = _RegionalizeLayerKV(keys, values)
        if slot is None:
            kwargs[name] = cache
        else:
            args = (*args[:slot], cache, *args[slot + 1 :])
        out = (copied if copies[0] else plain)(self, *args, **kwargs)
        if cache.updates != 1:  # raised while tracing: the owner falls back before anything ran
            raise RuntimeError(f"regionalize: a block updated its cache {cache.updates} times, not once")
        return cache.keys, cache.values, out

    keyed = _regionalize_nested(body, f"{label}_keyed", extras=2)

    @functools.wraps(plain)
    def forward(self, *args, **kwargs):
        if not _regionalize_tracing[0]:
            return plain(self, *args, **kwargs)
        if "_regionalize_layer" not in self.__dict__:
            return plain_region(self, *args, **kwargs)
        index = self.__dict__["_regionalize_layer"]  # a block that updates a cache: its layer, if a region
        if index is None:
            return plain(self, *args, **kwargs)
        slot = None if name in kwargs or len(args) <= position else position
        cache = kwargs.get(name) if slot is None else args[slot]
        if cache is None:
            return plain_region(self, *args, **kwargs)
        layer = _regionalize_kv_layer(cache, index)
        if layer is None:  # a cache of another kind: traced in the owner's frame, layer by layer
            return plain(self, *args, **kwargs)
        if slot is None:
            kwargs = {**kwargs, name: None}
        else:
            args = (*args[:slot], None, *args[slot + 1 :])
        past = (layer.keys, layer.values) if layer.is_initialized else (None, None)
        keys, values, out = keyed(self, *past, slot, *args, **kwargs)
        _regionalize_kv_store(layer, keys, values, 0 if past[0] is None else past[0].shape[-2])
        return out

    return forward


def _regionalize_nested(fn, label, extras=0):
    """`fn` as a nested compile region, its keyword arguments and tuples passed as positional arguments:
    Dynamo's check that a traced region serves another block is cheap where each argument is a tensor or
    a plain value, and otherwise flattens them with pytree as it traces each block (a second of a 32-layer
    Llama's start). `fn` returns a block's output, after `extras` tensors where it has them; the region
    returns them packed (`_regionalize_pack`) and the call unpacked. The regions' code is named `label`,
    so that regions of other blocks are not candidates for their reuse."""

    def as_given(self, *args, **kwargs):
        return _regionalize_pack(fn(self, *args, **kwargs), extras)

    as_given.__code__ = as_given.__code__.replace(co_name=f"{label}_as_given")
    # A variant per block where each reads its own integer (torch's default of 8 would make the ninth
    # layer an error, and so a fallback): a deep stack needs as many as it has layers.
    general = torch.compiler.nested_compile_region(as_given, max_reuse_entries=1024)

    def flat(self, spec, *leaves):
        args, kwargs, at = [], {}, 0
        for item in spec.split(",") if spec else ():
            name, _, count = item.partition(":")
            value = tuple(leaves[at : at + int(count)]) if count else leaves[at]
            at += int(count) if count else 1
            if name == "*":
                args.append(value)
            else:
                kwargs[name] = value
        return _regionalize_pack(fn(self, *args, **kwargs), extras)

    flat.__code__ = flat.__code__.replace(co_name=label)
    flat_region = torch.compiler.nested_compile_region(flat, max_reuse_entries=1024)

    # Traced for every block: kept to a few instructions per argument.
    def call(self, *args, **kwargs):
        leaves, spec, marks = [*args], ["*"] * len(args), 2 * len(args) - 1
        for name, value in kwargs.items():
            if type(value) is tuple:  # not a namedtuple, which `flat` would not rebuild
                spec.append(f"{name}:{len(value)}")
                leaves += value
                marks += 2
            else:
                spec.append(name)
                leaves.append(value)
                marks += 1
        text = ",".join(spec)
        if text.count(",") + text.count(":") + text.count("*") != marks:  # a ** name `spec` cannot hold
            return _regionalize_unpack(general(self, *args, **kwargs), extras)
        return _regionalize_unpack(flat_region(self, text, *leaves), extras)

    return call


def _regionalize_pack(value, extras):
    """What a region returns for `value`, a block's output after `extras` tensors. Dynamo reuses a region
    only if it returns a tensor or a sequence of tensors, so a tensor, or without extras a sequence of
    tensors, is returned as it is (nothing added to a call). Other outputs (a tuple holding None, an
    object) are returned after a marker: a tensor of no elements whose shape says how to rebuild them,
    static where the outputs' are symbolic, so the caller's trace reads it for free. An output that could
    be taken for a marker is always returned after one."""
    front, out = (value[:extras], value[extras]) if extras else ((), value)
    if isinstance(out, torch.Tensor) and not _regionalize_marked(out):
        return (*front, out) if extras else out
    sequence = type(out) in (tuple, list)
    tensors = sequence and all(isinstance(t, torch.Tensor) for t in out)
    if tensors and not extras and not (out and _regionalize_marked(out[0])):
        return out
    items = out if sequence else (out,)
    if all(t is None or isinstance(t, torch.Tensor) for t in items):
        kind, parts = (1 if type(out) is tuple else 2) if sequence else 0, [t for t in items if t is not None]
        codes = [1 if t is not None else 2 for t in items]
    else:  # an object: the region is traced for each block, as Dynamo cannot reuse it
        kind, codes, parts = 3, [], [out]
    device = next((t.device for t in (*front, *parts) if isinstance(t, torch.Tensor)), "cpu")
    marker = torch.empty((0, 82, kind, *codes), dtype=torch.uint8, device=device)
    return (*front, marker, *parts)


def _regionalize_unpack(result, extras):
    """The block's output (after `extras` tensors) that `_regionalize_pack` returned as `result`."""
    if extras:
        front, rest = result[:extras], result[extras:]
        if not _regionalize_marked(rest[0]):
            return (*front, rest[0])
    elif type(result) in (tuple, list) and result and _regionalize_marked(result[0]):
        front, rest = (), result
    else:
        return result
    kind, codes, parts = rest[0].shape[2], rest[0].shape[3:], list(rest[1:])
    if kind == 3:
        out = parts[0]
    else:
        items = [parts.pop(0) if code == 1 else None for code in codes]
        out = items[0] if kind == 0 else tuple(items) if kind == 1 else items
    return (*front, out) if extras else out


def _regionalize_marked(tensor):
    """Is `tensor` a marker of `_regionalize_pack`: no elements, uint8, its shape starting (0, 82)?"""
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.uint8 or tensor.dim() < 3:
        return False
    return tensor.shape[0] == 0 and tensor.shape[1] == 82


class _RegionalizeLayerKV:
    """One layer's keys and values inside a region, standing in for the cache the block updates: `update`
    returns what transformers' `DynamicLayer.update` returns, the states before and the new ones joined."""

    def __init__(self, keys, values):
        self.keys, self.values, self.updates = keys, values, 0

    def update(self, key_states, value_states, *args, **kwargs):
        self.updates += 1
        if self.keys is None:
            # Kept as copies: the region returns them, and a region's outputs must not alias each other
            # or its inputs (GPT-2's keys and values are views of one projection).
            self.keys, self.values = key_states.clone(), value_states.clone()
            return key_states, value_states
        key_states = torch.cat([self.keys, key_states], dim=-2)
        value_states = torch.cat([self.values, value_states], dim=-2)
        self.keys, self.values = key_states, value_states
        return key_states, value_states


def _regionalize_layer_idx(block, attribute):
    """The one value of `attribute` (the index the cache update takes) in the modules of `block`, or None."""
    found = {getattr(m, attribute) for m in block.modules() if isinstance(getattr(m, attribute, None), int)}
    return found.pop() if len(found) == 1 else None


def _regionalize_kv_layer(cache, index):
    """The layer of a transformers `DynamicCache` that a region can stand in for, else None."""
    utils = sys.modules.get("transformers.cache_utils")
    if utils is None or type(cache) is not getattr(utils, "DynamicCache", None) or cache.offloading:
        return None
    if len(cache.layers) <= index:
        if cache.layer_class_to_replicate is not utils.DynamicLayer:
            return None
        while len(cache.layers) <= index:  # what `Cache.update` does first
            cache.layers.append(utils.DynamicLayer())
    layer = cache.layers[index]
    sliding = type(layer) is utils.DynamicSlidingWindowLayer and not layer.record_past
    return layer if type(layer) is utils.DynamicLayer or sliding else None


def _regionalize_kv_store(layer, keys, values, before):
    """Store in `layer` what its `update` would have, given the keys and values it returned."""
    if not layer.is_initialized:
        layer.lazy_initialization(keys, values)
    if layer.is_sliding:  # only the last `sliding_window - 1` tokens are kept
        layer.cumulative_length += keys.shape[-2] - before
        kept = slice(-layer.sliding_window + 1, None)
        keys, values = keys[:, :, kept, :], values[:, :, kept, :]
    layer.keys, layer.values = keys, values


def _regionalize_kv_holds():
    """Do this process's transformers cache layers update as `_RegionalizeLayerKV` and `_regionalize_kv_store`
    assume? Checked once, eagerly, on small tensors: caches of a transformers that changed are not stood in
    for, and their blocks are traced layer by layer."""
    utils = sys.modules.get("transformers.cache_utils")
    try:
        for make in (utils.DynamicLayer, lambda: utils.DynamicSlidingWindowLayer(sliding_window=3)):
            real, mine = make(), make()
            for step in (3, 1, 1):  # a prompt, then tokens past the window
                new = torch.rand(2, 1, 1, step, 2, generator=torch.Generator().manual_seed(step)).unbind()
                past = (mine.keys, mine.values) if mine.is_initialized else (None, None)
                returned = _RegionalizeLayerKV(*past).update(*new)
                _regionalize_kv_store(mine, *returned, 0 if past[0] is None else past[0].shape[-2])
                expected = (*real.update(*new), real.keys, real.values)
                got = (*returned, mine.keys, mine.values)
                if not all(torch.equal(a, b) for a, b in zip(expected, got, strict=True)):
                    return False
                if real.get_seq_length() != mine.get_seq_length():
                    return False
    except Exception:  # no transformers, or another one
        return False
    return True


def _regionalize_per_block(owner):
    """The fallback: each block compiled on its own (without CUDA graphs), the owner run eagerly."""
    state = owner.__dict__["_regionalize_owner"]
    if state.get("compiled", 0) < len(state["blocks"]):  # once per block, not on every training call
        graphs = ("reduce-overhead", "max-autotune")
        kwargs = {k: v for k, v in state["kwargs"].items() if not (k == "mode" and v in graphs)}
        for block in state["blocks"]:
            if block._compiled_call_impl is None:
                block.compile(**_regionalize_static(block, kwargs))
                if state["direct"]:
                    block._compiled_call_impl = _regionalize_direct(block, block._compiled_call_impl)
        state["compiled"] = len(state["blocks"])
    return owner._call_impl


def _regionalize_static(module, kwargs):
    """The compile options for `module`, with `dynamic=False` when another module of its class set up here
    holds parameters of other shapes (stages of growing width). Those share no graph, parameters being
    static, and automatic dynamic shapes would only add a symbolic compile for each: on Swin's stages,
    Inductor's CPU code generation then ran past 5 minutes, against half a minute for a full compile."""
    if "dynamic" in kwargs:
        return kwargs
    kind = type(module)
    shapes = {tuple(p.shape for p in m.parameters()) for m in list(_regionalize_modules) if type(m) is kind}
    return {**kwargs, "dynamic": False} if len(shapes) > 1 else kwargs


def _regionalize_owner_compiled(owner, compile_kwargs):
    """Compile the owner whole, its calls routed through `_regionalize_owner_call` (with its guards skipped
    under `guard_bypass="depyf"`), and return what that call runs.

    Compiled as a function of the owner's class, not its `forward`: Dynamo keeps compiled code, and its
    recompile limit, per code object, and transformers gives every `GradientCheckpointingLayer` subclass a
    `forward` of one code object, so an owner such as Swin's stage would share its limit with every such
    layer compiled in the process (and, past it, run uncompiled or raise under fullgraph)."""
    cls = type(owner)
    frame = _regionalize_frames.get(cls)
    if frame is None:

        def frame(self, *args, **kwargs):
            return self._call_impl(*args, **kwargs)

        frame.__code__ = frame.__code__.replace(co_name=f"{cls.__name__}_forward")
        frame.__qualname__ = frame.__name__ = f"{cls.__name__}_forward"
        _regionalize_frames[cls] = frame
    whole = functools.partial(torch.compile(frame, **compile_kwargs, fullgraph=True), owner)
    if owner.__dict__["_regionalize_owner"]["direct"]:
        whole = _regionalize_direct(owner, whole, frame)
    # Kept out of the module's state, which must pickle: a copy runs eagerly, as torch's would.
    owner._compiled_call_impl = functools.partial(_regionalize_owner_call, owner, whole)
    return whole


def _regionalize_owner_call(owner, whole, *args, **kwargs):
    state = owner.__dict__["_regionalize_owner"]
    if "settled" not in state:  # by the first call, every module of the model is built and set up
        state["settled"] = True
        indexed = state.get("indexed", [])
        kv = bool(indexed) and all(attribute for _, attribute in indexed)
        kv = kv and all(type(b)._regionalize_kv_param[0] for b, _ in indexed)
        if kv and _regionalize_kv[0] is None:
            _regionalize_kv[0] = _regionalize_kv_holds()
        kv = kv and _regionalize_kv[0]
        for block, attribute in indexed if kv else ():
            block.__dict__["_regionalize_layer"] = _regionalize_layer_idx(block, attribute)
        static = _regionalize_static(owner, state["kwargs"])
        if static is not state["kwargs"]:
            whole = _regionalize_owner_compiled(owner, static)
    graphs = state["kwargs"].get("mode") in ("reduce-overhead", "max-autotune")
    # With autograd the per-block path: in torch 2.13 Inductor's backward of a graph holding repeated
    # regions returns wrong gradients (measured: 1e6 off on a
    # 2-layer Llama, where a full compile is exact). Served under no_grad, the owner runs whole.
    if (
        "why" in state
        or torch.is_grad_enabled()
        or (graphs and not _regionalize_graphable(owner, args, kwargs))
    ):
        return _regionalize_per_block(owner)(*args, **kwargs)
    skips = torch._dynamo.utils.counters["inductor"] if graphs else {}
    before = skips.get("cudagraph_skips", 0)
    _regionalize_tracing[0] = True
    try:
        out = _regionalize_run_whole(state, whole, args, kwargs)
    finally:
        _regionalize_tracing[0] = False
    if "why" in state:
        warnings.warn(
            f"regionalize: {type(owner).__name__} cannot be compiled whole ({state['why']}); "
            "its blocks are compiled one by one instead",
            stacklevel=3,
        )
        return _regionalize_per_block(owner)(*args, **kwargs)
    if not graphs:
        return out
    if skips.get("cudagraph_skips", 0) > before and not state.get("skipped"):
        state["skipped"] = True
        warnings.warn(
            f"regionalize: {type(owner).__name__}: CUDA graphs skipped (TORCH_LOGS=perf_hints says why); "
            "such calls run compiled without them",
            stacklevel=3,
        )
    # Outputs kept from an earlier call must not be overwritten by the next replay: tensors are cloned,
    # other objects (a cache the owner created) deep-copied, with the tensors they hold.
    return torch.utils._pytree.tree_map(_regionalize_copied, out)


def _regionalize_run_whole(state, whole, args, kwargs):
    """The owner's compiled frame run, or None with `state["why"]` set when it cannot be compiled: a graph
    break in a region, a Dynamo or Inductor error, the recompile limit (a frame that fails to compile has
    run nothing yet). Two failures are retried first: regions whose outputs alias (each block then
    returns copies of its tensors), and caches stood in for (the block reads an attribute of its cache
    that the stand-in lacks, or updates it other than once: each cache is then traced layer by layer in
    the owner's frame, as a full compile would)."""
    while True:
        try:
            return whole(*args, **kwargs)
        except Exception as error:
            if not _regionalize_compiling(error):
                raise  # raised by the compiled code as it ran: the original raises it too
            why = f"{type(error).__name__}: {(str(error).strip() or '?').splitlines()[0][:200]}"
            aliasing = "aliasing" in str(error)
        uncopied = [
            type(b)._regionalize_copies for b in state["blocks"] if not type(b)._regionalize_copies[0]
        ]
        stood = [b for b, _ in state.get("indexed", ()) if b.__dict__["_regionalize_layer"] is not None]
        if aliasing and uncopied:
            for flag in uncopied:
                flag[0] = True
        elif stood:
            state["kv"] = why
            for block in stood:
                block.__dict__["_regionalize_layer"] = None
        else:
            state["why"] = why
            return None


def _regionalize_copied(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    return value if isinstance(value, (int, float, bool, str, type(None))) else copy.deepcopy(value)


def _regionalize_compiling(error):
    """Was `error` raised while Dynamo compiled a frame (which then ran nothing), not by running code?"""
    if isinstance(error, (torch._dynamo.exc.TorchDynamoException, torch._dynamo.exc.FailOnRecompileLimitHit)):
        return True
    # Dynamo's own failures keep their type (an AssertionError of its tracer): they pass through it.
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__") == "torch._dynamo.convert_frame":
            return True
        tb = tb.tb_next
    return False


def _regionalize_graphable(owner, args, kwargs):
    """Can one CUDA graph serve this call: no hooks, only CUDA tensors and plain values."""
    hooks = torch.nn.modules.module
    if owner._forward_hooks or owner._forward_pre_hooks:
        return False
    if hooks._global_forward_hooks or hooks._global_forward_pre_hooks:
        return False
    leaves = torch.utils._pytree.tree_leaves((args, kwargs))
    plain = (int, float, bool, str, type(None))
    if not all(isinstance(x, plain) or (isinstance(x, torch.Tensor) and x.is_cuda) for x in leaves):
        return False
    return any(isinstance(x, torch.Tensor) for x in leaves)


def _regionalize_eager(call):
    """regionalize: run `call` outside the compiled region. It takes a per-block integer (a KV cache
    indexed by layer): traced in a block compiled on its own, it would give every block a graph of its
    own. Inside an owner compiled whole there is one frame, so it is traced there."""
    if _regionalize_tracing[0]:
        return call()
    return _regionalize_run(call)


@torch.compiler.disable
def _regionalize_run(call):
    return call()


def _regionalize_symbolic_ints(forward):
    """regionalize: trace `forward` with the integer attributes of modules symbolic, so that blocks that
    differ only in such an integer (a layer index) share graphs: one per outcome of a branch on it, not
    one per block. Eager calls compute the same; the setting holds only while this function is traced."""
    if not hasattr(torch._dynamo, "patch_dynamo_config"):  # torch < 2.8: compiled per block, still right
        return forward
    patch = torch._dynamo.patch_dynamo_config(allow_unspec_int_on_nn_module=True)

    def traced(*args, **kwargs):
        with patch:
            return forward(*args, **kwargs)

    # A code object of its own: Dynamo keeps compiled variants, and their limit, per code object.
    traced.__code__ = traced.__code__.replace(co_name=forward.__name__)
    traced.__name__, traced.__doc__ = forward.__name__, forward.__doc__
    traced.__qualname__, traced._regionalize_forward = forward.__qualname__, forward  # its parameters
    return traced


def _regionalize_guard_filter(entries):
    """regionalize guard bypass: skip guards on the structure of modules, keep guards on values.

    Dropped: type, identity-of-dict, hook and global-function guards of nn.Module sources. Kept: inputs,
    grad mode and other global state, parameters, attribute values (training, per-block constants).
    """
    structural = {
        "TYPE_MATCH",
        "NOT_PRESENT_IN_GENERIC_DICT",
        "EMPTY_NN_MODULE_HOOKS_DICT",
        "MODULE_MATCH",
        "BUILTIN_MATCH",
        "CLOSURE_MATCH",
        "FUNCTION_MATCH",
        "DICT_KEYS_MATCH",
        "DICT_VERSION",
    }
    return [
        not (
            entry.guard_type in structural
            and (entry.is_global or entry.orig_guard.source.is_unspecialized_nn_module())
        )
        for entry in entries
    ]


def _regionalize_dispatch(block, **compile_kwargs):
    """regionalize guard bypass: compile `block` in place, then call its compiled code directly."""
    block.compile(**compile_kwargs)
    block._compiled_call_impl = _regionalize_direct(block, block._compiled_call_impl)


def _regionalize_direct(module, guarded, frame=None):
    """regionalize guard bypass: `guarded` (the compiled call of `module`) with its guards skipped.
    `frame` is the function Dynamo compiles for it: the class's `forward` unless given.

    Dynamo's guards run once per dispatch key (tensor shapes, strides, dtypes, devices, requires_grad,
    plain argument values, grad/inference mode, autocast, module.training); later calls with that key
    call the compiled code that served it directly. Other calls, modules with hooks or a patched forward
    take the normal guarded path.
    """
    import inspect
    import types

    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch.nn.modules import module as nn_module

    forward = frame or type(module).forward
    signature = inspect.signature(forward)
    plain = (int, float, bool, str, type(None))
    direct = {}
    recorded = [None, ()]  # the table's fingerprint (_regionalize_watch), and what it watches

    def key(args, kwargs):
        parts = [
            module.training,
            torch.is_grad_enabled(),
            torch.is_inference_mode_enabled(),
            torch.is_autocast_enabled("cpu"),
            torch.is_autocast_enabled("cuda"),
            tuple(kwargs),
        ]
        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Tensor):
                parts.append((value.shape, value.stride(), value.dtype, value.device, value.requires_grad))
            elif isinstance(value, plain):
                parts.append((type(value), value))
            else:
                return None
        return tuple(parts)

    def hooked():
        return (
            module._forward_hooks
            or module._forward_pre_hooks
            or module._backward_hooks
            or module._backward_pre_hooks
            or "forward" in module.__dict__
            or nn_module._global_forward_hooks
            or nn_module._global_forward_pre_hooks
            or nn_module._global_backward_hooks
            or nn_module._global_backward_pre_hooks
        )

    def dispatch(*args, **kwargs):
        k = None if hooked() else key(args, kwargs)
        if k is None:
            return guarded(*args, **kwargs)
        if _regionalize_watch(*recorded[1]) != recorded[0]:  # a hook or a parameter's dtype changed
            direct.clear()
            recorded[1] = _regionalize_watched(module)
            recorded[0] = _regionalize_watch(*recorded[1])
        compiled = direct.get(k)
        if compiled is not None:
            return compiled(module, *args, **kwargs)
        out = guarded(*args, **kwargs)
        bound = signature.bind(module, *args, **kwargs)
        bound.apply_defaults()
        # The frame's locals as Dynamo saw them: a wrapped forward (RGZ004) also has its closure.
        names = forward.__code__.co_freevars
        frame = dict(bound.arguments) | {
            n: c.cell_contents for n, c in zip(names, forward.__closure__ or (), strict=True)
        }
        for entry in _debug_get_cache_entry_list(forward.__code__):  # the order Dynamo tries them in
            if entry.guard_manager.check(frame):
                direct[k] = types.FunctionType(
                    entry.code,
                    forward.__globals__,
                    forward.__name__,
                    forward.__defaults__,
                    forward.__closure__,
                )
                break
        return out

    return dispatch


def _regionalize_watched(module):
    """What the guard bypass watches in `module` on every call, in place of the guards it skips on hooks
    and parameters: the hook dictionaries in use, and where its first parameter is held."""
    hooks = [
        d
        for m in module.modules()
        for d in (m._forward_hooks, m._forward_pre_hooks, m._backward_hooks, m._backward_pre_hooks)
        if d
    ]
    first = next(((m, n) for m in module.modules() for n, p in m._parameters.items() if p is not None), None)
    return hooks, first


def _regionalize_watch(hooks=(), first=None):
    """A fingerprint that changes when a hook is registered anywhere (each registration takes a new handle
    id), one in use is removed, or the first parameter changes dtype, device or object (`.to()`)."""
    parameter = first and first[0]._parameters.get(first[1])
    probe = (id(parameter), parameter.dtype, parameter.device) if parameter is not None else None
    return torch.utils.hooks.RemovableHandle.next_id, tuple(len(d) for d in hooks), probe
