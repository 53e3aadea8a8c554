"""Inductor's check of the CPU's vector instruction sets: started ahead of the first compile (`cpu_check`),
its builds answered from what worked in an earlier process (`remember_builds`, `../cpu_answers.py`)."""

import contextlib
import hashlib
import importlib
import importlib.util
import os
import shutil
import threading

import torch

from . import probe

# The modules Inductor's CPU check imports as it runs, from 2.11 to 2.15 (tests/test_torch_internals.py
# checks, on each torch, that the check's thread imports nothing more).
cpu_check_imports = (
    "torch._inductor.codecache",
    "torch._inductor.cpp_builder",
    "torch.utils.cpp_extension",
    "torch.utils._filelock",
)


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


@probe("the CPU check's answers kept", "Inductor checks the CPU in every process")
def remember_builds():
    """Probe: Inductor's build of one instruction set's test program (`VecISA.check_build`, each a compile
    where not cached and a process that loads it, about 0.14 s each, 10 a check on an AVX-512 CPU) made to
    answer from a set of keys (`build_key`) of builds that worked (`cpu_answers.py`). Returns
    `install(known, learned)`: a build whose key is in `known` answers True unbuilt; any other is built as
    Inductor builds it, and one that works is added to `known`, then `learned()` is called. A failed build
    is never remembered: it can be a load that timed out under load, and taking that as lasting would
    compile every kernel without vector instructions. Fallback None: every build is made."""
    from torch._inductor.cpu_vec_isa import VecISA

    build = VecISA.check_build

    def install(known, learned):
        def check_build(isa, code):
            key = build_key(isa, code)
            if key in known:
                return True
            if not build(isa, code):
                return False
            known.add(key)
            learned()
            return True

        VecISA.check_build = check_build

    return install


def build_key(isa, code):
    """What one build of the check makes: the set, its flags and macros as they are now (a set's check
    adds a flag while it tries a program), and the program."""
    digest = hashlib.sha256(code.encode()).hexdigest()[:16]
    return f"{isa}|{isa.build_arch_flags()}|{' '.join(isa.build_macro())}|{digest}"


def cpu_identity():
    """What the check's answers depend on beyond the CPU: torch's build and its headers' folder, the C++
    compiler Inductor picks (its file, size and time: another compiler, or the same upgraded, checks
    afresh), Inductor's cache directory, where they are kept. None where Inductor finds no compiler."""
    from torch._inductor.cpp_builder import get_cpp_compiler
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    try:
        compiler = os.path.realpath(shutil.which(get_cpp_compiler()) or "")
        stat = os.stat(compiler)
    except Exception:  # no compiler: Inductor raises its own error when it compiles
        return None
    version = torch.version
    build = (version.__version__, version.git_version, os.path.dirname(torch.__file__))
    return {"torch": build, "compiler": (compiler, stat.st_size, stat.st_mtime_ns), "cache": cache_dir()}
