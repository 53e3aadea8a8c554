"""The code `--mode reduce-overhead` (or `max-autotune`) writes into a model file; it runs with torch alone.

Compiling each block with CUDA graphs is wrong: the blocks share one compiled function, and CUDA-graph
trees start a new generation at every compiled call, so block i+1 overwrites the output of block i
while the model still holds it ("accessing tensor output of CUDAGraphs that has been overwritten").
The helper puts the CUDA graph around the *owner* of the blocks instead (the module whose `__init__`
builds the container): the owner is compiled with the CUDA-graph mode and each block's `forward` is a
nested compile region (`torch.compiler.nested_compile_region`), which Inductor compiles once and stamps
out for every block. Start-up stays regional; a call is one graph replay, as with full compilation.

The graphed path serves only calls it can serve right; every other call runs the owner eagerly with the
blocks compiled regionally without CUDA graphs (the guarded path). See docs/cuda-graphs.md.
"""

from __future__ import annotations

HELPER_NAME = "_regionalize_cuda_graphs"

HELPER = '''\
def _regionalize_cuda_graphs(block, owner, **compile_kwargs):
    """regionalize: compile `block` regionally and run `owner`'s forward as one CUDA graph.

    Per-block CUDA graphs overwrite each other's outputs, so the graph covers the owner instead: the
    owner is compiled whole (fullgraph) with `compile_kwargs`, and while it is traced each block's forward
    is a nested compile region, compiled once for all blocks. The graphed path takes calls without grad
    or hooks whose arguments are CUDA tensors or plain values; their outputs are copied out of the
    graph's memory pool, so outputs kept from earlier calls stay valid. Other calls run the owner eagerly
    with the blocks compiled regionally, without CUDA graphs; so do all calls once the owner cannot be
    compiled whole (one warning), and all calls on torch without nested compile regions.
    """
    import copy
    import functools
    import warnings

    import torch
    from torch.nn.modules import module as nn_module
    from torch.utils import _pytree as pytree

    block.compile(**{key: value for key, value in compile_kwargs.items() if key != "mode"})
    nested = getattr(torch.compiler, "nested_compile_region", None)
    if nested is None or owner.__dict__.get("_regionalize_graphed"):
        return
    # Read by Dynamo while it traces: the region only applies inside an owner's graph. A block compiled
    # on its own must not be one, since a graph break inside a region is an error, not a fallback.
    tracing_owner = _regionalize_cuda_graphs.__dict__.setdefault("tracing_owner", [False])
    cls = type(block)
    if "_regionalize_region" not in cls.__dict__:
        plain_forward = cls.forward
        region = nested(plain_forward)

        @functools.wraps(plain_forward)
        def forward(self, *args, **kwargs):
            if tracing_owner[0]:
                return region(self, *args, **kwargs)
            return plain_forward(self, *args, **kwargs)

        cls.forward = forward
        cls._regionalize_region = True
    owner.__dict__["_regionalize_graphed"] = True
    guarded = owner._call_impl
    owner.compile(**{**compile_kwargs, "fullgraph": True})
    graphed = owner._compiled_call_impl
    plain = (int, float, bool, str, type(None))
    broken = set()  # call signatures whose graph could not be compiled whole: they stay on the guarded path
    warned = []

    def warn(message):
        if not warned:
            warned.append(message)
            warnings.warn(f"regionalize: {type(owner).__name__}: {message}", stacklevel=4)

    def signature(args, kwargs):
        """None when the graph cannot serve the call; else what decides the path Dynamo traces."""
        if torch.is_grad_enabled() or owner._forward_hooks or owner._forward_pre_hooks:
            return None
        if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
            return None
        leaves, spec = pytree.tree_flatten((args, kwargs))
        parts = [spec]
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor) and leaf.is_cuda:
                parts.append((leaf.dtype, leaf.dim()))
            elif isinstance(leaf, plain):
                parts.append((type(leaf), leaf))
            else:
                return None
        key = tuple(map(str, parts))
        has_tensor = any(isinstance(leaf, torch.Tensor) for leaf in leaves)
        return key if has_tensor and key not in broken else None

    def copied(value):
        if isinstance(value, torch.Tensor):
            return value.clone()
        return value if isinstance(value, plain) else copy.deepcopy(value)

    def skips():
        try:
            from torch._dynamo.utils import counters
        except ImportError:
            return 0
        return counters["inductor"]["cudagraph_skips"]

    def call(*args, **kwargs):
        key = signature(args, kwargs)
        if key is None:
            return guarded(*args, **kwargs)
        before = skips()
        tracing_owner[0] = True
        try:
            out = graphed(*args, **kwargs)
        except torch._dynamo.exc.TorchDynamoException as exc:
            # Raised while compiling, before the whole-graph frame ran: nothing was executed yet.
            broken.add(key)
            warn(f"not compiled whole ({type(exc).__name__}); such calls run regionally, without CUDA graphs")
        finally:
            tracing_owner[0] = False
        if key in broken:
            return guarded(*args, **kwargs)
        if skips() > before:
            warn("CUDA graphs skipped (TORCH_LOGS=perf_hints says why); its calls run compiled without them")
        return pytree.tree_map(copied, out)

    owner._compiled_call_impl = call
'''


def statement(block: str, owner: str, kwargs_src: str) -> str:
    return f"{HELPER_NAME}({', '.join(p for p in (block, owner, kwargs_src) if p)})"
