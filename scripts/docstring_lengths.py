"""Lists the docstrings that are longer than the code they document, and exits 1 if there are any.

A function's or class's docstring is compared with the code lines of its body; a module's docstring with
the module's code lines, and a package's (its `__init__.py`) with the code lines of every module in its
folder. Code lines leave out docstrings, comments and blank lines; a one-line docstring always passes.

    python scripts/docstring_lengths.py [PATH ...]   # default: regionalize/runtime
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "regionalize" / "runtime"
_NOT_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}
_Documented = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class Docstring:
    """One docstring, where it is, and the length of it and of the code it documents."""

    path: Path
    line: int
    name: str
    lines: int
    code: int

    @property
    def too_long(self) -> bool:
        """One line is always allowed: an exception class may have no code but its docstring."""
        return self.lines > max(self.code, 1)


def _docstring(node: _Documented) -> ast.Expr | None:
    first = node.body[0] if node.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        return first if isinstance(first.value.value, str) else None
    return None


def _span(node: ast.AST) -> range:
    return range(node.lineno, (node.end_lineno or node.lineno) + 1)


def _code_lines(text: str, tree: ast.Module) -> set[int]:
    """The numbers of the lines that hold code: a token that is not a comment, and not in a docstring."""
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in _NOT_CODE:
            lines.update(range(token.start[0], token.end[0] + 1))
    for node in ast.walk(tree):
        if isinstance(node, _Documented) and (doc := _docstring(node)) is not None:
            lines.difference_update(_span(doc))
    return lines


def docstrings(path: Path, package_code: int | None = None) -> list[Docstring]:
    """Every docstring in the file at `path`. `package_code` stands for the module's own code lines in a
    package's `__init__.py`."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text, str(path))
    code = _code_lines(text, tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, _Documented) or (doc := _docstring(node)) is None:
            continue
        if isinstance(node, ast.Module):
            name, body = "module", len(code) if package_code is None else package_code
        else:
            rest = node.body[1:]
            name = node.name
            body = len(code.intersection(range(rest[0].lineno, node.end_lineno + 1))) if rest else 0
        found.append(Docstring(path, doc.lineno, name, len(_span(doc)), body))
    return sorted(found, key=lambda d: d.line)


def _code_of(path: Path) -> int:
    text = path.read_text(encoding="utf-8")
    return len(_code_lines(text, ast.parse(text, str(path))))


def collect(paths: list[Path]) -> list[Docstring]:
    """Every docstring in the files at `paths`, and in the `.py` files under the folders among them."""
    files = sorted({f for p in paths for f in (sorted(p.rglob("*.py")) if p.is_dir() else [p])})
    found = []
    for path in files:
        package = None
        if path.name == "__init__.py":
            package = sum(_code_of(f) for f in path.parent.rglob("*.py"))
        found.extend(docstrings(path, package))
    return found


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or [DEFAULT]
    found = collect(paths)
    offenders = [d for d in found if d.too_long]
    for d in offenders:
        shown = d.path.relative_to(ROOT) if d.path.is_relative_to(ROOT) else d.path
        print(f"{shown}:{d.line}: {d.name}: {d.lines} docstring lines, {d.code} code lines")
    total = sum(d.lines for d in found)
    print(f"{len(offenders)} of {len(found)} docstrings longer than their code ({total} docstring lines)")
    return 1 if offenders else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
