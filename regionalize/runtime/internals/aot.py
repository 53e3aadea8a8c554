"""torch's `aot_compile`, its save and load, as saved owners use them (`saved.py`)."""

import contextlib
import functools
import gc
import importlib
import re
import types

import torch

from . import probe


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


@probe("a saved frame of parameters holding gradients", "such an owner is not saved", fallback=False)
def loads_gradients():
    """Probe: does torch's load of a saved frame take a parameter that held a gradient at the save? Its
    guard state pickles the gradient as a placeholder, which 2.13 and 2.14 fail to assign back
    (`TypeError: assigned grad expected to be a Tensor`): every restart would warn and compile again. 2.15
    drops it. Fallback False: such owners are not saved."""
    from torch._dynamo.guards import GuardsStatePickler, _Missing

    real = torch.empty(1)
    keys = torch._C._dispatch_keys(real).raw_repr()
    try:
        GuardsStatePickler._unpickle_tensor(
            torch.empty(1, device="meta"), real.device, torch.Tensor, keys, _Missing("grad")
        )
    except TypeError as error:
        if "grad" not in str(error):
            raise
        return False
    return True


def aot_compiled(frame, compile_kwargs, args, kwargs):
    """`frame` compiled ahead of a call with `args` and `kwargs` (`fullgraph=True`), with nothing run: an
    `AOTCompiledFunction`, which saves to a file, and what its guards read that a load would not check
    (`savable`)."""
    unsaved = torch._dynamo.guards.CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES
    reads = []
    keep = functools.partial(savable, unsaved, reads)
    options = {**compile_kwargs.get("options", {}), "guard_filter_fn": keep}
    compiled = torch.compile(frame, **{**compile_kwargs, "options": options}, fullgraph=True)
    return compiled.aot_compile((args, kwargs)), reads


def savable(unsaved, reads, guards):
    """Which of `guards` (torch's `GuardFilterEntry`s) a saved frame keeps: every kind torch can save (its
    own or one it derives from), but those on the globals Dynamo makes itself (`__builtins_dict___0`),
    which a new process lacks. What the dropped ones and those on globals (which torch's load builds again
    from the globals as they are then) read goes into `reads`, as (what is read, source, value, dropped),
    for `guard_reads.py`."""

    def dropped(guard):
        kinds = (guard.guard_type, *guard.derived_guard_types)
        return any(kind in unsaved for kind in kinds) or guard.name.startswith("G['__builtins_dict")

    kept = [not dropped(guard) for guard in guards]
    for guard, keep in zip(guards, kept, strict=True):
        what = _READS.get(guard.guard_type, "value")
        if guard.has_value and what and (guard.is_global or not keep):
            reads.append((what, guard.name, guard.value, not keep))
    return kept


# What a guard's kind reads of its value (`guard_reads.recorded`); None where the guard's own saved
# arguments say what it checks (a key a dict holds) or it relates inputs (one aliasing another). Kinds not
# named here read the whole value.
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


def aot_loaded(file, f_globals):
    """The compiled function saved in `file`, its code run in `f_globals`. Inside a tracing context: torch
    2.13 rebuilds a guard of an imported module's (`ImportSource`, the runtime's own functions reached from
    the model's globals) as it unpickles, which asks for one (2.14 builds none; harmless there). With the
    collector paused: the guards' state unpickles objects for every parameter, and the collections they
    set off grew the load with depth (0.13 s of 0.70 s at 64 blocks, a 2-core CPU)."""
    with torch._guards.tracing(torch._guards.TracingContext(None)), _collector_paused():
        return saving().load(file, f_globals=f_globals)


@contextlib.contextmanager
def _collector_paused():
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


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


# The globals Dynamo installs for what its code loads (`install_global_by_id`), named by the object's id in
# the compiling process and the compile's number: `___module_collections_140473201368960_c0` for a module,
# `_140599701941008_c0`. A saved frame's code and guards name them so, which a later process lacks.
_INSTALLED = re.compile(r"\w*_\d+_c\d+")


def installed(name):
    """Is `name` a global Dynamo installed under an id of its process's (`_140599701941008_c0`)?"""
    return _INSTALLED.fullmatch(name) is not None


def installed_modules(f_globals):
    """The modules Dynamo installed in `f_globals` for the code it compiled, by the names it gave them: a
    later process gets them back by name (`install_modules`); other such globals it cannot."""
    return {
        name: value.__name__
        for name, value in list(f_globals.items())
        if isinstance(value, types.ModuleType) and installed(name)
    }


def install_modules(modules, f_globals):
    """Put back in `f_globals` the modules a saved frame's code loads by Dynamo's names (`installed_modules`
    of the process that saved it), imported where they are not yet."""
    for name, module in modules.items():
        if installed(name):
            f_globals.setdefault(name, importlib.import_module(module))
