"""Nothing lost, nothing broken: a rewrite never overwrites a file it did not write, never shadows a name
of the user's nor is shadowed by one (RGZ113), and a run stopped at any write leaves a package that
imports. Run as users run it, over packages on disk, which are then imported. These are the vendored
form's (`--vendor`), which adds names and a module to the user's tree; the import form's one name is
tests/test_import_form.py's."""

from __future__ import annotations

import contextlib
import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from package_support import MODEL, imported_from, module_name, snapshot

from regionalize.cli import main
from regionalize.codemod import runtime_copy
from regionalize.runner import run as runner
from regionalize.runner.discovery import discover
from regionalize.runner.run import Job
from regionalize.shared.options import Options
from regionalize.shared.source_files import SourceFile

UTILS = "def _regionalize_blocks(*args):\n    return 'the user\\'s'\n\n\ndef helper():\n    return 1\n"


def make(root: Path, files: dict[str, str]) -> Path:
    """The package `mypkg` under `root`, with `model.py` (MODEL, after `head`) and `files`."""
    package = root / "mypkg"
    package.mkdir(parents=True)
    for name, text in {"__init__.py": "", "utils.py": UTILS, **files}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    return package


def apply(*paths: Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, [*map(str, paths), "--apply", "--vendor", "-q"])
    return result.exit_code, result.output


def owner_ran(root: Path, module: str) -> bool:
    """Does building `Net` call the runtime's helper (which marks the owner), not a function of the user's?"""
    with imported_from(root):
        net = importlib.import_module(module).Net()
        return "_regionalize_owner" in vars(net)


@pytest.mark.parametrize(
    "taken",
    [
        {"_regionalize.py": "SECRET = 42\n"},
        {"_regionalize/__init__.py": "SECRET = 42\n"},  # a package: Python imports it before a module
        {"_regionalize/data.py": "SECRET = 42\n"},  # a namespace package, which a module would hide
        {"_regionalize.abi3.so": "not really a library"},
        {"_regionalize.pyc": "not really bytecode"},  # a module without source, which a `.py` would hide
        {"_regionalize.py": "# regionalize runtime, says a comment of the user's\nSECRET = 42\n"},
    ],
)
def test_a_file_or_folder_of_the_package_with_the_runtime_module_name_is_kept(
    tmp_path: Path, taken: dict[str, str]
) -> None:
    package = make(tmp_path, {"model.py": MODEL, **taken})
    before = snapshot(tmp_path)
    code, out = apply(package)
    assert snapshot(tmp_path) == before
    name = next(iter(taken))
    path = f"{package}/{name.split('/')[0]}"
    assert code == 2
    assert f"error: {path}: the package's own " in out
    assert "RGZ113 skip comprehension of Block" in out and "RGZ001" not in out


@pytest.mark.parametrize(
    ("line", "files"),
    [
        ("def _regionalize_blocks(*args):\n    pass", {}),
        ("_regionalize_blocks = print", {}),
        ("from .utils import _regionalize_blocks", {}),
        ("import json as _regionalize_blocks", {}),
        ("def build(_regionalize_blocks=None):\n    return _regionalize_blocks", {}),
        ("from .utils import *", {"utils.py": UTILS + "__all__ = ['helper', '_regionalize_blocks']\n"}),
        ("from .utils import *", {"utils.py": UTILS + "__all__ = [n for n in dir() if n != 'x']\n"}),
        (
            "from . import *",
            {"__init__.py": "from .utils import _regionalize_blocks\n__all__ = ['_regionalize_blocks']\n"},
        ),
        (
            "from mypkg import *",
            {"__init__.py": "from .utils import _regionalize_blocks\n__all__ = ['_regionalize_blocks']\n"},
        ),
        ("", {"__init__.py": "_regionalize = 'the package attribute of the user'\n"}),
        (
            "",
            {
                "__init__.py": "from .utils import *\n",
                "utils.py": UTILS + "_regionalize = 1\n__all__ = ['_regionalize']\n",
            },
        ),
    ],
)
def test_a_name_the_file_or_package_holds_is_not_taken(
    tmp_path: Path, line: str, files: dict[str, str]
) -> None:
    package = make(tmp_path, {"model.py": f"{line}\n\n\n{MODEL}", **files})
    before = snapshot(tmp_path)
    code, out = apply(package)
    assert code == 0, out
    assert snapshot(tmp_path) == before
    assert "RGZ113 skip comprehension of Block: a name the rewrite would add is already" in out
    assert not owner_ran(tmp_path, "mypkg.model")


@pytest.mark.parametrize(
    ("line", "files"),
    [
        ("from .utils import *", {"utils.py": UTILS + "__all__ = ['helper']\n"}),
        ("from .utils import *", {}),  # without `__all__`, a star import brings no private name
        ("from . import *", {"__init__.py": "from .utils import *\n"}),
        ("import json", {}),
        ("", {"__init__.py": "from .utils import _regionalize_blocks\n"}),  # only the package's attribute
    ],
)
def test_a_name_like_ours_that_cannot_reach_the_file_is_no_collision(
    tmp_path: Path, line: str, files: dict[str, str]
) -> None:
    package = make(tmp_path, {"model.py": f"{line}\n\n\n{MODEL}", **files})
    code, out = apply(package)
    assert code == 0 and "RGZ113" not in out, out
    assert owner_ran(tmp_path, "mypkg.model")
    before = snapshot(tmp_path)
    code, out = apply(package)  # the names added are ours: a second pass finds them, and changes nothing
    assert code == 0 and "RGZ113" not in out and snapshot(tmp_path) == before


def test_an_import_of_a_module_of_the_user_named_like_ours_deeper_in_the_package_is_kept(
    tmp_path: Path,
) -> None:
    model = f"from ._regionalize import helper\n\n\n{MODEL}"
    own = {
        "sub/__init__.py": "",
        "sub/_regionalize.py": "def helper():\n    return 1\n",
        "sub/model.py": model,
    }
    package = make(tmp_path, own)
    code, out = apply(package)
    assert code == 0 and "RGZ001" in out, out
    text = (package / "sub" / "model.py").read_text()
    assert (
        "from ._regionalize import helper\n" in text
        and "from .. import _regionalize as regionalize\n" in text
    )
    assert owner_ran(tmp_path, "mypkg.sub.model")


@pytest.mark.parametrize("line", ["from copy import copy", "import copy", "regionalize = None"])
def test_a_lone_file_binds_one_name_for_its_copy_beside_it(tmp_path: Path, line: str) -> None:
    """The copy is a package of its own: what the file binds at module level is no collision, but for the
    one name the import binds, `regionalize`."""
    path = tmp_path / "script.py"
    path.write_text(f"{line}\n{MODEL}")
    code, out = apply(path)
    taken = line.startswith("regionalize")
    assert code == 0 and ("RGZ113" in out) == taken, out
    assert ("import _regionalize as regionalize\n" not in path.read_text()) == taken
    assert owner_ran(tmp_path, "script") != taken


def test_the_second_pass_over_a_rewritten_lone_file_finds_its_own_import(tmp_path: Path) -> None:
    path = tmp_path / "script.py"
    path.write_text(f"import copy\n{MODEL}")
    apply(path)
    rewritten = path.read_text()
    assert "\nimport _regionalize as regionalize\n" in rewritten and rewritten.startswith("import copy\n")
    code, out = apply(path)
    assert code == 0 and "RGZ113" not in out and path.read_text() == rewritten


def test_standard_input_beside_a_file_of_the_runtime_module_name_comes_back_as_it_was(tmp_path: Path) -> None:
    package = make(tmp_path, {"model.py": MODEL, "_regionalize.py": "SECRET = 42\n"})
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "regionalize",
            "--apply",
            "--vendor",
            "--stdin-filename",
            "mypkg/model.py",
            "-",
        ],
        input=MODEL.encode(),
        capture_output=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == MODEL.encode()
    assert b"error: mypkg/_regionalize.py: the package's own file" in done.stderr
    assert (package / "_regionalize.py").read_text() == "SECRET = 42\n"


class Killed(BaseException):
    """A kill, to the run: nothing in it catches this."""


def run_stopped(monkeypatch: pytest.MonkeyPatch, folder: Path, stop: int | None = None) -> int:
    """`--apply` over `folder` in this process, killed before its write number `stop` (from 0; None: not
    killed). The number of writes done."""
    written: list[str] = []
    write = runner.write_atomically

    def counted(path: str, source: SourceFile, text: str) -> None:
        if len(written) == stop:
            raise Killed
        write(path, source, text)
        written.append(path)

    with monkeypatch.context() as patch:
        patch.setattr(runner, "write_atomically", counted)
        patch.setattr(runtime_copy, "write_atomically", counted)  # each file of the copy
        files = [file for file, error in discover([str(folder)]) if error is None]
        with contextlib.suppress(Killed):
            runner.run(files, Job(Options(vendor=True), apply=True), jobs=1)
    return len(written)


@pytest.mark.parametrize("update", [False, True], ids=["first run", "update of an outdated runtime copy"])
def test_a_run_stopped_at_any_write_leaves_each_file_whole_and_the_package_importable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, update: bool
) -> None:
    original = tmp_path / "original"
    for name, text in {
        "__init__.py": "",
        "models/__init__.py": "",
        "models/net.py": MODEL,
        "other.py": MODEL,
    }.items():
        (original / "zoo" / name).parent.mkdir(parents=True, exist_ok=True)
        (original / "zoo" / name).write_text(text)
    if update:  # rewritten by an earlier version, whose runtime copy this one updates; and a new file
        run_stopped(monkeypatch, original)
        copy = original / "zoo" / runtime_copy.MODULE / "__init__.py"
        copy.write_text(copy.read_text().replace(f"runtime {runtime_copy.VERSION}:", "runtime 0:", 1))
        (original / "zoo" / "fresh.py").write_text(MODEL)
    shutil.copytree(original, tmp_path / "done")
    writes = run_stopped(monkeypatch, tmp_path / "done")
    # The runtime copy's files (an outdated one's `__init__.py` alone) and the files that import it.
    assert writes == (2 if update else len(runtime_copy.modules()) + 2)
    before, after = snapshot(original), snapshot(tmp_path / "done")
    for stop in range(writes):
        trial = tmp_path / f"stopped at {stop}"
        shutil.copytree(original, trial)
        assert run_stopped(monkeypatch, trial, stop) == stop
        now = snapshot(trial)
        for path in before.keys() | now.keys():
            assert now.get(path) in (before.get(path), after.get(path)), f"{path}, stopped at write {stop}"
        with imported_from(trial):
            for path in now:
                if path.suffix == ".py":
                    module = importlib.import_module(module_name(path))
                    if hasattr(module, "Net"):
                        module.Net()
