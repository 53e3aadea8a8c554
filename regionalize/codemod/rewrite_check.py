"""Does a rewrite parse? The codemod refuses to hand out code that does not (a bug of ours).

Only the top-level statements the rewrite changed are compiled: those above and below them are the
original's, which parsed, and the lines placed between them (`import regionalize`, `import torch`) are
whole statements. Compiling whole rewritten files was a tenth of a bulk run over the transformers models,
where a rewrite changes a quarter of a file's lines.
"""

from __future__ import annotations

import ast
import warnings

from regionalize.codemod.nodes import split_lines

# Whole statements the placement inserts between two top-level statements.
_INSERTED = frozenset({"import regionalize", "import torch"})


def syntax_error(code: str, source: str, tree: ast.Module) -> str | None:
    """Why `code`, a rewrite of `source` (parsed as `tree`), does not parse, or None."""
    before, after = split_lines(source), split_lines(code)
    spans = spans_of(tree)
    _, end, first = _head(before, after, spans)
    kept = kept_tail(before, after, spans, end, first)
    last = spans[-kept][0] - 1 + len(after) - len(before) if kept else len(after)
    # Blank lines keep the line numbers a message may cite ("... on line 12").
    return _error("\n" * first + "".join(after[first:last]))


def kept_tail(
    before: list[str], after: list[str], spans: list[tuple[int, int]], above: int, below: int
) -> int:
    """How many of the last top-level statements of `before` (their lines: `spans`) `after` ends with as
    they were, none of them within the first `above` lines of `before` nor the first `below` of `after`."""
    same = 0  # lines at the end as they were
    while same < min(len(before) - above, len(after) - below) and before[-1 - same] == after[-1 - same]:
        same += 1
    return sum(1 for start, _ in spans if start > len(before) - same)


def spans_of(tree: ast.Module) -> list[tuple[int, int]]:
    """The first (a decorator's) and last line of each top-level statement."""
    return [(_first_line(statement), statement.end_lineno or statement.lineno) for statement in tree.body]


def _head(before: list[str], after: list[str], spans: list[tuple[int, int]]) -> tuple[int, int, int]:
    """How many top-level statements `after` starts with as `before` does, the line above the next one in
    `before`, and in `after`, with the lines inserted between them. A statement counts once the first
    line of the next is matched: lines added at the end of its body would be inside it."""
    i = j = 0  # lines of `before` and `after` matched
    inserted: list[int] = []  # below which line of `before` each inserted line sits
    while i < len(before) and j < len(after):
        if before[i] == after[j]:
            i, j = i + 1, j + 1
        elif after[j].rstrip("\r\n") in _INSERTED and not any(s <= i < e for s, e in spans):
            inserted.append(i)
            j += 1
        else:
            break
    head = 0
    while head + 1 < len(spans) and spans[head + 1][0] <= i:
        head += 1
    end = spans[head][0] - 1 if head else 0
    return head, end, end + sum(1 for line in inserted if line <= end)


def _first_line(statement: ast.stmt) -> int:
    return min([statement.lineno, *(d.lineno for d in getattr(statement, "decorator_list", ()))])


def _error(code: str) -> str | None:
    """Why `code` does not parse, or None. Compiled to bytecode first, which takes half the time of
    building an `ast` tree; what only the compiler refuses (a `return` outside a function, left as the
    user wrote it) is then asked of the parser."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the user's invalid escapes are not ours to report
            compile(code, "<rewrite>", "exec", dont_inherit=True)
        return None
    except (SyntaxError, ValueError):
        pass
    try:
        ast.parse(code)
    except SyntaxError as exc:
        return exc.msg
    return None
