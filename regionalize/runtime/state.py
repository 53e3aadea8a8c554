"""What the runtime keeps on an owner: its set-up and what its calls found."""

import torch


class _RegionalizeOwner:
    """An owner's set-up and what its calls found, in its `__dict__` as `_regionalize_owner`: read by the
    runtime's parts and by verify's accounting (`bench/accounting.py`), which names the forms from it. A
    plain class with typed slots: a dataclass reads its module from `sys.modules`, where an executed copy
    (`--vendor`'s inline form) may not be."""

    alone: bool  # one block, compiled on its own
    blocks: list[torch.nn.Module]  # its blocks, in the order they were set up
    compiled: int  # blocks compiled one by one so far
    constants: str | None  # where its blocks differ in float constants, which
    direct: bool  # guard_bypass="depyf": its frame's calls dispatched without guards
    first: list  # [its first parameter's (dtype, device)] once known, which may be None
    growing: bool  # a call handed a cache that holds keys
    indexed: list  # (block, cache attribute) of the blocks traced in its frame until its first call
    inner: list  # (stage, its state, its entry) of the stages whose blocks it took (`outer.py`)
    kv: str | None  # why its blocks that update a cache are traced layer by layer in its frame
    kwargs: dict  # torch.compile's
    pieces: str | None  # in pieces: the pieces a call, and compiled in all
    regions: str | None  # why it is in pieces where this torch reuses regions: its blocks failed as regions
    prompt: bool  # calls served per block: a prompt's
    settled: bool  # set up by its first call
    skipped: bool  # CUDA graphs skipped, warned once
    static: bool  # calls served per block: a StaticCache's
    tracing: bool | str  # "flat" where its graph is compiled in pieces (`_regionalize_pieces`)
    unreused: bool  # `why` is this torch's form (or its blocks' constants), not a fallback
    version: int | None  # `_regionalize_version` when it was last compiled
    why: str | None  # why its blocks are compiled one by one; None while it runs whole

    __slots__ = tuple(__annotations__)

    def __init__(self, blocks, kwargs, direct):
        self.blocks, self.kwargs, self.direct = blocks, kwargs, direct
        self.indexed, self.first, self.inner = [], [], []
        self.tracing = True
        self.why = self.constants = self.kv = self.pieces = self.regions = self.version = None
        self.alone = self.unreused = self.static = self.prompt = False
        self.settled = self.growing = self.skipped = False
        self.compiled = 0
