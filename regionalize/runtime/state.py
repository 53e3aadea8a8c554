"""Holds what the runtime keeps for each owner (its plan, set-up and findings) and for the process."""

from __future__ import annotations

import enum
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from types import FunctionType

    from .forms import OwnerForm
    from .kv import Init
    from .saved_blocks import BlockFrames
    from .static import StandIns

Args = tuple[Any, ...]  # a call's positional arguments
Kwargs = dict[str, Any]  # a call's keyword arguments


@dataclass(slots=True, eq=False)
class Plan:
    """Holds the form an owner takes and why; the reason is None for the default form.

    A fallback is a form taken because the planned one failed, with a warning. Each retry makes a new plan,
    and plans are told apart by identity."""

    form: OwnerForm
    reason: str | None = None
    fallback: bool = False

    def __repr__(self) -> str:
        return f"{self.form.name}{'' if self.reason is None else f': {self.reason}'}"


@dataclass(frozen=True, slots=True)
class Config:
    """Holds how an owner was asked to compile, fixed when its first block registers."""

    kwargs: dict[str, Any]  # the options for torch.compile
    direct: bool  # guard_bypass="depyf", which calls the frame's compiled code without guards
    save: bool  # its compiled frame saved for a later process (`saved.py`)


class Saving(enum.Enum):
    """Names what became of an owner's saved frame."""

    LOADED = "loaded"
    SAVED = "saved"
    NOT_SAVED = "not saved"


@dataclass(frozen=True, slots=True)
class SaveOutcome:
    """Holds what became of an owner's saved frame, and why it was not saved."""

    outcome: Saving
    why: str | None = None

    def __str__(self) -> str:
        return self.outcome.value if self.why is None else f"{self.outcome.value}: {self.why}"


def not_saved(why: str) -> SaveOutcome:
    """Returns the outcome of a frame that is not saved, for the reason `why`."""
    return SaveOutcome(Saving.NOT_SAVED, why)


@dataclass(frozen=True, slots=True)
class PieceCounts:
    """Counts an owner's pieces: those a call runs, those compiled in all, those run as traced."""

    per_call: int
    compiled: int
    traced: int

    def __str__(self) -> str:
        traced = f", {self.traced} run as traced" if self.traced else ""
        return f"{self.per_call} a call, {self.compiled} compiled in all{traced}"


@dataclass(slots=True, eq=False)
class Findings:
    """Holds what an owner's calls found: its form and why, and what `describe` reports."""

    plan: Plan
    layer_by_layer: str | None = None  # why its blocks that update a cache are traced layer by layer
    pieces: PieceCounts | None = None  # in pieces
    static_calls: bool = False  # a call with a StaticCache was served per block
    prompt_calls: bool = False  # a prompt's call was served per block
    grad_calls: bool = False  # a call with autograd was served per block
    saved: SaveOutcome | None = None  # with `Config.save`; None until known


@dataclass(slots=True, eq=False, repr=False)
class OwnerState:
    """Holds an owner's configuration, set-up and findings, kept in its `__dict__` as `_regionalize_owner`."""

    config: Config
    report: Findings
    blocks: list[torch.nn.Module] = field(default_factory=list)  # its blocks, in the order they were set up
    # (block, cache attribute) for each block traced in its frame until its first call
    indexed: list[tuple[torch.nn.Module, str | None]] = field(default_factory=list)
    # (stage, its state) for each stage whose blocks it took (`outer.py`)
    inner: list[tuple[torch.nn.Module, OwnerState]] = field(default_factory=list)
    compiled: int = 0  # blocks compiled one by one so far
    # Its first parameter's (dtype, device), or () where it has none; None until known.
    first: tuple[torch.dtype, torch.device] | tuple[()] | None = None
    growing: bool = False  # a call handed a cache that holds keys
    settled: bool = False  # set up by its first call
    skipped: bool = False  # CUDA graphs skipped, warned once
    version: int | None = None  # `process.replaced` when it was last compiled


@dataclass(slots=True, eq=False, repr=False)
class Process:
    """Holds what the first owner's set-up finds once for the whole process, for every owner to read.

    Owners and regions read it while Dynamo traces them too, so it is one record rather than module flags."""

    # Does torch reuse a traced region for another block (`has_region_reuse`)?
    reusing: bool = True
    # Whether transformers' caches were checked against the stand-ins, by the first owner that needs them.
    caches_checked: bool = False
    # How a cache layer is set up on its first update, where transformers' cache layers update as the
    # cache-updating regions assume (`check_kv`); None where they do not, or until checked.
    kv_init: Init | None = None
    # The class of the stand-ins for an `EncoderDecoderCache`, made eagerly as `kv_init` is checked (Dynamo
    # makes no class while it traces); None where transformers' cache is not as they assume.
    encoder_decoder: type | None = None
    # A StaticCache's stand-ins, where they leave it as transformers' own update does (`check_static`);
    # None where they do not, or until checked.
    static_stand_ins: StandIns | None = None
    # Submodules replaced anywhere, counted by a global hook from the first block's set-up (`registered`).
    replaced: int = 0
    counting: bool = False  # the hook that counts replaced submodules is registered
    # What the runtime compiled, kept for the process, weakly where keyed by a class or module:
    # An owner class -> its parameter shapes -> its frame's function.
    owner_frames: weakref.WeakKeyDictionary[type, dict[tuple[Any, ...], FunctionType]] = field(
        default_factory=weakref.WeakKeyDictionary
    )
    # A block class -> its frame, compiled on its own.
    class_frames: weakref.WeakKeyDictionary[type, FunctionType] = field(
        default_factory=weakref.WeakKeyDictionary
    )
    # A block class -> (its frame's code, parameter shapes, options) -> the saved frames of its calls with
    # autograd, or None where they are not saved.
    block_saves: weakref.WeakKeyDictionary[type, dict[tuple[Any, ...], BlockFrames | None]] = field(
        default_factory=weakref.WeakKeyDictionary
    )
    # A block compiled on its own, its cache stood in for -> its frames.
    block_frames: weakref.WeakKeyDictionary[torch.nn.Module, tuple[Any, ...]] = field(
        default_factory=weakref.WeakKeyDictionary
    )
    # A block's modules' classes -> its regions' name for them
    structures: dict[tuple[type, ...], str] = field(default_factory=dict)
    frame_names: set[str] = field(default_factory=set)  # every name a compiled frame took
    # Block classes run eagerly, warned once.
    warned: weakref.WeakSet[type] = field(default_factory=weakref.WeakSet)


process = Process()
