"""What the runtime keeps: on an owner, its plan (the form it takes, and why), its set-up and what its calls
found; for the process, what its probes found once."""

import enum
import weakref

import torch


class _RegionalizeForm(enum.Enum):
    """The forms an owner takes; each value is the name verify and the warnings give it."""

    WHOLE = "whole"  # compiled whole, each block a nested region of it
    PIECES = "whole, in pieces"  # traced whole, blocks inline, its graph compiled a piece a distinct block
    PER_BLOCK = "per block"  # each block compiled on its own, the owner run eagerly
    ALONE = "alone"  # its one block compiled on its own: nothing to stamp out


class _RegionalizePlan:
    """The form an owner takes and why (None for the default, `WHOLE` where torch reuses regions). A fallback
    is a form taken because the one planned failed, of which a warning tells; the others are this torch's or
    these blocks' forms. Each step of the owner's retries is a new plan (`owner.py`)."""

    __slots__ = ("fallback", "form", "reason")

    def __init__(self, form, reason=None, fallback=False):
        self.form, self.reason, self.fallback = form, reason, fallback

    def __repr__(self):
        return f"{self.form.value}{'' if self.reason is None else f': {self.reason}'}"


class _RegionalizeOwner:
    """An owner's plan, set-up and what its calls found, in its `__dict__` as `_regionalize_owner`: read by
    the runtime's parts and by verify's accounting (`bench/accounting.py`), which names the forms from the
    plan. A plain class with typed slots: a dataclass reads its module from `sys.modules`, where an executed
    copy (`--vendor`'s inline form) may not be."""

    blocks: list[torch.nn.Module]  # its blocks, in the order they were set up
    compiled: int  # blocks compiled one by one so far
    direct: bool  # guard_bypass="depyf": its frame's calls dispatched without guards
    first: list  # [its first parameter's (dtype, device)] once known, which may be None
    growing: bool  # a call handed a cache that holds keys
    indexed: list  # (block, cache attribute) of the blocks traced in its frame until its first call
    inner: list  # (stage, its state, its entry) of the stages whose blocks it took (`outer.py`)
    kv: str | None  # why its blocks that update a cache are traced layer by layer in its frame
    kwargs: dict  # torch.compile's
    pieces: str | None  # in pieces: the pieces a call, and compiled in all
    plan: _RegionalizePlan  # the form it takes, and why
    prompt: bool  # calls served per block: a prompt's
    settled: bool  # set up by its first call
    skipped: bool  # CUDA graphs skipped, warned once
    static: bool  # calls served per block: a StaticCache's
    version: int | None  # `_regionalize_version` when it was last compiled

    __slots__ = tuple(__annotations__)

    def __init__(self, blocks, kwargs, direct):
        self.blocks, self.kwargs, self.direct = blocks, kwargs, direct
        self.indexed, self.first, self.inner = [], [], []
        self.plan = _RegionalizePlan(_RegionalizeForm.WHOLE)
        self.kv = self.pieces = self.version = None
        self.static = self.prompt = self.settled = self.growing = self.skipped = False
        self.compiled = 0


class _RegionalizeProcess:
    """What holds for the whole process, found once by the first owner's set-up (under the set-up lock,
    eagerly) and read by every owner and region after, while Dynamo traces them too: one record rather
    than a flag a module."""

    # Does torch reuse a traced region for another block (`_regionalize_reuses`)?
    reusing: bool
    # Do transformers' cache layers update as the cache-updating regions assume? False if not, else how a
    # layer is set up on its first update; None until checked (`_regionalize_kv_holds`).
    kv: object
    # The class of the stand-ins for an `EncoderDecoderCache`, made eagerly as `kv` is checked (Dynamo makes
    # no class while it traces); None where transformers' cache is not as they assume.
    encoder_decoder: type | None
    # A StaticCache's stand-ins: (the cache's class, its layer classes by name), False where they do not
    # leave it as transformers' own update does, None until checked (`_regionalize_static_checked`).
    static: object
    # Submodules replaced anywhere, counted once a block is set up (`_regionalize_registered`); None before.
    replaced: int | None
    # What the runtime compiled, kept for the process, weakly where keyed by a class or module:
    owner_frames: weakref.WeakKeyDictionary  # an owner class -> its parameter shapes -> its frame's function
    class_frames: weakref.WeakKeyDictionary  # a block class -> its frame, compiled on its own
    block_frames: weakref.WeakKeyDictionary  # a block compiled on its own, its cache stood in for -> frames
    structures: dict  # the classes of a block's modules -> the name its regions take for them
    frame_names: set  # every name a compiled frame took
    warned: weakref.WeakSet  # the block classes whose frames ran eagerly, warned once

    __slots__ = tuple(__annotations__)

    def __init__(self):
        self.reusing, self.kv, self.encoder_decoder, self.static, self.replaced = True, None, None, None, None
        self.owner_frames, self.class_frames = weakref.WeakKeyDictionary(), weakref.WeakKeyDictionary()
        self.block_frames, self.warned = weakref.WeakKeyDictionary(), weakref.WeakSet()
        self.structures, self.frame_names = {}, set()


_regionalize_process = _RegionalizeProcess()
