"""The CPU check's answers kept (runtime/cpu_answers.py): a process keeps the builds of Inductor's CPU check
that worked under torch's cache directory, and a later one on the same CPU, compiler and torch takes them
from there, building nothing and finding the same instruction sets, flags and all. A build that failed is
never kept; an unreadable file is checked afresh and written again; another compiler or caches off keep
nothing shared. Each process is fresh, as Inductor checks once a process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from regionalize.runtime import cpu_answers
from regionalize.runtime.internals import cpu

pytestmark = pytest.mark.skipif(
    cpu_answers.cpu_flags() is None or cpu_answers.answers_path() is None,
    reason="no CPU flags to read or no C++ compiler",
)

# One process's check: the builds Inductor made (its `check_build`, counted under the runtime's), optionally
# failing those of the sets named in FAIL, then the sets it found with their flags.
CHECK = textwrap.dedent(
    """
    import json, os, sys
    from torch._inductor import cpu_vec_isa
    from regionalize.runtime.cpu_answers import start_cpu_check

    fail, build, built = os.environ.get("FAIL"), cpu_vec_isa.VecISA.check_build, []

    def counted(isa, code):
        built.append(str(isa))
        return False if fail and fail in str(isa) else build(isa, code)

    cpu_vec_isa.VecISA.check_build = counted
    start_cpu_check().join(timeout=300)
    found = [(str(isa), isa.build_arch_flags()) for isa in cpu_vec_isa.valid_vec_isa_list()]
    print(json.dumps({"built": built, "found": found}))
    """
)


def check(cache: Path, **env: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHECK],
        env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def kept(cache: Path) -> list[Path]:
    return sorted((cache / "regionalize" / "cpu").glob("*.json"))


def test_a_later_process_takes_the_builds_that_worked_and_finds_the_same_sets(tmp_path: Path) -> None:
    first = check(tmp_path)
    assert first["built"] and first["found"]
    (path,) = kept(tmp_path)
    assert len(json.loads(path.read_text())["builds"]) == len(first["built"])  # all worked here
    later = check(tmp_path)
    assert later == {"built": [], "found": first["found"]}


def test_a_build_that_failed_is_built_again_and_an_unreadable_file_is_written_afresh(tmp_path: Path) -> None:
    whole = check(tmp_path / "whole")
    if len(whole["found"]) < 2:
        pytest.skip("one instruction set here: nothing to fail alone")
    weakest = whole["found"][-1][0]
    failed = check(tmp_path, FAIL=weakest)
    assert weakest not in [name for name, _ in failed["found"]]
    (path,) = kept(tmp_path)
    later = check(tmp_path)
    assert later["found"] == whole["found"]
    assert later["built"] and all(weakest in name for name in later["built"])  # only the failed one's
    path.write_text("{not json")
    again = check(tmp_path)
    assert again["found"] == whole["found"] and len(again["built"]) == len(whole["built"])
    assert len(json.loads(path.read_text())["builds"]) == len(whole["built"])


def test_another_compiler_or_inductors_caches_off_share_no_answers(tmp_path: Path) -> None:
    import torch._inductor.config as config
    from torch._inductor.cpp_builder import get_cpp_compiler

    here = cpu_answers.answers_path()
    assert here is not None and cpu_answers.answers_path() == here
    compiler = shutil.which(get_cpp_compiler())
    assert compiler is not None
    other = tmp_path / "g++"
    shutil.copy2(compiler, other)
    os.utime(other, ns=(1, 1))
    # Through torch's own patch, not pytest's: pytest 9.2's monkeypatch undoes an attribute absent from a
    # module's `__dict__` by deleting it, which hid torch's config options from every later test.
    with config.patch({"cpp.cxx": (str(other),)}):
        assert cpu.cpu_identity()["compiler"] == (str(other), other.stat().st_size, 1)
        assert cpu_answers.answers_path() not in (None, here)
    with config.patch(force_disable_caches=True):
        assert cpu_answers.answers_path() is None
