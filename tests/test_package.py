"""Names imported from the file's own package are judged by their definitions
(`regionalize.codemod.package`)."""

from __future__ import annotations

import os
import shutil
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from regionalize.cli import main
from regionalize.codemod import transform_source
from regionalize.codemod.definitions import Definition
from regionalize.codemod.package import Packages

MODEL = """
import torch.nn as nn
from .parts import Mixer


class Net(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.layers = nn.ModuleList([Mixer() for _ in range(n)])
"""
LEAF_MIXER = """
import torch
import torch.nn as nn


class Mixer(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))
"""
BLOCK_MIXER = LEAF_MIXER.replace("nn.Parameter(torch.ones(4))", "nn.Linear(4, 4)")


def package(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "__init__.py").write_text(files.pop("__init__.py", ""))
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text))
    return root


def codes(path: Path) -> list[str]:
    return [site.code for site in transform_source(path.read_text(), path=str(path)).sites]


def test_a_class_is_judged_where_the_package_defines_it(tmp_path: Path) -> None:
    pkg = package(tmp_path / "lib", {"model.py": MODEL, "parts.py": LEAF_MIXER})
    assert codes(pkg / "model.py") == ["RGZ102"]  # only parameters: a leaf
    # Without the path the file is read alone, and the name decides (a block).
    assert [s.code for s in transform_source((pkg / "model.py").read_text()).sites] == ["RGZ001"]


def test_a_changed_module_is_read_again_in_the_same_process(tmp_path: Path) -> None:
    pkg = package(tmp_path / "lib", {"model.py": MODEL, "parts.py": LEAF_MIXER})
    assert codes(pkg / "model.py") == ["RGZ102"]
    (pkg / "parts.py").write_text(BLOCK_MIXER)
    os.utime(pkg / "parts.py", ns=(1, 1))  # a different stamp even on a coarse clock
    assert codes(pkg / "model.py") == ["RGZ001"]


def test_import_cycles_broken_modules_and_other_libraries_are_no_crash(tmp_path: Path) -> None:
    pkg = package(
        tmp_path / "lib",
        {
            "a.py": "from .b import B\nimport torch.nn as nn\nclass A(B):\n    pass\n",
            "b.py": "from .a import A\nimport torch.nn as nn\nclass B(nn.ModuleList):\n    pass\n",
            "broken.py": "class Mixer(:\n",
        },
    )
    find = Packages().lookup(pkg / "model.py")
    assert find(".b.B") == Definition(container="ModuleList", holds_submodules=None)
    assert find(".a.A") == Definition(container="ModuleList", holds_submodules=None)
    assert find(".broken.Mixer") is None
    assert find(".missing.Mixer") is None
    assert find("torch.nn.Linear") is None and find("....above.Top") is None
    assert Packages().lookup(tmp_path / "script.py")(".parts.Mixer") is None  # not in a package


def test_re_exports_are_followed_and_absolute_imports_of_the_package_too(tmp_path: Path) -> None:
    pkg = package(
        tmp_path / "lib",
        {
            "__init__.py": "from .layers import Mixer\n",
            "model.py": MODEL.replace("from .parts import Mixer", "from lib import Mixer"),
        },
    )
    (pkg / "layers").mkdir()
    (pkg / "layers" / "__init__.py").write_text("from .mixer import Mixer\n")
    (pkg / "layers" / "mixer.py").write_text(LEAF_MIXER)
    assert codes(pkg / "model.py") == ["RGZ102"]


def test_the_command_line_reads_the_package_of_each_file(tmp_path: Path) -> None:
    pkg = package(tmp_path / "lib", {"model.py": MODEL, "parts.py": BLOCK_MIXER.replace("Mixer", "Norm")})
    (pkg / "model.py").write_text(MODEL.replace("Mixer", "Norm"))
    result = CliRunner().invoke(main, [str(pkg / "model.py"), "--apply"])
    assert result.exit_code == 0, result.output
    assert "block.compile()" in (pkg / "model.py").read_text()  # named like a leaf, built like a block


STAGE = """

class Stage(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.blocks = nn.ModuleList([Mixer() for _ in range(n)])
"""
HOLDING_MIXER = BLOCK_MIXER + STAGE


def test_a_class_compiling_its_blocks_in_its_own_module_is_an_outer_level(tmp_path: Path) -> None:
    model = MODEL.replace("Mixer", "Stage")
    pkg = package(tmp_path / "lib", {"model.py": model, "parts.py": HOLDING_MIXER})
    assert codes(pkg / "model.py") == ["RGZ108"]  # Stage's Mixers are compiled in parts.py
    # The stage's blocks become leaves: nothing is compiled inside it, so the stages are the blocks.
    (pkg / "parts.py").write_text(HOLDING_MIXER.replace("nn.Linear(4, 4)", "nn.Parameter(torch.ones(4))"))
    os.utime(pkg / "parts.py", ns=(1, 1))
    assert codes(pkg / "model.py") == ["RGZ001"]


def test_holders_found_through_an_import_cycle_end(tmp_path: Path) -> None:
    # parts.py repeats model.py's Net, model.py repeats parts.py's Stage: each search meets the other.
    model = MODEL.replace("Mixer", "Stage")
    parts = HOLDING_MIXER + "\n\nfrom .model import Net\n\n\nclass Nets(nn.Module):\n"
    parts += "    def __init__(self):\n        super().__init__()\n"
    parts += "        self.nets = nn.ModuleList([Net(2) for _ in range(2)])\n"
    pkg = package(tmp_path / "lib", {"model.py": model, "parts.py": parts})
    assert codes(pkg / "model.py") == ["RGZ108"]
    assert codes(pkg / "parts.py") == ["RGZ001", "RGZ108"]  # Mixers compiled; Net holds compiled Stages


def test_a_fixture_named_file_is_read_in_its_folders_package(tmp_path: Path) -> None:
    # `model.in.py` is no module name, but its relative imports still mean its folder's package.
    pkg = package(tmp_path / "lib", {"model.in.py": MODEL, "parts.py": LEAF_MIXER})
    assert codes(pkg / "model.in.py") == ["RGZ102"]


FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "package_imports"


def test_an_apply_judges_every_file_on_its_package_before_writing_any(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # parts.py's clone helper is rewritten too (it then returns a name, no longer the copies): a run that
    # judged model.in.py after writing parts.py left its line 13 alone, depending on the order or timing.
    files = sorted(p.name for p in FIXTURE.iterdir() if p.suffix == ".py")
    runs = {
        "one_job": ["-j", "1", "."],
        "two_jobs": ["-j", "2", "."],
        "parts_first": ["-j", "1", "parts.py", *(f for f in files if f != "parts.py")],
    }
    results = {}
    for name, args in runs.items():
        shutil.copytree(FIXTURE, tmp_path / name)  # a package named `name`
        monkeypatch.chdir(tmp_path / name)
        pending = CliRunner().invoke(main, ["--check", *args])
        assert pending.exit_code == 1, pending.output
        result = CliRunner().invoke(main, ["--apply", *args])
        assert result.exit_code == 0, result.output
        # The dry run judges as the run that writes: the same lines, but the summary's "would change".
        assert result.output.splitlines()[:-1] == pending.output.splitlines()[:-1]
        assert "7 would change, 15 sites to rewrite" in pending.output
        assert "7 changed, 15 sites rewritten" in result.output
        tree = {p.name: p.read_bytes() for p in sorted(Path().iterdir()) if p.is_file()}
        again = CliRunner().invoke(main, ["--check", *args])  # a second run changes nothing
        assert again.exit_code == 0, again.output
        assert "0 would change" in again.output
        results[name] = (tree, sorted(result.output.replace("./", "").splitlines()))
    assert results["one_job"][0]["model.in.py"] == (FIXTURE / "model.out.py").read_bytes()
    assert results["two_jobs"] == results["one_job"]
    assert results["parts_first"] == results["one_job"]
