"""Holds what the runtime keeps for each owner (its plan, set-up and findings) and for the process."""

import enum
import weakref
from dataclasses import dataclass, field

import torch


class Form(enum.Enum):
    """Lists the forms an owner takes; each value is the name that verify and the warnings use."""

    WHOLE = "whole"  # compiled whole, each block a nested region of it
    PIECES = "whole, in pieces"  # traced whole, blocks inline, one compiled piece per distinct block
    PER_BLOCK = "per block"  # each block compiled on its own, the owner run eagerly
    ALONE = "alone"  # its one block compiled on its own, since there is nothing to stamp out


@dataclass(slots=True, eq=False)
class Plan:
    """Holds the form an owner takes and why; the reason is None for the default form.

    A fallback is a form taken because the planned one failed, with a warning. Each retry makes a new plan,
    and plans are told apart by identity."""

    form: Form
    reason: str | None = None
    fallback: bool = False

    def __repr__(self):
        return f"{self.form.value}{'' if self.reason is None else f': {self.reason}'}"


@dataclass(slots=True, eq=False, repr=False)
class OwnerState:
    """Holds an owner's plan, set-up and findings, kept in its `__dict__` as `_regionalize_owner`.

    verify's accounting (`bench/accounting.py`) reads it too, to name the forms."""

    blocks: list[torch.nn.Module]  # its blocks, in the order they were set up
    kwargs: dict  # the options for torch.compile
    direct: bool  # guard_bypass="depyf", which calls the frame's compiled code without guards
    save: bool = False  # its compiled frame saved for a later process (`saved.py`)
    compiled: int = 0  # blocks compiled one by one so far
    # Its first parameter's (dtype, device), or () where it has none; None until known.
    first: tuple | None = None
    growing: bool = False  # a call handed a cache that holds keys
    # (block, cache attribute) for each block traced in its frame until its first call
    indexed: list = field(default_factory=list)
    # (stage, its state) for each stage whose blocks it took (`outer.py`)
    inner: list = field(default_factory=list)
    kv: str | None = None  # why its blocks that update a cache are traced layer by layer in its frame
    pieces: str | None = None  # in pieces: the pieces per call, and the pieces compiled in all
    plan: Plan = field(default_factory=lambda: Plan(Form.WHOLE))  # the form it takes, and why
    prompt: bool = False  # a prompt's call was served per block
    saved: str | None = None  # with `save`: "loaded", "saved", or why not (`saved.py`); None until known
    settled: bool = False  # set up by its first call
    skipped: bool = False  # CUDA graphs skipped, warned once
    static: bool = False  # a call with a StaticCache was served per block
    version: int | None = None  # `process.replaced` when it was last compiled


@dataclass(slots=True, eq=False, repr=False)
class Process:
    """Holds what the first owner's set-up finds once for the whole process, for every owner to read.

    Owners and regions read it while Dynamo traces them too, so it is one record rather than module flags."""

    # Does torch reuse a traced region for another block (`reuses`)?
    reusing: bool = True
    # Do transformers' cache layers update as the cache-updating regions assume? False if not, else how a
    # layer is set up on its first update; None until checked (`kv_holds`).
    kv: object = None
    # The class of the stand-ins for an `EncoderDecoderCache`, made eagerly as `kv` is checked (Dynamo makes
    # no class while it traces); None where transformers' cache is not as they assume.
    encoder_decoder: type | None = None
    # A StaticCache's stand-ins: (the cache's class, its layer classes by name), False where they do not
    # leave it as transformers' own update does, None until checked (`static_checked`).
    static: object = None
    # Submodules replaced anywhere, counted once a block is set up (`registered`); None before.
    replaced: int | None = None
    # What the runtime compiled, kept for the process, weakly where keyed by a class or module:
    # An owner class -> its parameter shapes -> its frame's function.
    owner_frames: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)
    # A block class -> its frame, compiled on its own.
    class_frames: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)
    # A block compiled on its own, its cache stood in for -> its frames.
    block_frames: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)
    structures: dict = field(default_factory=dict)  # a block's modules' classes -> its regions' name for them
    frame_names: set = field(default_factory=set)  # every name a compiled frame took
    warned: weakref.WeakSet = field(default_factory=weakref.WeakSet)  # block classes run eagerly, warned once


process = Process()
