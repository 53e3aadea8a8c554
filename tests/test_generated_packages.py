"""The vendored form (`--vendor`) in generated packages with random collisions (files and folders of the
runtime copy's name, names the files define or import, star imports, an `__init__.py` that re-exports):
`--apply` never loses a byte of the user's code, every file it rewrites imports and builds its model
through the runtime, every file it skips is unchanged, with RGZ113, and the package imports as before.
An earlier release's joined copy (`_regionalize.py`) that no file imports gives way to the sub-package.

The property runs a few dozen packages in the suite; REGIONALIZE_GENERATED_PACKAGES=500 runs more.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from package_support import MODEL, imported_from, module_name, snapshot

from regionalize.codemod import runtime_copy
from regionalize.runner.discovery import discover
from regionalize.runner.run import Job, run
from regionalize.shared.options import Options
from regionalize.verify import run_verify

USER = "def _regionalize_blocks(*args):\n    return 'the user\\'s'\n"
# What each model file may hold besides the model, and whether a rewrite would collide with it; None: it
# depends on the rest of the package (`collides`).
SNIPPETS = {
    "nothing": ("", False),
    "a name of its own like ours": ("def _regionalize_mine():\n    pass\n", False),
    "its own helper": (USER, True),
    "an assignment": ("_regionalize_blocks = print\n", True),
    "an import from utils": ("from {dots}utils import _regionalize_blocks\n", True),
    "an import as": ("import json as _regionalize_blocks\n", True),
    "a parameter": ("def build(_regionalize_blocks=None):\n    return _regionalize_blocks\n", True),
    "a star import of utils": ("from {dots}utils import *\n", None),
    "a star import of the package": ("from pkg import *\n", None),
    "from copy import copy": ("from copy import copy\n", None),
    "import copy": ("import copy\n", False),
    # In `sub/` only: its own module of the runtime's name, which is not the top folder's.
    "an import of its folder's _regionalize": ("from ._regionalize import helper\n", False),
}
DEEPER = "an import of its folder's _regionalize"
UTILS_ALL = {
    "no __all__": "",
    "a public __all__": "__all__ = ['helper']\n",
    "an __all__ with ours": "__all__ = ['helper', '_regionalize_blocks']\n",
    "a computed __all__": "__all__ = ['helper'] + [n for n in dir() if n.startswith('_regionalize')]\n",
}
INIT = {
    "empty": "",
    "a star import": "from .utils import *\n",
    "a re-export": "from .utils import _regionalize_blocks\n\n__all__ = ['_regionalize_blocks']\n",
    "the module's name": "_regionalize = 'the user\\'s'\n",
}
# What is there at `pkg/_regionalize*`: None, or files under it (relative) and whether it is the user's.
SLOTS: dict[str, tuple[dict[str, str], bool]] = {
    "nothing": ({}, False),
    "a file of the user's": ({"_regionalize.py": "SECRET = 42\n"}, True),
    "a package of the user's": ({"_regionalize/__init__.py": "SECRET = 42\n"}, True),
    "a namespace folder": ({"_regionalize/data.py": "SECRET = 42\n"}, True),
    "an earlier release's joined copy": (
        {"_regionalize.py": f"{runtime_copy.MARK}21: begin\ndef _regionalize_blocks(*args):\n    pass\n"},
        False,
    ),
    "an outdated copy": (
        {
            f"_regionalize/{name}": text.replace(f"runtime {runtime_copy.VERSION}:", "runtime 0:", 1)
            for name, text in runtime_copy.modules().items()
        },
        False,
    ),
}
JOINED = "an earlier release's joined copy"


@dataclass(frozen=True)
class Spec:
    in_package: bool
    utils_all: str
    init: str
    slot: str
    files: tuple[tuple[str, str], ...]  # (path under the folder, snippet)


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    in_package = draw(st.booleans())
    # A star import is read only in a package (a lone file's may be of anything on sys.path).
    choices = [s for s in SNIPPETS if s != DEEPER and (in_package or "star import" not in s)]
    places = ["m0.py", "m1.py", "sub/m2.py"] if in_package else ["m0.py", "m1.py"]
    chosen = set(draw(st.lists(st.sampled_from(places), min_size=1, max_size=len(places))))
    return Spec(
        in_package,
        draw(st.sampled_from(sorted(UTILS_ALL))),
        draw(st.sampled_from(sorted(INIT))),
        draw(st.sampled_from(sorted(SLOTS))),
        tuple(
            (path, draw(st.sampled_from([*choices, DEEPER] if path.startswith("sub/") else choices)))
            for path in sorted(chosen)
        ),
    )


def collides(spec: Spec, snippet: str) -> bool:
    """Would the rewrite of a file holding `snippet` shadow a name of the user's, or be shadowed?"""
    if spec.in_package and (SLOTS[spec.slot][1] or spec.init == "the module's name"):
        return True
    if snippet == "a star import of utils":
        return spec.utils_all in ("an __all__ with ours", "a computed __all__")
    if snippet == "a star import of the package":
        return spec.init == "a re-export"
    if snippet == "from copy import copy":
        return False  # the copy is a package of its own: only `regionalize` is bound in the file
    return bool(SNIPPETS[snippet][1])


def build(folder: Path, spec: Spec) -> None:
    texts = {"utils.py": USER + "\n\ndef helper():\n    return 1\n" + UTILS_ALL[spec.utils_all]}
    if spec.in_package:
        texts |= {"__init__.py": INIT[spec.init], "sub/__init__.py": "", **SLOTS[spec.slot][0]}
        texts["sub/_regionalize.py"] = "def helper():\n    return 1\n"
    for path, snippet in spec.files:
        dots = ("." * (1 + path.count("/"))) if spec.in_package else ""
        texts[path] = SNIPPETS[snippet][0].format(dots=dots) + "\n\n" + MODEL
    for path, text in texts.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)


def kept_in_order(before: bytes, after: bytes) -> bool:
    """Is every line of `before` in `after`, in the same order (a rewrite only adds)?"""
    lines = iter(after.splitlines())
    return all(line in lines for line in before.splitlines())


def check(spec: Spec, root: Path) -> None:
    folder = root / ("pkg" if spec.in_package else "loose")
    build(folder, spec)
    before = snapshot(root)
    files = [f for f, error in discover([str(folder)]) if error is None]
    # By path: the error of a file of the runtime module's name follows the report of its own scan.
    reports = {Path(r.path).resolve(): r for r in run(files, Job(Options(vendor=True), apply=True), jobs=1)}
    after = snapshot(root)

    copy = folder.relative_to(root) / runtime_copy.MODULE
    modules = runtime_copy.modules()
    expected: dict[Path, bytes | None] = {copy / name: text.encode() for name, text in modules.items()}
    expected |= {(copy / name).parent: None for name in modules}  # the copy and its folders
    rewritten = any(r.changed for r in reports.values())
    joined = folder.relative_to(root) / f"{runtime_copy.MODULE}.py"
    # Only an earlier release's joined copy goes, where the sub-package took its place.
    gone = spec.in_package and spec.slot == JOINED and rewritten
    assert before.keys() - after.keys() == ({joined} if gone else set())
    for path in after.keys() - before.keys():
        assert after[path] == expected[path], path
    for path, content in before.items():
        if path not in after or after[path] == content:
            continue
        if path in expected:  # the copy regionalize wrote, brought up to date
            assert spec.slot == "an outdated copy" and after[path] == expected[path]
            continue
        assert reports[(root / path).resolve()].changed and kept_in_order(content or b"", after[path] or b"")

    # The user's file or folder of the runtime module's name, and nothing else, is an error of the run.
    errors = [Path(r.path).resolve() for r in reports.values() if r.error]
    taken = folder / (
        f"{runtime_copy.MODULE}.py" if spec.slot == "a file of the user's" else runtime_copy.MODULE
    )
    assert errors == ([taken] if spec.in_package and SLOTS[spec.slot][1] else []), errors

    with imported_from(root if spec.in_package else folder):
        for path, snippet in spec.files:
            report = reports[(folder / path).resolve()]
            taken = collides(spec, snippet)
            codes = {s.code for s in report.sites}
            assert report.changed != taken and (codes == {"RGZ113"} if taken else "RGZ113" not in codes), (
                path,
                snippet,
                codes,
            )
            name = module_name((folder / path).relative_to(root if spec.in_package else folder))
            module = importlib.import_module(name)
            net = module.Net()
            assert ("_regionalize_owner" in vars(net)) != taken, f"{name}: built through the runtime"
        utils = importlib.import_module("pkg.utils" if spec.in_package else "utils")
        assert utils._regionalize_blocks() == "the user's"
        if spec.in_package and spec.init == "the module's name":
            assert importlib.import_module("pkg")._regionalize == "the user's"


@settings(
    max_examples=int(os.environ.get("REGIONALIZE_GENERATED_PACKAGES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(spec=specs())
def test_generated_packages_lose_nothing_and_import(spec: Spec) -> None:
    with tempfile.TemporaryDirectory() as folder:
        check(spec, Path(folder).resolve())


def test_a_rewritten_file_beside_collisions_verifies(tmp_path: Path) -> None:
    """One package, one file of it skipped and one rewritten beside near collisions: the rewritten file,
    as --apply left it, computes what the original computed, loads its checkpoints, and compiles."""
    spec = Spec(
        True,
        "a public __all__",
        "a star import",
        "an outdated copy",
        (("m0.py", "a star import of utils"), ("m1.py", "its own helper"), ("sub/m2.py", "nothing")),
    )
    original, applied = tmp_path / "original", tmp_path / "applied"
    build(original / "pkg", spec)
    shutil.copytree(original, applied)
    factory = "\n\ndef make():\n    return Net(), (torch.randn(2, 8),)\n"
    for path in ("m0.py", "sub/m2.py"):
        for root in (original, applied):
            file = root / "pkg" / path
            file.write_text("import torch\n" + file.read_text() + factory)
    files = [f for f, error in discover([str(applied)]) if error is None]
    run(files, Job(Options(vendor=True), apply=True), jobs=1)
    assert (applied / "pkg" / "m1.py").read_text() == (original / "pkg" / "m1.py").read_text()
    for path in ("m0.py", "sub/m2.py"):
        out = tmp_path / f"{path.replace('/', '_')}.json"
        with imported_from(original), (tmp_path / "table.txt").open("w") as table:
            code = run_verify(
                str(original / "pkg" / path),
                "make",
                str(applied / "pkg" / path),
                repeats=1,
                cold_start=False,
                json_out=str(out),
                options=Options(backend="eager", vendor=True),
                out=table,
            )
        result = json.loads(out.read_text())
        assert code == 0 and result["equivalent"] and result["state_dict_compatible"], result
        assert result["graphs"]["regional"] >= 1
