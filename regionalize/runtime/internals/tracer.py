"""Dynamo as the runtime reads it: whether a frame is traced, its compiled entries and guards, its
errors, its settings and counters, and the marks it reads on tensors."""

import collections
import functools
import inspect
import threading
import traceback
import types

import torch

from . import probe

# pytree, through which regions flatten their arguments: the functions themselves, so that Dynamo traces
# the calls it traced before.
tree_leaves = torch.utils._pytree.tree_leaves


tree_map = torch.utils._pytree.tree_map


tree_map_only = torch.utils._pytree.tree_map_only


# The module whose frames raise what Dynamo raises while it compiles (its tracer's own errors among them).
dynamo_module = "torch._dynamo.convert_frame"


@probe("traced", "a compile in any thread is taken as this one's")
def tracing_context():
    """Probe: Dynamo's tracing context of this thread (`TracingContext.try_get`, None while no compile is
    under way in it). Fallback None: `traced` trusts `torch.compiler.is_compiling()` alone."""
    return torch._guards.TracingContext.try_get


@torch.compiler.assume_constant_result
def compiling_here():
    """Is a compile under way in this thread? Traced, Dynamo calls it as it traces, in the tracing thread,
    and takes its result as a constant."""
    context = tracing_context()
    return context is None or context() is not None


def traced():
    """Is Dynamo tracing the code that calls this, in this thread? From torch 2.13
    `torch.compiler.is_compiling()` reads one flag of the process's, set while any thread compiles: another
    thread's eager call would take itself for traced."""
    return torch.compiler.is_compiling() and compiling_here()


@probe("reuses", "regions are taken as not reused", False)
def reuses():
    """Probe: does Dynamo reuse a nested region traced for one block for the others ("stamping out", with
    its limit `max_reuse_entries`)? Without it (torch 2.11) the owner compiled whole traces every block, as
    a full compile does. A torch without nested regions reuses none (the owner compiles per block there)."""
    region = getattr(torch.compiler, "nested_compile_region", None)
    return region is not None and "max_reuse_entries" in inspect.signature(region).parameters


@probe("calls from several threads", "an owner's calls run one at a time", False)
def compiles_seen_in_every_thread():
    """Probe: does torch hold `is_compiling()` true in every thread for a whole compile (2.13 and later)?
    Before, AOTAutograd's trace set FX's tracing flag for the process, and another thread's call of a
    compiled frame meanwhile raised ("Detected that you are using FX to symbolically trace a
    dynamo-optimized function"), as two threads calling rewritten models at once did on 2.11 and 2.12.
    Where torch lacks the context (2.11, 2.12) the answer is False without the probe's warning: those
    torches are supported, and their owners' calls run one at a time (`threads.one_at_a_time`)."""
    return callable(getattr(torch.compiler, "_compile_session_context", None))


@functools.cache
def keep_device_guard():
    """Where CUDA is unavailable, Dynamo's trace (its `FakeTensorMode`) sets a no-op CUDA device guard the
    first time it runs. On torch 2.11 that guard is owned by the thread that traced first: once that thread
    ends, the next trace in any other thread crashes (a segfault in `FakeTensorMode.__enter__`), as a
    server's worker threads, each compiling a first call, did. Set here first, once a process, from a thread
    that lives as long as the process, kept waiting on an event never set. Too late where a thread that has
    ended traced before: the guard it set stays."""
    if torch.cuda.is_available():
        return
    ready = threading.Event()

    def keep():
        torch._C._ensureCUDADeviceGuardSet()
        ready.set()
        threading.Event().wait()

    threading.Thread(target=keep, name="regionalize-device-guard", daemon=True).start()
    ready.wait()


@probe("the guard bypass", "its calls keep their guards")
def cache_entries():
    """Probe: Dynamo's reader of a code object's compiled entries, each with its `guard_manager` and its
    `code` (the guard bypass calls the code whose guards passed). Fallback None: the bypass finds no entry
    and every call takes the guarded path."""
    from torch._C._dynamo.eval_frame import _CacheEntry, _debug_get_cache_entry_list
    from torch._dynamo.guards import GuardManagerWrapper

    for holder, name in (
        (_CacheEntry, "guard_manager"),
        (_CacheEntry, "code"),
        (GuardManagerWrapper, "check"),
    ):
        getattr(holder, name)
    return _debug_get_cache_entry_list


def guarded_code(code, frame):
    """The compiled code of the first entry of `code` (in the order Dynamo tries them) whose guards pass on
    the locals `frame`, else None."""
    entries = cache_entries()
    found = (e.code for e in (entries(code) if entries is not None else ()) if e.guard_manager.check(frame))
    return next(found, None)


@probe("symbolic_ints", "integer attributes stay specialized")
def config_patch():
    """Probe: Dynamo's `patch_dynamo_config`, which traces a function under other settings. Fallback None:
    integer attributes stay specialized, each block a graph of its own, still right."""
    return torch._dynamo.patch_dynamo_config


@probe(
    "the runtime's counts",
    "they are kept where verify does not read them",
    functools.partial(collections.defaultdict, collections.Counter),
)
def counters():
    """Probe: Dynamo's counters, which verify reads (CUDA-graph captures, replays and skips). Fallback: the
    runtime's own, counted the same and read by nobody."""
    counters = torch._dynamo.utils.counters
    if not isinstance(counters, dict):
        raise TypeError(f"Dynamo's counters are a {type(counters).__name__}, not a dict of counters")
    return counters


@probe("compiling", "compile errors are told by their traceback", ())
def dynamo_errors():
    """Probe: the types of what Dynamo raises as it compiles. Fallback (): an error is told by the frames
    it passed through alone (`compiling`)."""
    return (torch._dynamo.exc.TorchDynamoException, torch._dynamo.exc.FailOnRecompileLimitHit)


def compiling(error):
    """Was `error` raised while Dynamo compiled a frame (which then ran nothing), not by running code?"""
    if isinstance(error, dynamo_errors()):
        return True
    # Dynamo's own failures keep their type (an AssertionError of its tracer): they pass through it.
    frames = traceback.walk_tb(error.__traceback__)
    return any(frame.f_globals.get("__name__") == dynamo_module for frame, _ in frames)


@probe("backend_failed", "told by the error it wraps")
def backend_error():
    """Probe: the type Dynamo raises where the backend failed on a graph it traced (`BackendCompilerFailed`).
    Fallback None: such an error is told by the error it wraps (`inner_exception`)."""
    return torch._dynamo.exc.BackendCompilerFailed


def backend_failed(error):
    """Did the backend fail on the graph Dynamo traced (not the trace itself)?"""
    kind = backend_error()
    return (
        isinstance(error, kind) if kind is not None else getattr(error, "inner_exception", None) is not None
    )


def is_aliasing(error):
    """Did Dynamo refuse a nested region whose outputs alias each other or its inputs? Its graph break's
    type (`gb_type`, "Encountered aliasing during higher order op tracing"), or its text where it has none."""
    return isinstance(error, dynamo_errors()) and "aliasing" in (
        getattr(error, "gb_type", None) or str(error)
    )


def why_failed(error):
    """`error` in a line. A backend's failure names the error it wraps, which its first line leaves out
    ("backend='inductor' raised:")."""
    inner = getattr(error, "inner_exception", None)
    text = str(error).strip() if inner is None else f"{type(inner).__name__}: {str(inner).strip()}"
    return f"{type(error).__name__}: {(text or '?').splitlines()[0][:200]}"


@probe("kv_growing", "cache lengths are not marked dynamic")
def mark_dynamic_probe():
    """Probe: Dynamo's `maybe_mark_dynamic`. Fallback None: no hint, a cache's length is found dynamic when
    it changes (one compile more)."""
    return torch._dynamo.maybe_mark_dynamic


def mark_dynamic(tensor, dim):
    mark = mark_dynamic_probe()
    if mark is not None:
        mark(tensor, dim)


@probe("CUDA graphs of static caches", "no tensor is taken as marked static")
def static_attribute():
    """Probe: the attribute Dynamo's `mark_static_address` sets on a tensor (transformers marks a
    `StaticCache`'s tensors so). Fallback None: no tensor is taken as marked, so no static cache is served
    in a CUDA graph and such inputs are copied into a graph, not kept in place."""
    tensor = torch.empty(0)
    torch._dynamo.mark_static_address(tensor)
    if getattr(tensor, "_dynamo_static_input_type", None) is None:
        raise AttributeError("mark_static_address set no _dynamo_static_input_type")
    return "_dynamo_static_input_type"


def static_marked(tensor):
    """Is `tensor` at an address marked static (Dynamo's `mark_static_address`)?"""
    name = static_attribute()
    return name is not None and getattr(tensor, name, None) is not None


@functools.cache
def imports_inlined_modules():
    """Probe: does Dynamo import the module of a function it inlines by its `__name__` where the frame it
    compiles has other globals (torch 2.11 to 2.13; pytorch/pytorch#181243), and so fail on a module not
    registered under its name? Compiles a small function with the eager backend; asked only of a model
    that has such a module. Fallback True (taken while another compile traces, which this cannot start
    inside): the blocks are compiled one by one, which compiles on any torch."""
    if traced():
        return True
    module = types.ModuleType("regionalize_unregistered_probe")
    exec("import torch\n\ndef inner(x):\n    return torch.sin(x)\n", vars(module))

    def outer(x):
        return module.inner(x) + 1

    try:
        torch.compile(outer, backend="eager", fullgraph=True)(torch.ones(2))
    except Exception:
        return True
    return False
