"""The owner's plan at its first call: the form it takes for its blocks and this torch, and why
(`state.py`'s `_RegionalizePlan`)."""

from .constants import _regionalize_constants
from .frames import _regionalize_model_globals, _regionalize_unimportable
from .internals import _regionalize_imports_inlined_modules, _regionalize_inductor_pieces
from .state import _regionalize_process, _RegionalizeForm, _RegionalizePlan


def _regionalize_plan(owner, state, graphs, inductor):
    """The owner's plan at its first call: its form for its blocks and this torch (`_regionalize_form`),
    or per block, a fallback, where that form traces it whole and Dynamo could not inline a block's code
    from the owner's frame (`frames.py`)."""
    plan = _regionalize_form(state, graphs, inductor)
    if plan.form not in (_RegionalizeForm.WHOLE, _RegionalizeForm.PIECES):
        return plan
    inlined = {type(module) for module in (*state.blocks, *(stage for stage, _ in state.inner))}
    why = _regionalize_unimportable(_regionalize_model_globals(type(owner).forward), inlined)
    if why is None or not _regionalize_imports_inlined_modules():
        return plan
    return _regionalize_per_block_plan(why, True)


def _regionalize_form(state, graphs, inductor):
    """The owner's form for its blocks and what this torch offers. One block alone (unless it updates a
    cache or runs in CUDA graphs); blocks that differ in float constants in pieces (`constants.py`), per
    block without Inductor's pieces; where torch reuses no traced region (2.11), in pieces, or per block
    with another backend, as Inductor's graph alone is split (not where the owner holds blocks without
    regions for their cache, `nested=False`, or runs in CUDA graphs: compiled whole as a full compile
    would be); else whole."""
    indexed = state.indexed
    splits = inductor and _regionalize_inductor_pieces() is not None
    constants = None if indexed else _regionalize_constants(state.blocks)
    if len(state.blocks) == 1 and not indexed and not graphs:
        return _RegionalizePlan(_RegionalizeForm.ALONE)
    if constants is not None:
        return _RegionalizePlan(_RegionalizeForm.PIECES if splits else _RegionalizeForm.PER_BLOCK, constants)
    if not _regionalize_process.reusing and splits:
        return _RegionalizePlan(_RegionalizeForm.PIECES, "this torch does not reuse a traced region")
    if not (_regionalize_process.reusing or graphs) and all(attribute for _, attribute in indexed):
        why = "this torch does not reuse a traced region (torch 2.12 and later do)"
        return _regionalize_per_block_plan(why)
    return _RegionalizePlan(_RegionalizeForm.WHOLE)


def _regionalize_per_block_plan(reason, fallback=False):
    return _RegionalizePlan(_RegionalizeForm.PER_BLOCK, reason, fallback)
