"""The vendored form (`--vendor`): the runtime helpers a rewrite calls, once per package in
`_regionalize.py`, inline in a lone file.

Run as users run it: the `regionalize` command over a package on disk, then the rewritten package
imported and run with torch alone.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch_support import needs_reuse

from regionalize.cli import main
from regionalize.codemod import runtime_copy, transform_source
from regionalize.shared.options import Options

VENDOR = Options(vendor=True)
MODEL = """\
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(x).tanh()


class Net(nn.Module):
    def __init__(self, d=8, n=6):
        super().__init__()
        self.layers = nn.ModuleList([Block(d) for _ in range(n)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
"""


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """zoo/ with zoo/models/net.py and zoo/other.py: two files that share one runtime copy."""
    models = tmp_path / "zoo" / "models"
    models.mkdir(parents=True)
    (tmp_path / "zoo" / "__init__.py").write_text("")
    (models / "__init__.py").write_text("")
    (models / "net.py").write_text(MODEL)
    (tmp_path / "zoo" / "other.py").write_text(MODEL)
    return tmp_path / "zoo"


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, [*args, "--vendor"])
    return result.exit_code, result.output


def test_apply_writes_one_runtime_copy_and_one_import_per_file(package: Path) -> None:
    code, out = invoke(str(package), "--apply", "-q")
    assert code == 0, out
    copy = package / "_regionalize.py"
    assert copy.read_text() == runtime_copy.runtime_text()
    assert "from .._regionalize import _regionalize_blocks\n" in (package / "models" / "net.py").read_text()
    assert "from ._regionalize import _regionalize_blocks\n" in (package / "other.py").read_text()
    assert "def _regionalize" not in (package / "other.py").read_text()
    before = {p: p.read_text() for p in package.rglob("*.py")}
    assert invoke(str(package), "--apply", "-q")[0] == 0
    assert {p: p.read_text() for p in package.rglob("*.py")} == before  # a second pass changes nothing
    assert invoke(str(package), "--check")[0] == 0


def test_dry_run_shows_the_new_runtime_copy_and_writes_nothing(package: Path) -> None:
    code, out = invoke(str(package))
    assert code == 1
    assert "+++ b/" in out and "_regionalize.py" in out and "+def _regionalize_blocks(" in out
    assert not (package / "_regionalize.py").exists()


def test_an_outdated_copy_is_brought_up_to_date_and_a_newer_one_left_alone(package: Path) -> None:
    invoke(str(package), "--apply", "-q")
    copy = package / "_regionalize.py"
    copy.write_text(runtime_copy.runtime_text().replace(f"runtime {runtime_copy.VERSION}:", "runtime 0:", 1))
    assert invoke(str(package), "--check")[0] == 1
    assert invoke(str(package), "--apply", "-q")[0] == 0
    assert copy.read_text() == runtime_copy.runtime_text()
    newer = runtime_copy.runtime_text().replace(f"runtime {runtime_copy.VERSION}:", "runtime 999:", 1)
    copy.write_text(newer)
    assert invoke(str(package), "--check")[0] == 0
    assert copy.read_text() == newer


@needs_reuse
def test_the_rewritten_package_runs_with_torch_alone(package: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original = {}
    exec(compile(MODEL, "original", "exec"), original)
    invoke(str(package), "--apply", "-q")
    monkeypatch.syspath_prepend(str(package.parent))
    # The copy must not reach back into regionalize: a model's users need not install it.
    monkeypatch.setitem(sys.modules, "regionalize", None)
    net = importlib.import_module("zoo.models.net")
    torch.manual_seed(0)
    model = net.Net().eval()
    twin = original["Net"]().eval()
    twin.load_state_dict(model.state_dict())
    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(x), twin(x))
    assert (
        "_regionalize_owner" in model.__dict__
        and model.__dict__["_regionalize_owner"].plan.form.value != "per block"
    )
    for name in [m for m in sys.modules if m == "zoo" or m.startswith("zoo.")]:
        monkeypatch.delitem(sys.modules, name)


def test_a_lone_file_keeps_the_helpers_it_calls_inline_and_updates_them() -> None:
    once = transform_source(MODEL, VENDOR).code
    assert once.count(runtime_copy.END) == 1 and "def _regionalize_blocks(" in once
    assert "def _regionalize_eager(" not in once  # only what the file calls, and what that calls
    assert transform_source(once, VENDOR).code == once
    stale = once.replace("max_reuse_entries=1024", "max_reuse_entries=8")
    again = transform_source(stale, VENDOR)
    assert again.status == "success" and again.code == once


def test_helpers_nothing_calls_any_more_are_taken_out() -> None:
    once = transform_source(MODEL, VENDOR).code
    uncalled = once.replace("_regionalize_blocks(block, self)", "block.compile()")
    loop = "for _ in range(n)])\n        for block in self.layers:\n            block.compile()\n"
    assert runtime_copy.place(uncalled, None, 0).code == MODEL.replace("for _ in range(n)])\n", loop)


def test_a_helper_the_file_defines_outside_the_markers_is_its_own_and_the_file_is_left_as_it_is() -> None:
    own = "import torch\n\n\n@torch.compiler.disable\ndef _regionalize_eager(call):\n    return call()\n"
    result = transform_source(own + "\n\n" + MODEL, VENDOR)
    assert result.code == own + "\n\n" + MODEL
    assert [(s.code, s.action) for s in result.sites] == [("RGZ113", "skip")]
    assert "`_regionalize_eager` is already bound at line 5" in result.sites[0].reason


def test_a_file_deep_in_a_package_imports_from_the_top_folder(package: Path) -> None:
    path = package / "models" / "net.py"
    result = transform_source(MODEL, VENDOR, path=str(path))
    assert result.runtime == package / "_regionalize.py"
    assert "from .._regionalize import _regionalize_blocks" in result.code


def _defined(text: str) -> list[str]:
    """The top-level definitions of a module's source: functions, classes and assigned names."""
    names = []
    for statement in ast.parse(text).body:
        if isinstance(statement, (ast.FunctionDef, ast.ClassDef)):
            names.append(statement.name)
        elif isinstance(statement, ast.Assign):
            names += [t.id for t in statement.targets if isinstance(t, ast.Name)]
    return names


def test_the_runtime_parts_join_into_one_module_that_runs_with_torch_alone() -> None:
    """The runtime is written in parts that import each other; the copy a rewrite gets is one module
    holding each part's definitions once, without those imports, and it runs on its own."""
    text = runtime_copy.runtime_text()
    joined = _defined(text)
    parts = [
        name
        for part in runtime_copy.PARTS
        for name in _defined((runtime_copy.RUNTIME / f"{part}.py").read_text(encoding="utf-8"))
    ]
    assert sorted(joined) == sorted(parts) and len(set(joined)) == len(joined)
    assert not [s for s in ast.parse(text).body if isinstance(s, ast.ImportFrom)]
    assert runtime_copy.version_of(text) == runtime_copy.VERSION > 0
    namespace: dict[str, object] = {"__name__": "_regionalize"}
    exec(compile(text, "_regionalize.py", "exec"), namespace)
    for part in runtime_copy.PARTS:  # the same objects as the parts', by name
        module = importlib.import_module(f"regionalize.runtime.{part}")
        assert {n for n in vars(module) if n.startswith("_regionalize") or n == "_RegionalizeLayerKV"} <= set(
            namespace
        )
