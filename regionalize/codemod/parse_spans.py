"""Which pieces of a file get a LibCST parse: the top-level functions and methods that can hold a site
(most of a model file holds none), and where module-level additions go. Read with Python's `ast`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from regionalize.codemod.nodes import Walked, any_within, split_lines


@dataclass(frozen=True)
class Span:
    """Lines `start`..`end` (1-based, inclusive), parsed on their own with `indent` taken off.

    Whitespace-only lines are left as they are both ways, so unchanged lines come back byte for byte.
    """

    start: int
    end: int
    indent: str = ""

    def extract(self, lines: list[str]) -> str:
        width = len(self.indent)
        return "".join(
            line if not line.strip() else line[width:] for line in lines[self.start - 1 : self.end]
        )

    def restore(self, text: str) -> str:
        if not self.indent:
            return text
        return "".join(line if not line.strip() else self.indent + line for line in split_lines(text))


def pieces(
    tree: ast.Module, lines: list[str], containers: set[str], walked: Walked | None = None
) -> list[Span]:
    """Top-level functions and methods that can hold a site; larger pieces when that is not clear-cut.

    Module-level code can hold a site whose parts sit in several statements (`xs = [..]`, then
    `nn.Sequential(*xs)`), and two statements on one line cannot be cut apart: both take the whole file.
    A class falls back to one piece when a site sits outside its methods or a method cannot be dedented.
    """
    return holding(tree, lines, _candidate_lines(walked or Walked(tree), containers))


def holding(tree: ast.Module, lines: list[str], marked: list[int]) -> list[Span]:
    """The pieces, cut as `pieces` cuts them, that hold the lines `marked` (sorted)."""
    found: list[Span] = []
    candidates = _Candidates(marked)
    for statement, start, end in _spans(tree.body):
        if start is None:
            return [Span(1, len(lines))]
        if not candidates.between(start, end):
            continue
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append(Span(start, end))
        elif isinstance(statement, ast.ClassDef):
            found += _methods(statement, lines, candidates) or [Span(start, end)]
        else:
            return [Span(1, len(lines))]
    return found


def _methods(cls: ast.ClassDef, lines: list[str], candidates: _Candidates) -> list[Span]:
    """One piece per method holding a candidate; empty when the class has to stay whole."""
    found = []
    for statement, start, end in _spans(cls.body):
        if start is None:
            return []
        if not candidates.between(start, end):
            continue
        if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return []
        indent = lines[statement.lineno - 1][: statement.col_offset]
        if indent.strip() or not all(
            line.startswith(indent) or not line.strip() for line in lines[start - 1 : end]
        ):
            return []  # a line inside (a string, a comment) sits left of the method's indentation
        found.append(Span(start, end, indent))
    return found


def statement(lines: list[str], start: tuple[int, int], end: tuple[int, int]) -> Span | None:
    """The statement at `start`..`end` (`ast` positions) as a piece, where it has its lines to itself and
    every line of it starts with its indentation; else None."""
    first, last = lines[start[0] - 1], lines[end[0] - 1]
    indent = first.encode("utf-8")[: start[1]].decode("utf-8")
    after = last.encode("utf-8")[end[1] :].decode("utf-8").strip()
    if indent.strip() or (after and not after.startswith("#")):
        return None
    if not all(line.startswith(indent) or not line.strip() for line in lines[start[0] - 1 : end[0]]):
        return None
    return Span(start[0], end[0], indent)


def _spans(body: list[ast.stmt]) -> Iterator[tuple[ast.stmt, int | None, int]]:
    """Each statement with its first line (decorators included) and last line; None when two share a line."""
    previous_end = 0
    for statement in body:
        start = min([statement.lineno] + [d.lineno for d in getattr(statement, "decorator_list", [])])
        end = statement.end_lineno or statement.lineno
        yield statement, (start if start > previous_end else None), end
        previous_end = end


def _candidate_lines(walked: Walked, containers: set[str]) -> list[int]:
    """The lines of the calls that can make a site, from one walk of the file, sorted."""
    return sorted(
        node.lineno for node in walked.nodes if isinstance(node, ast.Call) and _is_candidate(node, containers)
    )


class _Candidates:
    """The marked lines (where a site can be, or an edit is) and the statements that hold them.

    A statement holds one when one sits within its lines. Where no two statements of a body share a
    line, a line within a statement's lines is inside it; where two do, the whole file (or class) is
    one piece whatever the answers were. Walking each statement, then each method of a class again,
    was a twelfth of a bulk run.
    """

    def __init__(self, lines: list[int]) -> None:
        self.lines = lines

    def between(self, start: int, end: int) -> bool:
        return any_within(self.lines, start, end)


def _is_candidate(call: ast.Call, containers: set[str]) -> bool:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name in containers or name == "add_module" or (name or "").endswith("clones")


def insert_lines(tree: ast.Module) -> tuple[int, int]:
    """Where `import torch` and module-level helpers go, as counts of lines above them.

    `import torch` goes before the first torch import (where isort puts it), else after the leading
    docstring, `__future__` and imports; helpers go after those imports.
    """
    after_imports, torch_line = 0, None
    for index, statement in enumerate(tree.body):
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            names = (
                [a.name for a in statement.names] if isinstance(statement, ast.Import) else [statement.module]
            )
            if torch_line is None and any((n or "").split(".")[0] == "torch" for n in names):
                torch_line = statement.lineno - 1
            after_imports = statement.end_lineno or statement.lineno
        elif index == 0 and isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            after_imports = statement.end_lineno or statement.lineno
        else:
            break
    return (after_imports if torch_line is None else torch_line), after_imports
