"""The vendored form (`--vendor`): the runtime package copied once per package into `_regionalize/`, or
beside a lone file, and bound by one import; copies of earlier releases moved to it.

Run as users run it: the `regionalize` command over a package on disk, then the rewritten package
imported and run with torch alone.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch_support import needs_reuse

from regionalize.cli import main
from regionalize.codemod import runtime_copy, transform_source, vendored_legacy
from regionalize.shared.options import Options

VENDOR = Options(vendor=True)
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "vendored"
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


def copy_of(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): p.read_text(encoding="utf-8") for p in sorted(folder.rglob("*.py"))
    }


def test_apply_writes_one_runtime_copy_and_one_import_per_file(package: Path) -> None:
    code, out = invoke(str(package), "--apply", "-q")
    assert code == 0, out
    assert copy_of(package / "_regionalize") == runtime_copy.modules()
    net, other = (package / "models" / "net.py").read_text(), (package / "other.py").read_text()
    assert "from .. import _regionalize as regionalize\n" in net
    assert "from . import _regionalize as regionalize\n" in other
    assert "regionalize.compile_region(*self.layers, owner=self)" in other
    before = {p: p.read_text() for p in package.rglob("*.py")}
    assert invoke(str(package), "--apply", "-q")[0] == 0
    assert {p: p.read_text() for p in package.rglob("*.py")} == before  # a second pass changes nothing
    assert invoke(str(package), "--check")[0] == 0


def test_the_vendored_form_is_the_import_form_but_for_its_import(package: Path) -> None:
    path = str(package / "models" / "net.py")
    vendored = transform_source(MODEL, VENDOR, path).code
    public = transform_source(MODEL, Options(), path).code
    assert vendored.replace("from .. import _regionalize as regionalize\n", "") == public.replace(
        "import regionalize\n", ""
    )
    # Each way the other: the calls stay, the import changes.
    assert transform_source(public, VENDOR, path).code == vendored
    moved = transform_source(vendored, Options(), path)
    assert moved.code == public and moved.sites[0].code == "RGZ005"


def test_every_module_of_the_copy_carries_the_runtime_header_and_imports_relatively() -> None:
    texts = runtime_copy.modules()
    runtime = runtime_copy.RUNTIME
    assert set(texts) == {p.relative_to(runtime).as_posix() for p in runtime.rglob("*.py")}
    assert "internals/cpu.py" in texts  # its sub-package too
    for name, text in texts.items():
        assert runtime_copy.version_of(text) == runtime_copy.VERSION > 0, name
        imported = [
            node.names[0].name if isinstance(node, ast.Import) else node.module or ""
            for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.Import) or (isinstance(node, ast.ImportFrom) and not node.level)
        ]
        assert not [m for m in imported if m.split(".")[0] == "regionalize"], name


def test_dry_run_shows_the_new_runtime_copy_and_writes_nothing(package: Path) -> None:
    code, out = invoke(str(package))
    assert code == 1
    assert "+++ b/" in out and "_regionalize/__init__.py" in out and "+def compile_region(" in out
    assert not (package / "_regionalize").exists()


def test_an_outdated_copy_is_brought_up_to_date_and_a_newer_one_left_alone(package: Path) -> None:
    invoke(str(package), "--apply", "-q")
    folder = package / "_regionalize"
    init = folder / "__init__.py"
    init.write_text(init.read_text().replace(f"runtime {runtime_copy.VERSION}:", "runtime 0:", 1))
    (folder / "api.py").unlink()
    (folder / "gone.py").write_text(f"{runtime_copy.MARK}0: an older runtime's part\n")
    assert invoke(str(package), "--check")[0] == 1
    assert invoke(str(package), "--apply", "-q")[0] == 0
    assert copy_of(folder) == runtime_copy.modules()
    newer = init.read_text().replace(f"runtime {runtime_copy.VERSION}:", "runtime 999:", 1)
    init.write_text(newer)
    assert invoke(str(package), "--check")[0] == 0
    assert init.read_text() == newer


def test_a_folder_of_the_users_own_is_never_written_over(package: Path) -> None:
    (package / "_regionalize").mkdir()
    (package / "_regionalize" / "__init__.py").write_text("SECRET = 42\n")
    code, out = invoke(str(package), "--apply", "-q")
    assert code == 2 and "error:" in out
    assert copy_of(package / "_regionalize") == {"__init__.py": "SECRET = 42\n"}
    assert "regionalize" not in (package / "other.py").read_text()


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
        and model.__dict__["_regionalize_owner"].report.plan.form.name != "per block"
    )
    assert type(model.__dict__["_regionalize_owner"]).__module__.startswith("zoo._regionalize.")
    for name in [m for m in sys.modules if m == "zoo" or m.startswith("zoo.")]:
        monkeypatch.delitem(sys.modules, name)


RUN = """
import sys
sys.modules["regionalize"] = None  # torch alone
import torch
{load}
model = module.Net()
print(model(torch.randn(2, 8)).shape, "_regionalize_owner" in vars(model))
"""


@pytest.mark.parametrize(
    "load",
    ["module = sys.modules['__main__']", "import lone as module"],
    ids=["as a script", "imported"],
)
def test_a_lone_file_gets_the_copy_beside_it_and_runs_as_a_script_and_imported(
    tmp_path: Path, load: str
) -> None:
    lone = tmp_path / "lone.py"
    lone.write_text(MODEL)
    assert invoke(str(lone), "--apply", "-q")[0] == 0
    assert "\nimport _regionalize as regionalize\n" in lone.read_text()
    assert copy_of(tmp_path / "_regionalize") == runtime_copy.modules()
    if load.startswith("module = sys"):  # the model file itself run as the script
        lone.write_text(lone.read_text() + RUN.format(load=load).replace("module.Net", "Net"))
        command = [sys.executable, str(lone)]
    else:
        command = [sys.executable, "-c", RUN.format(load=load)]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.split()[-1] == "True", done.stderr[-2000:]


def test_a_lone_files_inline_copy_of_an_earlier_release_moves_to_the_copy_beside_it() -> None:
    legacy = (FIXTURES / "moved_inline.in.py").read_text()
    moved = transform_source(legacy, VENDOR)
    assert vendored_legacy.END not in moved.code and "def _regionalize_" not in moved.code
    assert "\nimport _regionalize as regionalize\n" in moved.code
    assert transform_source(moved.code, VENDOR).code == moved.code


def _legacy_package(package: Path) -> Path:
    """The package as an earlier release left it with --vendor: a joined `_regionalize.py`, and each file
    importing its helpers."""
    joined = package / "_regionalize.py"
    joined.write_text(f"{runtime_copy.MARK}21: begin\ndef _regionalize_blocks(block, owner):\n    pass\n")
    for path, dots in ((package / "models" / "net.py", ".."), (package / "other.py", ".")):
        text = path.read_text().replace("import torch.nn as nn\n", "import torch.nn as nn\n\n{imp}", 1)
        loop = "        for block in self.layers:\n            _regionalize_blocks(block, self)\n"
        text = text.replace("for _ in range(n)])\n", "for _ in range(n)])\n" + loop, 1)
        path.write_text(text.format(imp=f"from {dots}_regionalize import _regionalize_blocks\n"))
    return joined


def test_a_joined_copy_of_an_earlier_release_moves_to_the_sub_package(package: Path) -> None:
    joined = _legacy_package(package)
    code, out = invoke(str(package), "--apply", "-q")
    assert code == 0, out
    assert not joined.exists() and copy_of(package / "_regionalize") == runtime_copy.modules()
    for path in (package / "models" / "net.py", package / "other.py"):
        text = path.read_text()
        assert "_regionalize_blocks" not in text and "import _regionalize as regionalize\n" in text
        assert "regionalize.compile_region(*self.layers, owner=self)" in text
    assert invoke(str(package), "--check")[0] == 0


def test_a_run_over_part_of_a_package_leaves_a_joined_copy_others_still_import(package: Path) -> None:
    """A package directory hides a module of its name: while a file the run leaves out imports the joined
    copy, the files of the run are errors and nothing is written; a run over the whole package moves all."""
    joined = _legacy_package(package)
    before = {p: p.read_bytes() for p in package.rglob("*.py")}
    code, out = invoke(str(package / "other.py"), "--apply")
    assert code == 2 and "zoo/models/net.py" in out and "whole package" in out, out
    assert {p: p.read_bytes() for p in package.rglob("*.py")} == before
    assert not (package / "_regionalize").exists()
    assert invoke(str(package), "--apply", "-q")[0] == 0 and not joined.exists()


def test_without_vendor_a_copy_moves_to_the_import_form_and_stays_on_disk(package: Path) -> None:
    invoke(str(package), "--apply", "-q")
    result = CliRunner().invoke(main, [str(package), "--apply"])
    assert result.exit_code == 0, result.output
    assert "RGZ005" in result.output and "`zoo/_regionalize` (runtime" in result.output.replace(
        str(package.parent) + "/", ""
    )
    assert "import regionalize\n" in (package / "other.py").read_text()
    assert (package / "_regionalize" / "__init__.py").is_file()


def test_a_file_deep_in_a_package_imports_from_the_top_folder(package: Path) -> None:
    path = package / "models" / "net.py"
    result = transform_source(MODEL, VENDOR, path=str(path))
    assert result.runtime == package / "_regionalize"
    assert "from .. import _regionalize as regionalize" in result.code


def test_a_name_of_the_users_like_a_runtime_helper_is_no_collision_in_the_copy(package: Path) -> None:
    """The copy is a package of its own: the file binds `regionalize` alone."""
    own = "def _regionalize_owner_of(x):\n    return x\n\n\n"
    result = transform_source(own + MODEL, VENDOR, str(package / "other.py"))
    assert result.status == "success" and "RGZ113" not in {s.code for s in result.sites}
