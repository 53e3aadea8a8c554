"""Compiles an owner's frame ahead of a call with torch's `aot_compile`, and loads it (`saved.py`)."""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import re
import types
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING, Any, BinaryIO, cast

import torch

from . import probe

if TYPE_CHECKING:  # imported where a probe finds them, so that a torch without them takes a fallback
    from torch._dynamo.types import GuardFilterEntry as GuardFilterEntry

GuardRead = tuple[str, str, Any, bool]  # what a guard reads, its source, the value it saw, and if dropped


@probe("saved owners", "owners are compiled at each start, as without saving")
def saving() -> types.SimpleNamespace | None:
    """Probe: returns what saving an owner's frame needs of torch, or None where torch cannot save one.

    That is `aot_compile` turned on, the load, the hash of a traced code's lines, and the cache directory.
    Fallback None: nothing is saved."""
    if not getattr(torch._dynamo.config, "enable_aot_compile", True):
        return None
    from torch._dynamo.package import _hash_sourcelines
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return types.SimpleNamespace(
        load=torch.compiler.load_compiled_function, hash_lines=_hash_sourcelines, cache_dir=cache_dir
    )


@probe("saving an owner compiled in pieces", "such an owner compiles at each start, as without saving")
def piece_saving() -> types.SimpleNamespace | None:
    """Probe: returns what saving a frame compiled in pieces needs of torch, or None where it cannot save one.

    That is the interface that `aot_compile` asks of what a backend returns, and the saved form of a piece
    that Inductor compiled. Fallback None: such an owner is not saved."""
    if saving() is None:
        return None
    # Read where `aot_compile` itself finds them, whichever module of torch defines them.
    from torch._dynamo import aot_compile as compiling
    from torch.fx.graph_module import _forward_from_src

    interface = getattr(compiling, "SerializableCallable")  # noqa: B009  # not re-exported for mypy
    bundled = getattr(compiling, "BundledAOTAutogradSerializableCallable")  # noqa: B009
    return types.SimpleNamespace(
        interface=interface,
        save=lambda piece: bundled.serialize_compile_artifacts(bundled(piece)),
        load=bundled.deserialize_compile_artifacts,
        # A graph module as its pickle holds it (its state and code), and its `forward` rebuilt from that.
        code_of=lambda module: list(module.__reduce__()[1]),
        forward_of=lambda body, imports: _forward_from_src(imports + body["_code"], {}),
    )


def _saved() -> types.SimpleNamespace:
    """Returns what `saving` found, for a caller that runs only where torch can save."""
    return cast(types.SimpleNamespace, saving())


@probe("a saved frame of parameters holding gradients", "such an owner is not saved", fallback=False)
def is_gradient_load_supported() -> bool:
    """Probe: returns whether torch can load a saved frame whose parameters held gradients at the save.

    Some torch versions fail to assign the pickled gradient back, so every restart would warn and compile
    again (docs/torch-workarounds.md). Fallback False: such owners are not saved."""
    from torch._dynamo.guards import GuardsStatePickler, _Missing

    real = torch.empty(1)
    keys = torch._C._dispatch_keys(real).raw_repr()
    missing: Any = _Missing("grad")  # a gradient missing from the pickle, as torch passes it: no tensor
    try:
        GuardsStatePickler._unpickle_tensor(
            torch.empty(1, device="meta"), real.device, torch.Tensor, keys, missing
        )
    except TypeError as error:
        if "grad" not in str(error):
            raise
        return False
    return True


def aot_compile(
    frame: Callable[..., Any], compile_kwargs: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, list[GuardRead]]:
    """Compiles `frame` ahead of a call with `args` and `kwargs`, running nothing, and returns it.

    It also returns what the frame's guards read that a load would not check (`savable`)."""
    unsaved = torch._dynamo.guards.CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES
    reads: list[GuardRead] = []
    keep = functools.partial(savable, unsaved, reads)
    options = {**compile_kwargs.get("options", {}), "guard_filter_fn": keep}
    compiled = torch.compile(frame, **{**compile_kwargs, "options": options}, fullgraph=True)
    with as_dynamo_compiles():
        return compiled.aot_compile((args, kwargs)), reads  # type: ignore[attr-defined]  # not in torch's stubs


@contextlib.contextmanager
def as_dynamo_compiles() -> Iterator[None]:
    """Holds Dynamo's compile lock and marks a compile session, as Dynamo does around its own compiles.

    `aot_compile` and a load take neither (docs/torch-workarounds.md, "compiling ahead beside")."""
    lock, session = compile_session()
    with lock, session():
        yield


@probe(
    "compiling ahead beside other threads",
    "a thread's call beside a compile ahead may fail",
    lambda: (contextlib.nullcontext(), contextlib.nullcontext),
)
def compile_session() -> tuple[contextlib.AbstractContextManager[Any], Callable[[], Any]]:
    """Probe: returns Dynamo's compile lock and its compile session's context. Fallback: no-ops."""
    from torch._dynamo.convert_frame import compile_lock

    return compile_lock, getattr(torch.compiler, "_compile_session_context", contextlib.nullcontext)


def savable(unsaved: Collection[str], reads: list[GuardRead], guards: list[GuardFilterEntry]) -> list[bool]:
    """Returns which of `guards` a saved frame keeps: every kind that torch can save.

    Guards on the globals that Dynamo makes itself are dropped, since a new process lacks them. What the
    dropped guards and the guards on globals read goes into `reads` for `guard_reads.py`."""

    def dropped(guard: GuardFilterEntry) -> bool:
        kinds = (guard.guard_type, *guard.derived_guard_types)
        return any(kind in unsaved for kind in kinds) or guard.name.startswith("G['__builtins_dict")

    kept = [not dropped(guard) for guard in guards]
    for guard, keep in zip(guards, kept, strict=True):
        what = _READS.get(guard.guard_type, "value")
        if guard.has_value and what and (guard.is_global or not keep):
            reads.append((what, guard.name, guard.value, not keep))
    return kept


# What each kind of guard reads of its value (`guard_reads.record_of`). None marks kinds whose saved
# arguments say what they check, or that relate inputs to each other; kinds not named read the whole value.
_READS = {
    "CONSTANT_MATCH": "value",
    "EQUALS_MATCH": "value",
    "SEQUENCE_LENGTH": "len",
    "LENGTH_CHECK": "len",
    "TYPE_MATCH": "type",
    "DICT_KEYS_MATCH": "keys",
    **dict.fromkeys(
        (
            "ID_MATCH",
            "CLOSURE_MATCH",
            "FUNCTION_MATCH",
            "BUILTIN_MATCH",
            "CLASS_MATCH",
            "MODULE_MATCH",
            "NN_MODULE",
            "WEAKREF_ALIVE",
        ),
        "is",
    ),
    **dict.fromkeys(
        (
            "DICT_CONTAINS",
            "DICT_NOT_CONTAINS",
            "HASATTR",
            "NOT_PRESENT_IN_GENERIC_DICT",
            "DUPLICATE_INPUT",
            "NO_TENSOR_ALIASING",
            "OBJECT_ALIASING",
        )
    ),
}


def aot_load(file: BinaryIO, f_globals: dict[str, Any]) -> Any:
    """Loads the compiled function saved in `file`, its code run in `f_globals`."""
    # Inside a tracing context, because torch 2.13 asks for one as it rebuilds a guard on an imported module.
    # With the garbage collector paused, because unpickling the guards' state for every parameter would
    # otherwise set off collections that grow with depth (docs/design-saved-owners.md#single-tries-untimed).
    with as_dynamo_compiles(), torch._guards.tracing(torch._guards.TracingContext(None)), _collector_paused():
        return _saved().load(file, f_globals=f_globals)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def changed_source(loaded: Any, modules: dict[str, types.ModuleType]) -> str | None:
    """Returns the first code that `loaded` traced whose lines differ now, as "module:line", or None.

    Its guards cannot see such an edit. A module missing from `modules` counts as changed."""
    for source in loaded.source_info().inlined_sources:
        module = modules.get(source.module)
        if module is None or _saved().hash_lines(module, source.firstlineno, source.lastlineno) != (
            source.checksum
        ):
            return f"{source.module}:{source.firstlineno}"
    return None


def is_cache_disabled() -> bool:
    """Returns whether Inductor's caches are off, in which case `aot_compile` refuses to compile."""
    return torch._inductor.config.force_disable_caches


def config_hash() -> str:
    """Returns a hash of Inductor's configuration, since a patched option compiles other code."""
    import hashlib

    return hashlib.sha256(repr(sorted(torch._inductor.config.get_config_copy().items())).encode()).hexdigest()


# The globals that Dynamo installs for what its code loads (`install_global_by_id`), named by the object's
# id in the compiling process and the compile's number (`___module_collections_140473201368960_c0`). A
# saved frame's code and guards use these names, which a later process lacks.
_INSTALLED = re.compile(r"\w*_\d+_c\d+")


def is_installed_global(name: str) -> bool:
    """Returns whether `name` is a global that Dynamo installed under an id of its process."""
    return _INSTALLED.fullmatch(name) is not None


def installed_modules(f_globals: dict[str, Any]) -> dict[str, str]:
    """Returns the modules that Dynamo installed in `f_globals`, by the names it gave them.

    A later process gets them back by name (`install_modules`)."""
    return {
        name: value.__name__
        for name, value in list(f_globals.items())
        if isinstance(value, types.ModuleType) and is_installed_global(name)
    }


def install_modules(modules: dict[str, str], f_globals: dict[str, Any]) -> None:
    """Puts back in `f_globals` the modules that a saved frame loads by Dynamo's names, importing them.

    `modules` is what `installed_modules` found in the process that saved the frame."""
    for name, module in modules.items():
        if is_installed_global(name):
            f_globals.setdefault(name, importlib.import_module(module))
