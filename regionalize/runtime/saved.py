"""Saves an owner's compiled frame under torch's cache directory and loads it in a later process.

A later process's first call then runs the frame without tracing. The file's name keys what the guards do
not check; the traced code and what the guards read are checked on load, and an owner whose file cannot be
used compiles as without saving (docs/saved-owners.md)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import os
import platform
import sys
import warnings
from collections.abc import Callable
from types import FunctionType, SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import torch

from .cpu_keys import machine
from .files import distrust, write_whole
from .frames import caller_level
from .graphs import graph_modes
from .guard_paths import Scope
from .guard_reads import find_changed, find_unreadable, reads_of, records
from .internals.aot import (
    aot_compile,
    aot_load,
    changed_source,
    config_hash,
    install_modules,
    installed_modules,
    is_cache_disabled,
    is_gradient_load_supported,
    saving,
)
from .internals.tracer import is_tracing, tree_leaves
from .kv import dynamic_caches, held_layers, take_kv_marks
from .state import PieceCounts, SaveOutcome, Saving, not_saved
from .threads import run_locked
from .watch import Watch

if TYPE_CHECKING:
    from .state import Args, Kwargs, OwnerState

Frame = tuple[Any, "Watch | None"]  # a frame loaded or compiled ahead, and the watch on its dropped reads

FORMAT = 4  # the format of the key and the file; a new value names every file afresh
SUFFIX = ".owner"
MAGIC = b"regionalize saved owner\n"
SWITCH = "REGIONALIZE_SAVED_OWNERS"
# Why some forms are not saved and run on the first call's compile (docs/saved-owners.md).
GRAPH_MODES = "a CUDA-graph mode is not saved until a GPU check runs a loaded one"
BYPASS_DEPYF = "the guard bypass calls the code Dynamo keeps for the frame, which a loaded frame lacks"
BYPASS_FILTER = "the guard bypass drops guards on modules' structure, which a later process's may not share"


def wanted(asked: bool | None) -> bool:
    """Returns whether an owner is saved: `asked` where given, else what `REGIONALIZE_SAVED_OWNERS` says.

    The variable turns saving off with "0", "false", "no" or "off"."""
    if asked is not None:
        return bool(asked)
    return os.environ.get(SWITCH, "").strip().lower() not in ("0", "false", "no", "off")


def why_not(owner: torch.nn.Module, state: OwnerState) -> str | None:
    """Returns why `owner` is not saved, or None where it is.

    Only an owner whose frame Inductor compiles, whole or in pieces, from modules imported by name, is
    saved."""
    kwargs = state.config.kwargs
    if saving() is None:
        return "this torch cannot save a compiled frame"
    if (why := state.report.plan.form.why_not_saved()) is not None:
        return why
    if kwargs.get("mode") in graph_modes:
        return GRAPH_MODES
    if state.config.direct:
        return BYPASS_DEPYF
    if "guard_filter_fn" in kwargs.get("options", {}):
        return BYPASS_FILTER
    if kwargs.get("backend", "inductor") != "inductor":
        return "only Inductor's code is saved"
    if is_cache_disabled():
        return "Inductor's caches are off"
    classes = {type(owner), *(type(block) for block in state.blocks)}
    if any(not _module_file(cls) for cls in classes):
        return "its code is not in a module imported by name"
    return None


def _module_file(cls: type) -> str | None:
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None)
    return path if path and os.path.isfile(path) else None


def key(owner: torch.nn.Module, state: OwnerState, args: Args, kwargs: Kwargs, which: str = "first") -> str:
    """Returns the file's name: a hash of what the compiled code depends on that its guards do not check.

    It covers torch's build, Python, the machine, the runtime, the form and options, Inductor's settings,
    the classes with their modules' text, the owner's parameters, the call's inputs and which of the owner's
    tries it is (`Saved.untried`) (docs/saved-owners.md#never-stale-never-corrupt)."""
    digest = hashlib.sha256()

    def add(*parts: object) -> None:
        digest.update(repr(parts).encode())

    version = torch.version
    add(FORMAT, version.__version__, version.git_version, version.cuda, platform.python_version())
    add(machine())
    add(_runtime())
    options = sorted((k, _named(v)) for k, v in state.config.kwargs.items())
    add(state.report.plan.form.name, options, config_hash())
    for cls in sorted(
        {type(owner), *(type(b) for b in state.blocks)}, key=lambda c: (c.__module__, c.__qualname__)
    ):
        with open(cast(str, _module_file(cls)), "rb") as file:  # each has one (`why_not`)
            add(cls.__module__, cls.__qualname__, hashlib.sha256(file.read()).hexdigest())
        region = cls.__dict__.get("_regionalize_region")  # installed by this runtime or by another copy
        add(region is not None and type(region).__module__)
    add(
        [
            (name, tuple(p.shape), p.dtype, str(p.device), p.requires_grad)
            for name, p in owner.named_parameters()
        ]
    )
    add(sorted(kwargs), [_input(leaf) for leaf in tree_leaves((args, kwargs))], torch.is_grad_enabled())
    add(which)
    return digest.hexdigest()[:40]


@functools.cache
def _runtime() -> str:
    """Returns a hash of the runtime's package name and sources, which are traced into the frame.

    Another release, or a vendored copy beside the package, therefore keys files of its own."""
    digest = hashlib.sha256(__package__.encode())
    for folder, _, names in sorted(os.walk(os.path.dirname(__file__))):
        for name in sorted(n for n in names if n.endswith(".py")):
            with open(os.path.join(folder, name), "rb") as file:
                digest.update(file.read())
    return digest.hexdigest()


def _named(value: object) -> object:
    """Returns an option as the key holds it, naming a callable by its qualified name, not its address."""
    if isinstance(value, dict):
        return sorted((k, _named(v)) for k, v in value.items())
    if callable(value):
        return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', type(value).__name__)}"
    return repr(value)


def _input(leaf: object) -> object:
    if isinstance(leaf, torch.Tensor):
        return ("tensor", tuple(leaf.shape), leaf.dtype, str(leaf.device), leaf.requires_grad)
    if leaf is None or isinstance(leaf, (bool, int, float, str)):
        return leaf
    return type(leaf).__qualname__


def _why(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error)[:200]}"


class Saved:
    """Runs an owner's compiled frames, each loaded from a file or compiled ahead of its call and saved.

    The owner's form runs whole (`forms.Whole` or `forms.Pieces`). Two calls load or compile a frame: the
    first, and a decoder's first call that brings a `DynamicCache` holding keys, whose frame, its length
    marked, serves every later token. Each call runs the first frame whose guards and dropped reads
    (`watch`) hold. Other calls, calls that Dynamo traces, and every call once compiling ahead failed, run
    `jit`, the frame as `torch.compile` compiles it at its call."""

    __slots__ = ("frame", "frames", "jit", "options", "state", "tried")
    frames: list[Frame]  # the frames loaded or compiled ahead, the latest first
    tried: set[str]  # the calls that loaded or compiled a frame, or failed to: "first" and "keys"

    def __init__(
        self, jit: Callable[..., Any], frame: FunctionType, state: OwnerState, options: dict[str, Any]
    ) -> None:
        self.jit, self.frame, self.state, self.options = jit, frame, state, options
        self.frames, self.tried = [], set()

    def __call__(self, owner: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if is_tracing():
            return self.jit(owner, *args, **kwargs)
        served = self.serving(owner, args, kwargs)
        if served is None and self.untried(args, kwargs) is not None:
            run_locked(self.attempt, owner, args, kwargs)
            served = self.serving(owner, args, kwargs)
        return (served or self.jit)(owner, *args, **kwargs)

    def serving(self, owner: torch.nn.Module, args: Args, kwargs: Kwargs) -> Callable[..., Any] | None:
        """Returns the function of the first frame that serves this call, or None."""
        for aot, watch in self.frames:  # a loop, not a generator: this runs on every call
            if fits(aot, watch, owner, args, kwargs):
                return cast("Callable[..., Any]", aot.fn)
        return None

    def untried(self, args: Args, kwargs: Kwargs) -> str | None:
        """Returns which try this call would make, or None where it makes none."""
        if "first" not in self.tried:
            return "first"
        if "keys" not in self.tried and held_layers(dynamic_caches((*args, *kwargs.values()))):
            return "keys"
        return None

    def attempt(self, owner: torch.nn.Module, args: Args, kwargs: Kwargs) -> None:
        """Loads the call's frame, or compiles it ahead of the call and saves it, once for each try.

        After a failure, `jit` compiles the frame at its call, and the owner's retries handle its errors. The
        owner's report says what its first try did."""
        which = self.untried(args, kwargs)
        if which is None or self.serving(owner, args, kwargs) is not None:
            return  # another thread's call made the try while this one waited
        try:
            frame, outcome = self.ahead(owner, args, kwargs, which)
            if frame is not None:
                self.frames.insert(0, frame)
        finally:
            # Marked once the frame is in, so that other threads' calls wait for it on the lock instead
            # of compiling their own beside it.
            self.tried.add(which)
        if which == "first":
            self.state.report.saved = outcome

    def ahead(
        self, owner: torch.nn.Module, args: Args, kwargs: Kwargs, which: str
    ) -> tuple[Frame | None, SaveOutcome]:
        """Returns the frame, loaded or compiled ahead of this call and saved, or None where that fails, and
        what became of it."""
        path = os.path.join(folder(), key(owner, self.state, args, kwargs, which) + SUFFIX)
        unsafe = distrust(path)
        if unsafe is not None:
            _warn_untrusted(unsafe)
            return None, not_saved(unsafe)
        if os.path.exists(path):
            loaded = self.load(path, owner, args, kwargs)
            if loaded is not None:
                return loaded, SaveOutcome(Saving.LOADED)
        if not is_gradient_load_supported() and any(p.grad is not None for p in owner.parameters()):
            remove(path)  # a file that cannot load would warn at every start
            return None, not_saved("its parameters hold gradients, which this torch cannot load")
        try:
            compiled, guards = aot_compile(self.frame, self.options, (owner, *args), kwargs)
            reads = reads_of(guards)
            frame = compiled, Watch(reads, self.frame)
        except Exception as error:  # for instance, a dropped guard that cannot be checked on each call
            return None, not_saved(_why(error))
        try:
            unread = find_unreadable(reads, Scope(self.frame, owner, args, kwargs))
        except TypeError:  # the frame's signature does not bind the arguments, so no path can be read
            unread = "the call's arguments"
        if unread is not None:  # served as compiled, but not saved
            return frame, not_saved(f"a later process could not check what {unread} holds")
        kept: dict[str, Any] = {"reads": records(reads), "modules": installed_modules(self.frame.__globals__)}
        if (pieces := self.state.report.pieces) is not None:  # counted as the frame compiled in pieces
            kept["pieces"] = [pieces.per_call, pieces.compiled, pieces.traced]
        return frame, write(compiled, kept, path, type(owner).__name__, self.frame.__globals__)

    def load(self, path: str, owner: torch.nn.Module, args: Args, kwargs: Kwargs) -> Frame | None:
        """Returns the saved frame at `path`, or None with one warning where it cannot serve this call.

        That is where the file is unreadable, another build's, edited since, or its guards fail the call."""
        try:
            with open(path, "rb") as file:
                kept, frame = unpack(file.read())
            install_modules(kept["modules"], self.frame.__globals__)
            loaded = aot_load(io.BytesIO(frame), self.frame.__globals__)
            scope = Scope(self.frame, owner, args, kwargs)
            edited, reads = find_changed(kept["reads"], scope)
            edited = changed_source(loaded, sys.modules) or edited
            why = f"{edited} changed since it was saved" if edited else None
            watch = Watch(reads, self.frame)
            if why is None and not fits(loaded, watch, owner, args, kwargs):
                why = "its guards do not hold this call"
        except Exception as error:  # a truncated or corrupt file, or another torch's, never the model's
            why = _why(error)
        if why is None:
            if kept.get("pieces"):  # what the frame's compile counted, since a load compiles nothing
                self.state.report.pieces = PieceCounts(*kept["pieces"])
            return loaded, watch
        name = type(owner).__name__
        warnings.warn(
            f"regionalize: {name}'s saved compile not loaded ({why}); compiling it", stacklevel=caller_level()
        )
        return None


def fits(aot: Any, watch: Watch | None, owner: torch.nn.Module, args: Args, kwargs: Kwargs) -> bool:
    """Returns whether the frame `aot` serves this call: its guards and dropped reads (`watch`) hold.

    A call whose cache's lengths the runtime marked dynamic is checked again without the marks, which only
    a compile needs: a loaded frame's guards take none (`take_kv_marks`). They stay off where it fits."""
    if aot.guard_check(owner, *args, **kwargs):
        return not watch or watch.is_unchanged(owner, args, kwargs)
    put_back = take_kv_marks(args, kwargs)
    if put_back is None:
        return False
    if aot.guard_check(owner, *args, **kwargs) and (not watch or watch.is_unchanged(owner, args, kwargs)):
        return True
    put_back()
    return False


_untrusted_warned: set[str] = set()


def _warn_untrusted(why: str) -> None:
    """Warns once per process for each unsafe place, under which every owner compiles without loading."""
    if why not in _untrusted_warned:
        _untrusted_warned.add(why)
        warnings.warn(
            f"regionalize: saved compiles not loaded or saved ({why}: whoever can write there could run code "
            "in this process); compiling as without saving",
            stacklevel=caller_level(),
        )


def folder() -> str:
    """Returns the owners' folder under torch's cache directory, beside the compiled code they need."""
    return os.path.join(cast(SimpleNamespace, saving()).cache_dir(), "regionalize", "owners")


def remove(path: str) -> None:
    """Removes the saved frame at `path`, where it exists and can be removed."""
    with contextlib.suppress(OSError):
        os.unlink(path)


def pack(kept: dict[str, Any], frame: bytes) -> bytes:
    """Returns one file of the records (`kept`) and the frame, so that two processes' files cannot mix."""
    # A line naming the format, the records' length, the records with the frame's hash, then the frame.
    head = json.dumps({**kept, "format": FORMAT, "frame": hashlib.sha256(frame).hexdigest()}).encode()
    return MAGIC + b"%d\n" % len(head) + head + frame


def unpack(blob: bytes) -> tuple[dict[str, Any], bytes]:
    """Returns the records and the frame of a file that `pack` wrote, and raises ValueError for any other."""
    if not blob.startswith(MAGIC):
        raise ValueError("not a saved owner's file")
    length, _, rest = blob[len(MAGIC) :].partition(b"\n")
    if not length.isdigit():
        raise ValueError("no records' length")
    kept, frame = json.loads(rest[: int(length)]), rest[int(length) :]
    if (
        not isinstance(kept, dict)
        or kept.get("format") != FORMAT
        or not isinstance(kept.get("modules"), dict)
    ):
        raise ValueError("records of another format")
    if kept.get("frame") != hashlib.sha256(frame).hexdigest():
        raise ValueError("the frame is not the one its records were written with")
    return kept, frame


def write(
    compiled: Any, kept: dict[str, Any], path: str, name: str, f_globals: dict[str, Any]
) -> SaveOutcome:
    """Saves `compiled` and its records (`kept`) at `path` as one file, whole or not at all.

    The frame is loaded back before it is kept, because torch saves some guard states that its own load
    cannot build (a dict's key order guarded through a value that it pruned). It returns the outcome, with
    one warning where the file could not be written."""

    def fill(temp: str) -> None:
        compiled.save_compiled_function(temp)
        with open(temp, "rb") as file:
            frame = file.read()
        try:
            aot_load(io.BytesIO(frame), f_globals)
        except Exception as error:
            raise _Unloadable(_why(error)) from error
        with open(temp, "wb") as file:
            file.write(pack(kept, frame))

    try:
        write_whole(path, fill)
        return SaveOutcome(Saving.SAVED)
    except _Unloadable as error:
        remove(path)
        return not_saved(f"torch's load of it fails ({error})")
    except Exception as error:
        why = _why(error)
        warnings.warn(f"regionalize: {name}'s compile not saved ({why})", stacklevel=caller_level())
        return not_saved(why)


class _Unloadable(Exception):
    """Signals a saved frame that torch's load does not take back."""
