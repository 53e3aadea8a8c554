"""The owner's plan at its first call: the form it takes for its blocks and this torch, and why
(`state.py`'s `Plan`)."""

from .constants import differing_constants
from .frames import globals_of, unimportable
from .internals.compiler import inductor_pieces
from .internals.tracer import imports_inlined_modules
from .state import Form, Plan, process


def plan_for(owner, state, graphs, inductor):
    """The owner's plan at its first call: its form for its blocks and this torch (`form_for`),
    or per block, a fallback, where that form traces it whole and Dynamo could not inline a block's code
    from the owner's frame (`frames.py`)."""
    plan = form_for(state, graphs, inductor)
    if plan.form not in (Form.WHOLE, Form.PIECES):
        return plan
    inlined = {type(module) for module in (*state.blocks, *(stage for stage, _ in state.inner))}
    why = unimportable(globals_of(type(owner).forward), inlined)
    if why is None or not imports_inlined_modules():
        return plan
    return Plan(Form.PER_BLOCK, why, fallback=True)


def form_for(state, graphs, inductor):
    """The owner's form for its blocks and what this torch offers. One block alone (unless it updates a
    cache or runs in CUDA graphs); blocks that differ in float constants in pieces (`constants.py`), per
    block without Inductor's pieces; where torch reuses no traced region (2.11), in pieces, or per block
    with another backend, as Inductor's graph alone is split (not where the owner holds blocks without
    regions for their cache, `nested=False`, or runs in CUDA graphs: compiled whole as a full compile
    would be); else whole."""
    indexed = state.indexed
    splits = inductor and inductor_pieces() is not None
    constants = None if indexed else differing_constants(state.blocks)
    if len(state.blocks) == 1 and not indexed and not graphs:
        return Plan(Form.ALONE)
    if constants is not None:
        return Plan(Form.PIECES if splits else Form.PER_BLOCK, constants)
    if not process.reusing and splits:
        return Plan(Form.PIECES, "this torch does not reuse a traced region")
    if not (process.reusing or graphs) and all(attribute for _, attribute in indexed):
        return Plan(Form.PER_BLOCK, "this torch does not reuse a traced region (torch 2.12 and later do)")
    return Plan(Form.WHOLE)
