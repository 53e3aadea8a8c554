# regionalize runtime 30: written by regionalize, which updates it on a later run; do not edit.
"""What a model rewritten by regionalize calls at run time. It needs torch only.

Hierarchical compilation: the owner of the repeated blocks (the module whose `__init__` builds them) is
compiled whole, and while it is traced each block's `forward` is a nested compile region, which Inductor
compiles once and stamps out for the other blocks. A call is one compiled frame with one guard check, as
with a full `torch.compile`, and the start is close to compiling one block.

Where torch does not reuse a traced region (2.11), the owner compiled whole would compile every block, a
full compile's start. It is traced whole, blocks and all, as a full compile is, and guarded as one; its
graph is split at its blocks and each distinct piece compiled once (a call is one frame, not a frame a
block). With a backend other than Inductor its blocks are compiled one by one instead, a block whose
cache is stood in for as one frame a call.

In CUDA graphs the owner is opaque to a compile around the model (transformers' `generate` compiles the
forward itself for a static cache): that compile breaks its graph at the owner, which serves itself, one
graph a call, rather than being traced through in pieces (and every block with it, on 2.11). There a call
in pieces is one CUDA graph of them, captured by the runtime. In the default form, where torch reuses no
traced region, such a compile hands over the calls that bring a `StaticCache` on the GPU, which the owner
serves so too: transformers compiles them in CUDA graphs.

A graph break in the owner or a block (an error inside a nested region), or any other failure to compile
the owner whole, is raised while compiling, before the compiled frame has run anything. Blocks that
cannot be regions (an argument Dynamo cannot pass into one) are traced inline instead, the owner's graph
compiled in pieces. Where that fails too, the owner warns once and runs eagerly with each block compiled on
its own (per-block regional compilation, which allows graph breaks), and a block whose own frame fails
to compile before it runs anything runs eagerly: the original's result, never an error the original would
not raise. Every frame the runtime compiles is made in the globals of the model code it calls, so that a
model whose module is not importable by name compiles as `model.compile()` would (`frames.py`).

A block that updates a transformers `DynamicCache` is a region too: the region takes its layer's keys and
values as tensors and returns the new ones, and the cache is written outside it, so one trace serves every
layer; the cache's length is marked dynamic from the first token, whose frame every token then shares.
For a `StaticCache` (transformers' way to serve compiled) the region takes its layer's tensors, which
transformers' own update writes in place.

A module that holds stages, each the owner of its blocks (Swin's), takes their blocks and is compiled
whole, one frame a call where there was one a stage (`outer.py`); where it cannot be compiled whole, the
stages own their blocks again.

A rewritten model calls it through the public API (`api.py`, `import regionalize`), which needs torch
alone. With `--vendor` the codemod joins the other parts into one text and copies it into the package it
rewrites (`_regionalize.py`, this docstring its head), or in part into a lone file.
"""

from .api import compile_direct, compile_region, compile_regions, eager, guard_filter, symbolic_ints

__all__ = ["compile_direct", "compile_region", "compile_regions", "eager", "guard_filter", "symbolic_ints"]
