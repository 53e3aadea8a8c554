"""The import form: what a rewrite writes by default. The file imports the installed regionalize and calls
its public API (`regionalize/runtime/api.py`), one import line a file, so that a fix reaches a rewritten
model by upgrading the package, not by running the codemod again.

The codemod's passes write and read the vendored form's calls (`_regionalize_blocks(block, self)`), the
runtime's own names, which a vendored copy (`runtime_copy.py`, `--vendor`) defines. This module converts
between the two at the edges of a run: a file in the import form is read as the vendored form's calls
(`to_internal`), and a rewrite that does not vendor is written back as public calls (`to_public`). The two
are each other's inverse, so a second run changes nothing either way. Both splice the text at the
positions `ast` gives (a LibCST pass over every rewritten file tripled the time of a zoo's run), and
keep every line where it was.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator

from regionalize.codemod import parse_spans, rewrite_check
from regionalize.codemod.nodes import any_within, split_lines
from regionalize.shared import helpers

NAME = "regionalize"  # the module name the import form binds in a rewritten file
IMPORT = f"import {NAME}"
# The runtime's helpers that emitted code calls, by the public name that serves the same call.
PUBLIC = helpers.PUBLIC
INTERNAL = {public: internal for internal, public in PUBLIC.items()}
# `_regionalize_blocks(block, owner, ...)`: the owner, positional in the vendored form, is a keyword here.
_OWNER = "owner"
_IMPORT_LINE = re.compile(rf"^{IMPORT}[ \t]*\r?\n", re.M)
_PUBLIC_CALL = re.compile(rf"\b{NAME}\.(?:{'|'.join(INTERNAL)})\b")


def holds(code: str) -> bool:
    """Does `code` call the public API as the import form writes it? (A string test: most files do not.)"""
    return f"{NAME}." in code and _PUBLIC_CALL.search(code) is not None


def to_internal(code: str) -> str:
    """`code` with its public calls written as the vendored form's, for the codemod's passes to read."""
    if not holds(code):
        return code
    tree = _parse(code)
    if tree is None:
        return code  # the codemod's own parse reports it
    lines = split_lines(code)
    edits: list[_Edit] = []
    looped: set[int] = set()  # the lines of calls written as loops
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in looped:
            continue
        if isinstance(node, ast.Expr) and (loop := _loop(lines, node.value)) is not None:
            edits.append(loop)
            looped.add(node.lineno)
            continue
        if isinstance(node, ast.Call) and _public_name(node.func) == helpers.BLOCKS:
            owner = node.keywords[0] if node.keywords else None
            if len(node.args) == 1 and owner is not None and owner.arg == _OWNER:
                start = _column(lines, owner.lineno, owner.col_offset)
                value = _column(lines, owner.value.lineno, owner.value.col_offset)
                if owner.lineno == owner.value.lineno and lines[owner.lineno - 1][start:value] == "owner=":
                    edits.append((owner.lineno, start, value, ""))  # as `to_public` wrote it
        internal = _public_name(node)
        if internal is not None and node.lineno == node.end_lineno:
            edits.append(_span(lines, node, internal))
    return _apply(lines, edits)


def to_public(code: str, tree: ast.Module | None = None) -> tuple[str, ast.Module | None]:
    """`code` with the vendored form's calls written as public ones (its copy taken out before), and its
    tree, whose leading docstring and imports keep their lines (None where nothing was converted): a loop
    made one call (`_collapsed`) lies below them. `tree`, where given, is `code`'s (`tree_from`)."""
    if not any(name in code for name in PUBLIC):
        return code, None
    tree = tree or _parse(code)
    if tree is None:
        return code, None
    lines = split_lines(code)
    collapsed: list[tuple[int, int, str]] = []
    inside: set[int] = set()  # the lines of loops made one call
    edits: list[_Edit] = []
    for node in _holding(tree, lines):  # breadth first: a loop comes before the nodes it holds
        if isinstance(node, ast.For) and (loop := _collapsed(lines, node)) is not None:
            collapsed.append(loop)
            inside.update(range(loop[0], loop[1] + 1))
            continue
        if isinstance(node, ast.Name) and node.id in PUBLIC and isinstance(node.ctx, ast.Load):
            if node.lineno not in inside:
                edits.append(_span(lines, node, f"{NAME}.{PUBLIC[node.id]}"))
            continue
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or node.lineno in inside:
            continue
        if node.func.id == helpers.BLOCKS and len(node.args) == 2:
            owner = node.args[1]
            if not isinstance(owner, ast.Starred):
                at = _column(lines, owner.lineno, owner.col_offset)
                edits.append((owner.lineno, at, at, f"{_OWNER}="))
    code = _apply(lines, edits)
    if not collapsed:
        return code, tree
    lines = split_lines(code)
    for first, last, text in sorted(collapsed, reverse=True):
        lines[first - 1 : last] = [text]
    return "".join(lines), tree


def _holding(tree: ast.Module, lines: list[str]) -> Iterator[ast.AST]:
    """The nodes `ast.walk` yields, less those whose lines name no vendored helper, nor their children:
    walking every node of a rewritten file was a sixth of a bulk run."""
    named = [number for number, line in enumerate(lines, 1) if helpers.PREFIX in line]
    level: list[ast.AST] = [tree]
    while level:
        yield from level
        below = []
        for node in level:
            for child in ast.iter_child_nodes(node):
                first = getattr(child, "lineno", None)
                if first is not None:  # a function's or class's decorators sit above it
                    first = min([first, *(d.lineno for d in getattr(child, "decorator_list", ()))])
                if first is None or any_within(named, first, getattr(child, "end_lineno", None) or first):
                    below.append(child)
        level = below


# One replacement: line (1-based), first and last column (characters), the new text.
_Edit = tuple[int, int, int, str]
_LOOP_VARIABLE = "block"


def _collapsed(lines: list[str], node: ast.For) -> tuple[int, int, str] | None:
    """A loop the codemod wrote, `for block in ITER: _regionalize_blocks(block, OWNER, ...)`, as one
    public call that takes the blocks: its first and last line, and the line that replaces them
    (`regionalize.compile_region(*ITER, owner=OWNER, ...)`). None for any other statement, and for a
    loop written other than on lines of its own or holding a comment, which the call would lose."""
    if not (
        isinstance(node.target, ast.Name)
        and not node.orelse
        and len(node.body) == 1
        and isinstance(call := node.body[0], ast.Expr)
        and isinstance(call := call.value, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id == helpers.BLOCKS
        and len(call.args) == 2
        and isinstance(call.args[0], ast.Name)
        and call.args[0].id == node.target.id
        and node.iter.lineno == node.iter.end_lineno
        and node.end_lineno is not None
    ):
        return None
    first, last = node.lineno, node.end_lineno
    head, tail = lines[first - 1], lines[last - 1]
    indent = _column(lines, first, node.col_offset)
    end = _column(lines, last, call.end_col_offset or 0)
    text = "".join(lines[first - 1 : last])
    if head[:indent].strip() or tail[end:].strip() or "#" in text or "\\" in text:
        return None
    name = node.target.id
    rest = [_text(lines, call.args[1])] + [_text(lines, k) for k in call.keywords]
    if None in rest or any(re.search(rf"\b{name}\b", part) for part in rest if part):
        return None  # a keyword written over lines, or one that reads the block
    iterable = _text(lines, node.iter)
    if iterable is None:
        return None
    if not isinstance(node.iter, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
        iterable = f"({iterable})"
    arguments = ", ".join([f"*{iterable}", f"{_OWNER}={rest[0]}", *rest[1:]])
    newline = tail[len(tail.rstrip("\r\n")) :]
    return first, last, f"{head[:indent]}{NAME}.{PUBLIC[helpers.BLOCKS]}({arguments}){newline}"


def _loop(lines: list[str], call: ast.expr) -> _Edit | None:
    """`regionalize.compile_region(*ITER, owner=OWNER, ...)`, a statement on a line of its own, as the
    loop `_collapsed` made it from, kept on that one line: `for block in ITER: _regionalize_blocks(block,
    OWNER, ...)`."""
    if not (
        isinstance(call, ast.Call)
        and _public_name(call.func) == helpers.BLOCKS
        and len(call.args) == 1
        and isinstance(starred := call.args[0], ast.Starred)
        and call.keywords
        and call.keywords[0].arg == _OWNER
        and call.lineno == call.end_lineno
    ):
        return None
    line = lines[call.lineno - 1]
    start, end = (
        _column(lines, call.lineno, call.col_offset),
        _column(lines, call.lineno, call.end_col_offset or 0),
    )
    if line[:start].strip() or line[end:].strip():
        return None  # a loop cannot follow `if x:` on its line, nor come before another statement
    owner, *rest = call.keywords
    parts = [_text(lines, starred.value), _text(lines, owner.value), *(_text(lines, k) for k in rest)]
    if None in parts:
        return None
    name = _LOOP_VARIABLE
    while any(re.search(rf"\b{name}\b", part or "") for part in parts):
        name += "_"
    iterable, *arguments = parts
    return (
        call.lineno,
        start,
        end,
        f"for {name} in {iterable}: {helpers.BLOCKS}({', '.join([name, *arguments])})",
    )


def _text(lines: list[str], node: ast.AST) -> str | None:
    """The source of `node`, where it is on one line."""
    if node.lineno != node.end_lineno:
        return None
    line = lines[node.lineno - 1]
    return line[
        _column(lines, node.lineno, node.col_offset) : _column(lines, node.lineno, node.end_col_offset)
    ]


def tree_from(code: str, before: ast.Module, first: int, lines: list[str]) -> ast.Module | None:
    """`code`'s tree, where `before` is the tree of `lines`, a text whose lines above line `first` `code`
    holds as they were: those statements taken from it, and only the text from the statement holding line
    `first` parsed, below blank lines that keep its line numbers, down to the statements `code` ends with
    as `lines` does, which are taken from `before` too, at their lines there (none names a helper, so
    `to_public` reads none of them). Parsing whole files was a sixth of a bulk run. None where `code`
    does not parse."""
    body = before.body
    kept = next((i for i, statement in enumerate(body) if (statement.end_lineno or 0) >= first), len(body))
    if kept == len(body):
        return _parse(code)
    spans = rewrite_check.spans_of(before)
    start = spans[kept][0]
    after = split_lines(code)
    named = code.rfind(helpers.PREFIX)  # the tail taken holds no helper's name
    below = max(start - 1, code.count("\n", 0, named) + 1 if named >= 0 else 0)
    tail = rewrite_check.kept_tail(lines, after, spans, start - 1, below)
    stop = spans[-tail][0] - 1 + len(after) - len(lines) if tail else len(after)
    parsed = _parse("\n" * (start - 1) + "".join(after[start - 1 : stop]))
    return (
        None
        if parsed is None
        else ast.Module(body=body[:kept] + parsed.body + body[len(body) - tail :], type_ignores=[])
    )


def _parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None


def _public_name(node: ast.AST) -> str | None:
    """The vendored name that `regionalize.<public>` stands for, where `node` is that."""
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Load)
        and isinstance(node.value, ast.Name)
        and node.value.id == NAME
        and node.attr in INTERNAL
    ):
        return INTERNAL[node.attr]
    return None


def _column(lines: list[str], line: int, offset: int) -> int:
    """`ast` counts a column in UTF-8 bytes; the text, in characters."""
    text = lines[line - 1]
    return offset if text.isascii() else len(text.encode("utf-8")[:offset].decode("utf-8"))


def _span(lines: list[str], node: ast.expr, text: str) -> _Edit:
    assert node.end_col_offset is not None
    start = _column(lines, node.lineno, node.col_offset)
    return node.lineno, start, _column(lines, node.lineno, node.end_col_offset), text


def _apply(lines: list[str], edits: list[_Edit]) -> str:
    for line, start, end, text in sorted(edits, reverse=True):
        lines[line - 1] = lines[line - 1][:start] + text + lines[line - 1][end:]
    return "".join(lines)


def place(code: str, tree: ast.Module | None = None) -> tuple[str, bool]:
    """`code` with `import regionalize` after its imports where it calls the public API and does not
    import it yet, or without the import written by an earlier run where it no longer calls it; and
    whether the file now imports it. `tree`, where given, is one whose statements hold `code`'s lines."""
    calls = holds(code)
    written = _IMPORT_LINE.search(code)
    if calls and not written:
        tree = tree or ast.parse(code)
        if not _imports(tree):
            return insert_line(code, import_line(tree), IMPORT), True
        return code, True
    if written and not calls and f"{NAME}." not in code:
        return code[: written.start()] + code[written.end() :], False
    return code, calls


def drop_line(code: str) -> str:
    """`code` without the `import regionalize` line the import form writes, where it holds one."""
    written = _IMPORT_LINE.search(code) if IMPORT in code else None
    return code if written is None else code[: written.start()] + code[written.end() :]


def import_line(tree: ast.Module) -> int:
    """Where isort's default order puts `import regionalize` (a third-party module), as a count of lines
    above it: among the leading imports of other packages, plain imports sorted first, then `from`
    imports; with none, after the standard library's, before the package's own relative imports."""
    after_imports = parse_spans.insert_lines(tree)[1]
    last_absolute = None
    for statement in tree.body:
        if not isinstance(statement, (ast.Import, ast.ImportFrom)):
            if last_absolute is None and statement is tree.body[0]:
                continue  # the docstring
            break
        if isinstance(statement, ast.ImportFrom) and statement.level:
            return last_absolute if last_absolute is not None else statement.lineno - 1
        top = statement.names[0].name if isinstance(statement, ast.Import) else statement.module or ""
        top = top.split(".")[0]
        if top in sys.stdlib_module_names or top == "__future__":
            last_absolute = statement.end_lineno or statement.lineno
            continue
        if isinstance(statement, ast.ImportFrom) or top.lower() > NAME:
            return statement.lineno - 1
        last_absolute = statement.end_lineno or statement.lineno
    return last_absolute if last_absolute is not None else after_imports


def insert_line(code: str, at: int, text: str) -> str:
    """`code` with the line `text` inserted after its first `at` lines, ending as its lines end."""
    newline = "\r\n" if "\r\n" in code else "\n"
    lines = split_lines(code)
    lines[at:at] = [f"{text}{newline}"]
    return "".join(lines)


def _imports(tree: ast.Module) -> bool:
    """Does the module import regionalize itself, at module level, in a line the user wrote?"""
    return any(
        isinstance(node, ast.Import) and any(a.name == NAME and a.asname is None for a in node.names)
        for node in tree.body
    )
