"""Names imported from the file's own package are judged by their definitions (`regionalize.package`)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from click.testing import CliRunner

from regionalize.cli import main
from regionalize.codemod import transform_source
from regionalize.package import Definition, Packages

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
