"""Starts Inductor's check of the CPU's vector instruction sets early, each set at once, and answers its
builds from a file.

The answers come from what worked in an earlier process (`remember_builds`, `../cpu_answers.py`)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import platform
import shutil
import threading
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from . import probe

if TYPE_CHECKING:  # imported where a probe finds it, so that a torch without it takes a fallback
    from torch._inductor.cpu_vec_isa import VecISA

Install = Callable[[set[str], Callable[[], None]], None]  # `remember_builds`'s answer

# The modules that Inductor's CPU check imports as it runs (tests/test_torch_internals.py checks, on each
# torch, that the check's thread imports nothing more).
cpu_check_imports = (
    "torch._inductor.codecache",
    "torch._inductor.cpp_builder",
    "torch.utils.cpp_extension",
    "torch.utils._filelock",
)


def cpu_check_available() -> bool:
    """Returns whether Inductor checks the CPU's vector instruction sets by building programs."""
    return importlib.util.find_spec("torch._inductor.cpu_vec_isa") is not None


@probe("the CPU check ahead of compiling", "Inductor checks as it compiles")
def cpu_check() -> threading.Thread:
    """Probe: starts Inductor's CPU check (`valid_vec_isa_list`) in a thread of its own and returns it.

    The check then runs while Dynamo traces. Its imports are made first on the caller's thread, since an
    import beside another thread's can fail, and Inductor waits for the check before it compiles a kernel
    (`after_check`), since the check changes flags while it runs
    (docs/form-hierarchical.md#inductors-cpu-check). Fallback None: Inductor checks when it compiles."""
    from torch._inductor import cpu_vec_isa
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    for name in cpu_check_imports:
        importlib.import_module(name)

    def check() -> None:
        # An error here is Inductor's to raise: its own check, uncached, runs again and meets it there.
        with contextlib.suppress(Exception):
            check_sets_at_once(cpu_vec_isa)
        with contextlib.suppress(Exception):
            valid_vec_isa_list()

    thread = threading.Thread(target=check, name="regionalize-cpu-check", daemon=True)
    thread.start()
    # Inductor's cached function, replaced on purpose by a plain one that offers its methods (`after_check`).
    cpu_vec_isa.valid_vec_isa_list = after_check(cpu_vec_isa, valid_vec_isa_list, thread)  # type: ignore[assignment]
    return thread


def check_sets_at_once(cpu_vec_isa: types.ModuleType) -> None:
    """Checks each instruction set that an x86 CPU reports in a thread of its own, as Inductor checks it.

    Each set's check is a few compiler runs of seconds each, which Inductor makes one after another; here
    they share the cores. Inductor keeps each set's answer, so its own check then builds nothing more."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return  # other CPUs have one set to check
    reported = cpu_vec_isa.x86_isa_checker()
    sets = [s for s in cpu_vec_isa.supported_vec_isa_list if all(f in reported for f in str(s).split())]
    threads = [
        threading.Thread(target=_check_set, args=(s,), name=f"regionalize-cpu-check {s}", daemon=True)
        for s in sets
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _check_set(isa: VecISA) -> None:
    """Checks one instruction set, leaving a failure for Inductor's own check to meet again."""
    with contextlib.suppress(Exception):
        bool(isa)


def after_check(
    module: types.ModuleType, checked: Callable[[], list[VecISA]], thread: threading.Thread
) -> Callable[[], list[VecISA]]:
    """Returns `checked`, Inductor's `valid_vec_isa_list`, made to wait until `thread` is done.

    The first call from another thread waits, then puts `checked` back in `module`."""

    def after_check() -> list[VecISA]:
        if threading.current_thread() is not thread:
            thread.join()
            module.valid_vec_isa_list = checked  # type: ignore[attr-defined]  # a module's attribute
        return checked()

    # Inductor's cached function offers these methods too, for code that clears it while this one waits.
    for name in ("cache_clear", "cache_info"):
        if hasattr(checked, name):
            setattr(after_check, name, getattr(checked, name))
    return after_check


@probe("the CPU check's answers kept", "Inductor checks the CPU in every process")
def remember_builds() -> Install:
    """Probe: returns `install(known, learned)`, which makes the check's builds answer from `known` keys.

    A build whose key (`build_key`) is in `known` answers True unbuilt; any other is built as Inductor builds
    it, and one that works is added to `known` before `learned()` is called. A failed build is never kept,
    since it may be a timeout, and keeping it would compile every kernel without vector instructions.
    Fallback None: every build is made."""
    from torch._inductor.cpu_vec_isa import VecISA

    build = VecISA.check_build
    lock = threading.Lock()  # the sets are checked at once, and each write holds every build before it

    def install(known: set[str], learned: Callable[[], None]) -> None:
        def check_build(isa: VecISA, code: str) -> bool:
            key = build_key(isa, code)
            if key in known:
                return True
            if not build(isa, code):
                return False
            with lock:
                known.add(key)
                learned()
            return True

        VecISA.check_build = check_build  # type: ignore[method-assign,assignment]  # patched on purpose

    return install


def build_key(isa: VecISA, code: str) -> str:
    """Returns the key of one build: the instruction set, its current flags and macros, and the program."""
    digest = hashlib.sha256(code.encode()).hexdigest()[:16]
    return f"{isa}|{isa.build_arch_flags()}|{' '.join(isa.build_macro())}|{digest}"


def cpu_identity() -> dict[str, Any] | None:
    """Returns what the check's answers depend on beyond the CPU, or None where there is no compiler.

    That is torch's build, the C++ compiler's file, size and time, and Inductor's cache directory."""
    from torch._inductor.cpp_builder import get_cpp_compiler
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    try:
        compiler = os.path.realpath(shutil.which(get_cpp_compiler()) or "")
        stat = os.stat(compiler)
    except Exception:  # no compiler; Inductor raises its own error when it compiles
        return None
    version = torch.version
    build = (version.__version__, version.git_version, os.path.dirname(torch.__file__))
    return {"torch": build, "compiler": (compiler, stat.st_size, stat.st_mtime_ns), "cache": cache_dir()}
