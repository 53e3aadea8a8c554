"""Reads Dynamo: whether a frame is traced, its compiled entries and guards, its errors, its settings and
counters, and the marks it reads on tensors."""

from __future__ import annotations

import collections
import functools
import inspect
import threading
import traceback
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch

if TYPE_CHECKING:  # imported where a probe finds them, so that a torch without them takes a fallback
    from torch._C._dynamo.eval_frame import _CacheEntry
    from torch._guards import TracingContext

from . import probe

# pytree's functions themselves, which regions flatten their arguments with, so that Dynamo traces the
# calls it already knows.
tree_leaves = torch.utils._pytree.tree_leaves


tree_map = torch.utils._pytree.tree_map


tree_map_only = torch.utils._pytree.tree_map_only


# The module whose frames raise what Dynamo raises while it compiles, its tracer's own errors included.
dynamo_module = "torch._dynamo.convert_frame"


@probe("is_tracing", "a compile in any thread is taken as this one's")
def tracing_context() -> Callable[[], TracingContext | None]:
    """Probe: returns Dynamo's reader of this thread's tracing context (`TracingContext.try_get`)."""
    return torch._guards.TracingContext.try_get


@torch.compiler.assume_constant_result  # type: ignore[untyped-decorator]  # torch's is untyped
def is_compiling_here() -> bool:
    """Returns whether a compile is under way in this thread; Dynamo takes the answer as a constant."""
    context = tracing_context()
    return context is None or context() is not None


def is_tracing() -> bool:
    """Returns whether Dynamo is tracing the calling code in this thread."""
    # From torch 2.13 `is_compiling()` is true in every thread while any thread compiles.
    return torch.compiler.is_compiling() and is_compiling_here()


@probe("has_region_reuse", "regions are taken as not reused", False)
def has_region_reuse() -> bool:
    """Probe: returns whether Dynamo reuses a nested region traced for one block for the other blocks."""
    # Without reuse (torch 2.11) an owner compiled whole traces every block, as a full compile does.
    region = getattr(torch.compiler, "nested_compile_region", None)
    return region is not None and "max_reuse_entries" in inspect.signature(region).parameters


@probe("calls from several threads", "an owner's calls run one at a time", False)
def compiles_seen_in_every_thread() -> bool:
    """Probe: returns whether torch holds `is_compiling()` true in every thread for a whole compile."""
    # Where it does not (torch 2.11 and 2.12), a call beside another thread's compile raises, so owners'
    # calls run one at a time (`threads.run_one_at_a_time`); False there is an answer, not a failed probe.
    return callable(getattr(torch.compiler, "_compile_session_context", None))


@functools.cache
def keep_device_guard() -> None:
    """Sets the no-op CUDA device guard once per process, from a thread that lives as long as the process.

    Without CUDA, Dynamo's first trace sets that guard, and on torch 2.11 a later trace crashes once the
    thread that set it has ended (docs/torch-workarounds.md). It comes too late where a thread that has
    already ended traced first."""
    if torch.cuda.is_available():
        return
    ready = threading.Event()

    def keep() -> None:
        torch._C._ensureCUDADeviceGuardSet()
        ready.set()
        threading.Event().wait()

    threading.Thread(target=keep, name="regionalize-device-guard", daemon=True).start()
    ready.wait()


@probe("the guard bypass", "its calls keep their guards")
def cache_entries() -> Callable[[types.CodeType], list[_CacheEntry]]:
    """Probe: returns Dynamo's reader of a code object's compiled entries, each with its guards and code.

    Fallback None: the guard bypass finds no entry, and every call takes the guarded path."""
    from torch._C._dynamo.eval_frame import _CacheEntry, _debug_get_cache_entry_list
    from torch._dynamo.guards import GuardManagerWrapper

    for holder, name in (
        (_CacheEntry, "guard_manager"),
        (_CacheEntry, "code"),
        (GuardManagerWrapper, "check"),
    ):
        getattr(holder, name)
    return _debug_get_cache_entry_list


def guarded_code(code: types.CodeType, frame: dict[str, Any]) -> types.CodeType | None:
    """Returns the compiled code of the first entry of `code` whose guards pass on the locals `frame`.

    Entries are tried in Dynamo's order, and None is returned where no guards pass."""
    entries = cache_entries()
    found = (e.code for e in (entries(code) if entries is not None else ()) if e.guard_manager.check(frame))
    return next(found, None)


@probe("symbolic_ints", "integer attributes stay specialized")
def config_patch() -> Callable[..., Any]:
    """Probe: returns Dynamo's `patch_dynamo_config`, which traces a function under other settings."""
    return torch._dynamo.patch_dynamo_config


@probe(
    "the runtime's counts",
    "they are kept where verify does not read them",
    functools.partial(collections.defaultdict[str, collections.Counter[str]], collections.Counter),
)
def counters() -> collections.defaultdict[str, collections.Counter[str]]:
    """Probe: returns Dynamo's counters, which verify reads for CUDA-graph captures, replays and skips.

    Fallback: the runtime's own counters, which count the same and which nothing reads."""
    counters = torch._dynamo.utils.counters
    if not isinstance(counters, dict):
        raise TypeError(f"Dynamo's counters are a {type(counters).__name__}, not a dict of counters")
    return counters


@probe("is_compile_error", "compile errors are told by their traceback", ())
def dynamo_errors() -> tuple[type[Exception], ...]:
    """Probe: returns the types of the errors that Dynamo raises as it compiles."""
    return (torch._dynamo.exc.TorchDynamoException, torch._dynamo.exc.FailOnRecompileLimitHit)


def is_compile_error(error: BaseException) -> bool:
    """Returns whether `error` was raised while Dynamo compiled a frame, which then ran nothing."""
    if isinstance(error, dynamo_errors()):
        return True
    # Dynamo's own failures keep their type (an AssertionError of its tracer) but pass through its frames.
    frames = traceback.walk_tb(error.__traceback__)
    return any(frame.f_globals.get("__name__") == dynamo_module for frame, _ in frames)


@probe("is_backend_failure", "told by the error it wraps")
def backend_error() -> type[Exception]:
    """Probe: returns the type that Dynamo raises where the backend fails (`BackendCompilerFailed`)."""
    return torch._dynamo.exc.BackendCompilerFailed


def is_backend_failure(error: BaseException) -> bool:
    """Returns whether the backend failed on the graph that Dynamo traced, rather than the trace itself."""
    kind = backend_error()
    return (
        isinstance(error, kind) if kind is not None else getattr(error, "inner_exception", None) is not None
    )


def is_aliasing(error: BaseException) -> bool:
    """Returns whether Dynamo refused a nested region whose outputs alias each other or its inputs.

    It reads the graph break's type (`gb_type`), or the error's text where there is no type."""
    return isinstance(error, dynamo_errors()) and "aliasing" in (
        getattr(error, "gb_type", None) or str(error)
    )


def why_failed(error: BaseException) -> str:
    """Returns `error` in one line, naming the wrapped error for a backend's failure.

    A backend's failure names its wrapped error only after its first line ("backend='inductor' raised:")."""
    inner = getattr(error, "inner_exception", None)
    text = str(error).strip() if inner is None else f"{type(inner).__name__}: {str(inner).strip()}"
    return f"{type(error).__name__}: {(text or '?').splitlines()[0][:200]}"


@probe("mark_kv_growing", "cache lengths are not marked dynamic")
def mark_dynamic_probe() -> Callable[[torch.Tensor, int], None]:
    """Probe: returns Dynamo's `maybe_mark_dynamic`, which marks a size as dynamic ahead of a change."""
    return cast(Callable[[torch.Tensor, int], None], torch._dynamo.maybe_mark_dynamic)  # untyped in torch


def mark_dynamic(tensor: torch.Tensor, dim: int) -> None:
    mark = mark_dynamic_probe()
    if mark is not None:
        mark(tensor, dim)


# What `maybe_mark_dynamic` sets on a tensor, and the marks it does not set.
_WEAK_MARK = ("_dynamo_weak_dynamic_indices", "_has_dynamo_dim_marking")
_OTHER_MARKS = (
    "_dynamo_dynamic_indices",
    "_dynamo_unbacked_indices",
    "_dynamo_strict_unbacked_indices",
    "_dynamo_static_indices",
)


def take_mark(tensor: torch.Tensor, dim: int) -> dict[str, Any] | None:
    """Takes off the mark that `mark_dynamic` set on `tensor`'s size `dim`, and returns it, or None.

    Only a tensor marked at that size alone and with no other kind of mark gives its mark up."""
    if getattr(tensor, _WEAK_MARK[0], None) != {dim} or any(hasattr(tensor, name) for name in _OTHER_MARKS):
        return None
    taken = {name: getattr(tensor, name) for name in _WEAK_MARK if hasattr(tensor, name)}
    for name in taken:
        delattr(tensor, name)
    return taken


def put_mark(tensor: torch.Tensor, taken: dict[str, Any]) -> None:
    """Puts back on `tensor` the mark that `take_mark` took off."""
    for name, value in taken.items():
        setattr(tensor, name, value)


@probe("CUDA graphs of static caches", "no tensor is taken as marked static")
def static_attribute() -> str:
    """Probe: returns the attribute that Dynamo's `mark_static_address` sets on a tensor.

    transformers marks a `StaticCache`'s tensors so. Fallback None: no tensor counts as marked, so no
    static cache is served in a CUDA graph."""
    tensor = torch.empty(0)
    torch._dynamo.mark_static_address(tensor)
    if getattr(tensor, "_dynamo_static_input_type", None) is None:
        raise AttributeError("mark_static_address set no _dynamo_static_input_type")
    return "_dynamo_static_input_type"


def is_static_marked(tensor: torch.Tensor) -> bool:
    """Returns whether `tensor` is at an address marked static (Dynamo's `mark_static_address`)."""
    name = static_attribute()
    return name is not None and getattr(tensor, name, None) is not None


@functools.cache
def has_inlined_module_imports() -> bool:
    """Probe: returns whether Dynamo imports an inlined function's module by name (pytorch/pytorch#181243).

    Such a torch fails on a module that is not registered under its name. The probe compiles a small
    function with the eager backend, and only for a model that has such a module. It answers True while
    another compile traces, so that the blocks are compiled one by one, which works on any torch."""
    if is_tracing():
        return True
    module = types.ModuleType("regionalize_unregistered_probe")
    exec("import torch\n\ndef inner(x):\n    return torch.sin(x)\n", vars(module))

    def outer(x: torch.Tensor) -> Any:
        return module.inner(x) + 1

    try:
        torch.compile(outer, backend="eager", fullgraph=True)(torch.ones(2))
    except Exception:
        return True
    return False
