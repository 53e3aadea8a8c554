"""The rewrite check (`codemod/rewrite_check.py`) compiles only the statements a rewrite changed: its answer
is the one a compile of the whole rewritten file gives."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from regionalize.codemod.rewrite_check import syntax_error

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
PAIRS = sorted(
    p for p in FIXTURES.glob("**/*.in.py") if p.with_name(p.name[: -len(".in.py")] + ".out.py").exists()
)

SOURCE = '''"""A model."""
import os

import torch.nn as nn


def helper(x):
    return x


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(n)])


def tail(x):
    return [x,
            x]
'''


def _whole(code: str) -> str | None:
    try:
        ast.parse(code)
    except SyntaxError as exc:
        return exc.msg
    return None


def _check(code: str, source: str = SOURCE) -> str | None:
    found = syntax_error(code, source, ast.parse(source))
    assert found == _whole(code)
    return found


def test_a_rewrite_with_imports_placed_parses() -> None:
    code = SOURCE.replace("import os\n", "import os\n\nimport regionalize\nimport torch\n").replace(
        "range(n)])\n", "range(n)])\n        for block in self.layers:\n            block.compile()\n"
    )
    assert _check(code) is None


def test_lines_added_to_the_last_statement_are_compiled() -> None:
    """Lines added below a statement's last line, indented, belong to it: the statement is compiled."""
    assert _check(SOURCE + "        x = 1\n") == "unexpected indent"
    assert _check(SOURCE.replace("            x]\n", "            x]\n    y = (\n")) == "'(' was never closed"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("range(n)])\n", "range(n)]\n"),  # a bracket left open in the changed statement
        ("range(n)])\n", "range(n)])\n      block.compile()\n"),  # a line at no indentation of the body
        ("import os\n", "import os\n    import regionalize\n"),  # an inserted line, indented
        ("        super()", "import torch\n        super()"),  # a line inside a statement
        ("def helper(x):\n", "def helper(x):\nimport regionalize\n"),
    ],
)
def test_a_broken_rewrite_is_caught_as_a_whole_compile_catches_it(old: str, new: str) -> None:
    assert _check(SOURCE.replace(old, new, 1)) is not None


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_fixture_rewrite_parses_and_a_broken_one_does_not(pair: Path) -> None:
    source = pair.read_text()
    code = pair.with_name(pair.name[: -len(".in.py")] + ".out.py").read_text()
    try:
        ast.parse(source)
    except SyntaxError:
        return  # a case of a file the codemod cannot read
    assert _check(code, source) is None
    changed = next(
        (
            n
            for n, (a, b) in enumerate(zip(source.splitlines(True), code.splitlines(True), strict=False))
            if a != b
        ),
        None,
    )
    if changed is not None:
        lines = code.splitlines(True)
        lines.insert(changed + 1, "(\n")
        _check("".join(lines), source)
