"""Every private name of torch that the runtime reaches, in one place, so that a torch that moves one breaks
one module. What a capability needs is probed, never read from torch's version: each probe runs once, and
where it fails takes a fallback that keeps the model's results, with one warning."""

import collections
import contextlib
import functools
import importlib
import importlib.util
import inspect
import threading
import traceback
import types
import warnings

import torch

# pytree, through which regions flatten their arguments: the functions themselves, so that Dynamo traces
# the calls it traced before.
tree_leaves = torch.utils._pytree.tree_leaves
tree_map = torch.utils._pytree.tree_map
tree_map_only = torch.utils._pytree.tree_map_only
# The module whose frames raise what Dynamo raises while it compiles (its tracer's own errors among them).
dynamo_module = "torch._dynamo.convert_frame"


def probe(needs, instead, fallback=None):
    """A probe of torch: the decorated function's answer, found once (cached: a test clears it). Where this
    torch lacks what it reads (it raises an ImportError, AttributeError, TypeError or ValueError), one
    warning names what `needs` it and what is done `instead`, and the probe answers `fallback` (called
    where it is a function: a fresh object)."""

    def decorate(find):
        @functools.cache
        @functools.wraps(find)
        def probed():
            try:
                return find()
            except (ImportError, AttributeError, TypeError, ValueError) as error:
                kind = type(error).__name__
                message = f"this torch lacks what {needs} needs ({kind}: {error}); {instead}"
                warnings.warn(f"regionalize: {message}", stacklevel=2)
                return fallback() if callable(fallback) else fallback

        return probed

    return decorate


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


@probe("the checks for global hooks", "every call is taken as hooked")
def hook_dicts():
    """Probe: nn.Module's global forward and backward hooks (each a dict). Fallback None: every call is
    taken as hooked, so none is served in a CUDA graph or called past its guards."""
    module = torch.nn.modules.module
    names = ("forward_hooks", "forward_pre_hooks", "backward_hooks", "backward_pre_hooks")
    found = tuple(getattr(module, f"_global_{name}") for name in names)
    if not all(isinstance(hooks, dict) for hooks in found):
        raise TypeError("nn.Module's global hooks are not dicts")
    return found


def global_hooks(backward=True):
    """Does any global module hook apply to a call: forward ones, and backward ones unless `backward` is
    False?"""
    hooks = hook_dicts()
    return hooks is None or any(hooks[: 4 if backward else 2])


def module_hooks(module, backward=True):
    """The hook dicts of `module` itself: forward ones, and backward ones unless `backward` is False."""
    hooks = (module._forward_hooks, module._forward_pre_hooks)
    return (*hooks, module._backward_hooks, module._backward_pre_hooks) if backward else hooks


def compiled_call(module):
    """What `module.compile()` set the module's calls to run (torch's `_compiled_call_impl`), or None."""
    return module._compiled_call_impl


def set_compiled_call(module, call):
    """Make `module`'s calls run `call`, as `module.compile()` does; None undoes it."""
    module._compiled_call_impl = call


def base(tensor):
    """The tensor whose memory `tensor` views (`_base`), else `tensor`: Dynamo knows it as it traces."""
    return tensor if tensor._base is None else tensor._base


def writes(tensor):
    """How many times `tensor`'s memory was written in place (its version counter)."""
    return tensor._version


def module_frame(self, *args, **kwargs):
    """The body of a module's compiled frame: its call, hooks and all, as `module.compile()` compiles. It
    reads no global: its copies take the globals of the model's code (`frames.py`)."""
    return self._call_impl(*args, **kwargs)


def submodules(module):
    """`module`'s submodules by name (`_modules`); reads no global (`registered`)."""
    return module._modules


def module_call(module):
    """`module`'s call as torch runs it uncompiled, hooks and all (`_call_impl`)."""
    return module._call_impl


@probe("compiling in pieces", "blocks are compiled one by one instead")
def inductor_pieces():
    """Probe: what compiling an owner's graph in pieces needs of torch's compiler (`pieces_backend`):
    Inductor's `compile_fx`, fake tensors, a dispatch mode, the split, storages compared and symbols named.
    Fallback None: where torch reuses no region, the owner's blocks are compiled one by one, as with a
    backend other than Inductor."""
    from torch._guards import TracingContext, detect_fake_mode
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx
    from torch._subclasses import FakeTensor
    from torch.fx.passes.split_module import split_module
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._sympy.symbol import SymT, make_symbol

    size = SymT.SIZE
    return types.SimpleNamespace(
        compile_fx=compile_fx,
        fake_tensor=FakeTensor,
        dispatch_mode=TorchDispatchMode,
        split_module=split_module,
        storage=StorageWeakRef,
        mode_options=list_mode_options,
        fake_mode=lambda inputs: detect_fake_mode(inputs) or TracingContext.get().fake_mode,
        size_symbol=lambda index: make_symbol(size, index),
    )


# The modules Inductor's CPU check imports as it runs, from 2.11 to 2.15 (tests/test_torch_internals.py
# checks, on each torch, that the check's thread imports nothing more).
cpu_check_imports = (
    "torch._inductor.codecache",
    "torch._inductor.cpp_builder",
    "torch.utils.cpp_extension",
    "torch.utils._filelock",
)


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


def cpu_check_available():
    """Does Inductor check the CPU's vector instruction sets by building programs? (No check is started.)"""
    return importlib.util.find_spec("torch._inductor.cpu_vec_isa") is not None


@probe("the CPU check ahead of compiling", "Inductor checks as it compiles")
def cpu_check():
    """Probe: Inductor's check of the vector instruction sets this CPU runs (`valid_vec_isa_list`), made
    once a process before its first CPU kernel is compiled or loaded from the cache: it builds and loads a
    small C++ program in subprocesses, about a second spent waiting on them (docs/form-hierarchical.md).
    Started in a thread of its own on an owner's first call on the CPU, it waits while Dynamo traces, and
    Inductor finds its answer cached. Fallback None: none started, Inductor checks when it compiles.

    What the check imports is imported here, on the caller's thread, so that the check's thread imports
    nothing: an import running beside another thread's can fail. setuptools, which `cpp_extension` imports,
    edits `sys.meta_path` while the other thread's import walks it (a ModuleNotFoundError, met in CI).

    Until the check is done, Inductor's `pick_vec_isa` waits for it (`after_check`): the check
    is not safe beside a compile. It adds `-mavx512bf16` to an instruction set's flags while it tries them,
    and a kernel built meanwhile took that flag into its build and its cache key, so the first restart
    built those kernels again (the figures: docs/form-hierarchical.md, Inductor's CPU check)."""
    from torch._inductor import cpu_vec_isa
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    for name in cpu_check_imports:
        importlib.import_module(name)

    def check():
        # An error here is Inductor's to raise: its own check, uncached, runs again and meets it.
        with contextlib.suppress(Exception):
            valid_vec_isa_list()

    thread = threading.Thread(target=check, name="regionalize-cpu-check", daemon=True)
    thread.start()
    cpu_vec_isa.valid_vec_isa_list = after_check(cpu_vec_isa, valid_vec_isa_list, thread)
    return thread


def after_check(module, checked, thread):
    """`checked` (Inductor's `valid_vec_isa_list`, which `pick_vec_isa` looks up in `module` each call) as
    it is once `thread` is done: the first call from another thread waits for it, then puts `checked` back."""

    def after_check():
        if threading.current_thread() is not thread:
            thread.join()
            module.valid_vec_isa_list = checked
        return checked()

    # What Inductor's cached function offers beside its call, for code that clears it while this waits.
    for name in ("cache_clear", "cache_info"):
        if hasattr(checked, name):
            setattr(after_check, name, getattr(checked, name))
    return after_check


def sym_expr(value):
    """The sympy expression of the `ShapeEnv` that the `SymInt` `value` stands for."""
    return value.node.expr


def sym_hint(value):
    """The value of the `SymInt` `value` in the example traced, None where unknown."""
    return value.node.hint


def op_arguments(func, args, kwargs):
    """The arguments of a call of the ATen op `func` by name, its defaults filled in."""
    schema = func._schema.arguments
    given = dict(zip((a.name for a in schema), args, strict=False)) | kwargs
    for a in schema:
        if a.name not in given and a.has_default_value():
            given[a.name] = a.default_value
    return given


@probe("saved owners", "owners are compiled at each start, as without saving")
def saving():
    """Probe: what saving an owner's compiled frame needs of torch (`saved.py`): `aot_compile` on by
    default (2.13 and later; 2.11 keeps it behind `enable_aot_compile`, and compiles owners in pieces, which
    cannot be saved), the load, the hash of a traced code's lines, and the cache directory. Fallback None:
    nothing saved."""
    if not getattr(torch._dynamo.config, "enable_aot_compile", True):
        return None
    from torch._dynamo.package import _hash_sourcelines
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return types.SimpleNamespace(
        load=torch.compiler.load_compiled_function, hash_lines=_hash_sourcelines, cache_dir=cache_dir
    )


def aot_compiled(frame, compile_kwargs, args, kwargs):
    """`frame` compiled ahead of a call with `args` and `kwargs` (`fullgraph=True`), with nothing run: an
    `AOTCompiledFunction`, which saves to a file, and what its guards read of globals (`global_reads`)."""
    unsaved = torch._dynamo.guards.CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES
    reads = []
    keep = functools.partial(savable, unsaved, reads)
    options = {**compile_kwargs.get("options", {}), "guard_filter_fn": keep}
    compiled = torch.compile(frame, **{**compile_kwargs, "options": options}, fullgraph=True)
    return compiled.aot_compile((args, kwargs)), reads


def savable(unsaved, reads, guards):
    """Which of `guards` (torch's `GuardFilterEntry`s) a saved frame keeps: every kind torch can save, but
    those on the globals Dynamo makes itself (`__builtins_dict___0`), which a new process lacks. What the
    global ones read goes into `reads` (`global_reads`)."""
    reads.extend(global_reads(guard) for guard in guards if guard.is_global and guard.has_value)
    return [g.guard_type not in unsaved and not g.name.startswith("G['__builtins_dict") for g in guards]


def global_reads(guard):
    """What a guard on a global checks, as (how, the global's source, the value): the value of a constant
    ("=="), the length of a sequence ("len"), or None where it checks no value a later process could
    change in place. torch's load builds these guards again from the globals as they are then (2.13: those
    of another module; 2.15: all), so a value the frame was compiled for would go unchecked."""
    kind, value = guard.guard_type, guard.value
    if kind in ("CONSTANT_MATCH", "EQUALS_MATCH"):
        return ("==", guard.name, value)
    if kind in ("SEQUENCE_LENGTH", "LENGTH_CHECK"):
        return ("len", guard.name, len(value))
    return None


def aot_loaded(file, f_globals):
    """The compiled function saved in `file`, its code run in `f_globals`. Inside a tracing context: torch
    2.13 rebuilds a guard of an imported module's (`ImportSource`, the runtime's own functions reached from
    the model's globals) as it unpickles, which asks for one (2.14 builds none; harmless there)."""
    with torch._guards.tracing(torch._guards.TracingContext(None)):
        return saving().load(file, f_globals=f_globals)


def changed_source(loaded, modules):
    """The first code `loaded` traced whose lines differ now, as "module:line", or None: a block's `forward`
    edited since the save, which its guards do not see. A module missing from `modules` (not imported by
    name in this process) counts as changed."""
    for source in loaded.source_info().inlined_sources:
        module = modules.get(source.module)
        if module is None or saving().hash_lines(module, source.firstlineno, source.lastlineno) != (
            source.checksum
        ):
            return f"{source.module}:{source.firstlineno}"
    return None


def caches_off():
    """Are Inductor's caches off (`force_disable_caches`)? `aot_compile` refuses then."""
    return torch._inductor.config.force_disable_caches


def config_hash():
    """A hash of Inductor's configuration as it stands (a patched option compiles other code)."""
    import hashlib

    return hashlib.sha256(repr(sorted(torch._inductor.config.get_config_copy().items())).encode()).hexdigest()
