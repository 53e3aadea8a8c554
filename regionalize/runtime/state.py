"""What the runtime keeps on an owner: its set-up and what its calls found."""


class _RegionalizeOwner:
    """An owner's set-up and what its calls found, in its `__dict__` as `_regionalize_owner`: read by the
    runtime's parts and by verify's accounting (`bench/accounting.py`), which names the forms from it. A
    plain class: a dataclass reads its module from `sys.modules`, where an executed copy may not be."""

    __slots__ = (
        "alone",
        "blocks",
        "compiled",
        "constants",
        "direct",
        "first",
        "growing",
        "indexed",
        "kv",
        "kwargs",
        "pieces",
        "prompt",
        "settled",
        "skipped",
        "static",
        "tracing",
        "unreused",
        "version",
        "why",
    )

    def __init__(self, blocks, kwargs, direct):
        self.blocks = blocks  # its blocks, in the order they were set up
        self.kwargs = kwargs  # torch.compile's
        self.direct = direct  # guard_bypass="depyf": its frame's calls dispatched without guards
        self.indexed = []  # (block, cache attribute) of the blocks traced in its frame until its first call
        self.tracing = True  # "flat" where its graph is compiled in pieces (`_regionalize_pieces`)
        self.why = None  # why its blocks are compiled one by one; None while it runs whole
        self.unreused = False  # `why` is this torch's form (or its blocks' constants), not a fallback
        self.alone = False  # one block, compiled on its own
        self.constants = None  # where its blocks differ in float constants, which
        self.kv = None  # why its blocks that update a cache are traced layer by layer in its frame
        self.pieces = None  # in pieces: the pieces a call, and compiled in all
        self.static = self.prompt = False  # calls served per block: a StaticCache's, a prompt's
        self.settled = False  # set up by its first call
        self.growing = False  # a call handed a cache that holds keys
        self.skipped = False  # CUDA graphs skipped, warned once
        self.compiled = 0  # blocks compiled one by one so far
        self.version = None  # `_regionalize_version` when it was last compiled
        self.first = []  # [its first parameter's (dtype, device)] once known, which may be None
