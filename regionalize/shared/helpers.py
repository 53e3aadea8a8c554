"""The names emitted code calls: the public API a rewrite writes (`regionalize.compile_region(...)`,
`regionalize/runtime/api.py`), in the import form and the vendored one alike, and the private helper names
that earlier releases wrote in vendored copies (`_regionalize_blocks(block, self)`), frozen, only for
reading files written so (`legacy_calls.py`): the runtime no longer defines them.
tests/test_frozen_api.py checks that the API and the vendored copy export every public name."""

from __future__ import annotations

BLOCKS = "_regionalize_blocks"  # a block a nested region of its owner, compiled whole
EAGER = "_regionalize_eager"  # a call kept out of the compiled region (a cache update by layer index)
SYMBOLIC_INTS = "_regionalize_symbolic_ints"  # a forward traced with its modules' integers symbolic
GUARD_FILTER = "_regionalize_guard_filter"  # `--guard-bypass filter`'s guard_filter_fn
DISPATCH = "_regionalize_dispatch"  # `--guard-bypass depyf`: a block compiled, its calls dispatched
# Written by an earlier regionalize for --mode reduce-overhead; still read as a compile of its argument.
CUDA_GRAPHS = "_regionalize_cuda_graphs"

PUBLIC = {
    BLOCKS: "compile_region",
    EAGER: "eager",
    SYMBOLIC_INTS: "symbolic_ints",
    GUARD_FILTER: "guard_filter",
    DISPATCH: "compile_direct",
}

MODULE = "regionalize"  # the name a rewritten file binds the API to, in either form
OWNER = "owner"  # `compile_region`'s keyword for the blocks' owner


def public(helper: str) -> str:
    """The call a rewrite writes for an earlier release's helper: `regionalize.compile_region`."""
    return f"{MODULE}.{PUBLIC[helper]}"


COMPILE_REGION = public(BLOCKS)
COMPILE_DIRECT = public(DISPATCH)
