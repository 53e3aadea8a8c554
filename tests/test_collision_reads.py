"""The name checks (RGZ113) skip the walks that could find nothing, and read the package's modules once per
version of them, yet find every collision: a name spelled otherwise than as Python reads it, a star import
under a module-level block, a top `__init__.py` that changes between two files."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from regionalize.codemod import collisions, runtime_copy

HELPERS = frozenset({"_regionalize_blocks"})
MODEL = (
    "import torch.nn as nn\n\n\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
)


def make(root: Path, files: dict[str, str]) -> Path:
    package = root / "mypkg"
    package.mkdir()
    for name, text in {"__init__.py": "", **files}.items():
        (package / name).write_text(text, encoding="utf-8")
    return package


def hint(package: Path, name: str) -> str | None:
    """Why the helpers cannot go into `name` of the package, as `transform_source` asks it."""
    path = package / name
    source = path.read_text(encoding="utf-8")
    placed = runtime_copy.Placed(source, package / f"{runtime_copy.MODULE}.py", HELPERS)
    found = collisions.clash(ast.parse(source), source, placed, str(path))
    return found.hint if found else None


@pytest.mark.parametrize(
    ("binding", "found"),
    [
        ("_regionalize_blocks = 1", True),
        ("_\uff52egionalize_blocks = 1", True),  # a fullwidth `r`: Python reads `_regionalize_blocks`
        ("_regionalize_\ufb01ne = 1", False),  # a ligature that decomposes into `fi`: another name
    ],
)
def test_a_name_is_found_however_it_is_spelled(tmp_path: Path, binding: str, found: bool) -> None:
    package = make(tmp_path, {"model.py": f"# caf\u00e9\n{MODEL}        {binding}\n"})
    expected = "`_regionalize_blocks` is already bound at line 8" if found else None
    assert hint(package, "model.py") == expected


@pytest.mark.parametrize(
    "star",
    [
        "from .utils import *\n",
        "try:\n    from .utils import *\nexcept ImportError:\n    pass\n",
        "if True:\n    with open(__file__):\n        from .utils import *\n",
    ],
)
def test_a_star_import_at_module_level_is_read_in_any_block(tmp_path: Path, star: str) -> None:
    utils = "__all__ = ['_regionalize_blocks']\n_regionalize_blocks = None\n"
    package = make(tmp_path, {"utils.py": utils, "model.py": star + MODEL})
    line = next(i for i, text in enumerate(star.splitlines(), 1) if "import *" in text)
    expected = f"`from .utils import *` (line {line}) may bring `_regionalize_blocks`"
    assert hint(package, "model.py") == expected


def test_the_top_init_is_walked_once_for_all_the_files_of_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {f"model{i}.py": MODEL for i in range(5)}
    package = make(tmp_path, {**files, "__init__.py": "from . import model0\n"})
    walked: list[ast.Module] = []
    binders = collisions._binders

    def counted(tree: ast.Module) -> Iterator[collisions.Binder]:
        walked.append(tree)
        return binders(tree)

    monkeypatch.setattr(collisions, "_binders", counted)
    assert [hint(package, name) for name in files] == [None] * 5
    assert len(walked) == 1  # the top `__init__.py`; the files hold none of the names

    (package / "__init__.py").write_text("from . import model0\n_regionalize = None\n")
    assert hint(package, "model1.py") == (
        f"`{package / '__init__.py'}` binds `_regionalize` (line 2), the runtime module's name"
    )
    assert len(walked) == 2
