"""The import form: what a rewrite writes by default. The file imports the installed regionalize and calls
its public API (`regionalize/runtime/api.py`), one import line a file, so that a fix reaches a rewritten
model by upgrading the package, not by running the codemod again.

The codemod's passes write the public calls themselves (`patterns/emit.py`, `int_edits.py`); this module
places the one line that binds `regionalize` where isort would put it, a line inserted in the text. LibCST's
`AddImportsVisitor` would do it on a tree of the whole file, which the passes never build (they parse only
the pieces that hold sites): measured on every third `modeling_*.py` of transformers 5.23's models (177
files, 161 rewritten; 2-core x86_64, Python 3.11, libcst's native parser, a loaded box), the rewrites took
8.5 s of CPU and `parse_module` with `AddImportsVisitor` over their output 139 s more. `legacy_calls.py`
reads the calls an earlier release wrote.
"""

from __future__ import annotations

import ast
import re
import sys

from regionalize.codemod import parse_spans
from regionalize.codemod.nodes import split_lines
from regionalize.shared import helpers

NAME = helpers.MODULE  # the module name the import form binds in a rewritten file
IMPORT = f"import {NAME}"
_IMPORT_LINE = re.compile(rf"^{IMPORT}[ \t]*\r?\n", re.M)
_PUBLIC_CALL = re.compile(rf"\b{NAME}\.(?:{'|'.join(helpers.PUBLIC.values())})\b")


def holds(code: str) -> bool:
    """Does `code` call the public API as the import form writes it? (A string test: most files do not.)"""
    return f"{NAME}." in code and _PUBLIC_CALL.search(code) is not None


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
