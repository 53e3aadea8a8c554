"""An owner of owners: a module whose container holds stages, each stage the owner of its blocks (Swin's
and ConvNeXt's stages), takes the stages' blocks and is compiled whole. A call is then one compiled frame
where there would be one a stage, and the code between the stages is compiled too: a call nearer a full
compile's time (docs/results/forward/call-profile.md).

It takes every stage offered or none: a stage it cannot take, or a failure to compile it whole, makes the
stages owners of their blocks again (`refuse`), as they were before it took them. Blocks of
its own stay its own."""

from .internals.hooks import set_compiled_call
from .state import Form


def takes(owner, inner, kwargs, direct):
    """May `owner`, set up with `kwargs` and `direct`, take the blocks of the stage whose state is `inner`?
    Not once the stage or the owner has run (their calls set them up), where the stage compiles its
    blocks one by one or with other options, nor where the owner has refused a stage."""
    if owner.__dict__.get("_regionalize_refused") or inner.settled or inner.plan.form is not Form.WHOLE:
        return False
    state = owner.__dict__.get("_regionalize_owner")
    if state is not None and (state.settled or state.kwargs != kwargs or state.direct != direct):
        return False
    return inner.kwargs == kwargs and inner.direct == direct


def take(owner, stage, state, register, kwargs):
    """Take `stage`'s state off it into `state`, the owner's, and set up each of its blocks as the owner's
    with `register` (`register_block`), as the stage had them: the stage runs inside the owner's
    frame."""
    inner = stage.__dict__.pop("_regionalize_owner")
    owner.__dict__["_regionalize_owner"] = state
    state.inner.append((stage, inner))
    set_compiled_call(stage, None)
    indexed = {id(held): attribute for held, attribute in inner.indexed}
    bypass = "depyf" if state.direct else None
    for held in inner.blocks:
        attribute = indexed.get(id(held))
        register(held, owner, id(held) not in indexed or attribute is not None, attribute, bypass, **kwargs)


def refuse(owner, entry):
    """`owner` takes no stage from now on, and those it took own their blocks again, their calls served by
    `entry(stage, None)` (`entry`, the set-up at their first call). Without blocks of its
    own it is a plain module again."""
    owner.__dict__["_regionalize_refused"] = True
    state = owner.__dict__.get("_regionalize_owner")
    if state is None or not state.inner:
        return
    taken = {id(block) for _, inner in state.inner for block in inner.blocks}
    for stage, inner in state.inner:
        stage.__dict__["_regionalize_owner"] = inner
        set_compiled_call(stage, entry(stage, None))
    state.inner = []
    state.blocks = [block for block in state.blocks if id(block) not in taken]
    state.indexed = [(block, attribute) for block, attribute in state.indexed if id(block) not in taken]
    if not state.blocks:
        del owner.__dict__["_regionalize_owner"]
        set_compiled_call(owner, None)


def holds_owners(module):
    """Does `module`, offered as a block, hold owners of blocks (a UNet's down block holding transformer
    models that own theirs)? Made a region, it would inline their blocks; it is left as it is."""
    return any("_regionalize_owner" in m.__dict__ for m in module.modules() if m is not module)


def mostly_stages(owner, state):
    """Do the stages it took and its own blocks hold nearly all of `owner`'s parameters (Swin's and
    ConvNeXt's encoders: all of them)? Where it holds work of its own besides (a diffusers UNet block's
    resnets, which a stage an owner leaves eager), compiling it whole compiles that too: a later first
    call, and no faster a call (docs/form-hierarchical.md)."""
    held = [stage for stage, _ in state.inner] + state.blocks
    covered = {id(p) for module in held for p in module.parameters()}
    total = list(owner.parameters())
    return sum(p.numel() for p in total if id(p) in covered) >= SHARE * sum(p.numel() for p in total)


SHARE = 0.9  # of the owner's parameters, below which the stages keep their blocks
