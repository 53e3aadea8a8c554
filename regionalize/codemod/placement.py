"""The lines a rewrite adds outside its sites: the runtime it calls (`import regionalize`, or a vendored
copy's import or inline copy) after the imports, and `import torch` where isort puts it; with the site
line of a file moved from a vendored copy to the import form (RGZ005)."""

from __future__ import annotations

import ast

from regionalize.codemod import import_form, parse_spans, runtime_copy, vendored_legacy
from regionalize.shared import helpers
from regionalize.shared.options import Options
from regionalize.shared.sites import Site

_MOVED = "RGZ005"

Added = tuple[str, runtime_copy.Placed | None, Site | None]


def add_helpers(
    code: str,
    tree: ast.Module,
    lines: list[str],
    first_changed: int,
    torch_line: bool,
    path: str | None,
    options: Options,
) -> Added:
    """`code` (the containers compiled) with the lines it needs, `import torch` with `torch_line`. `tree`
    is the tree of `lines`, the text before the containers' pass, whose positions still hold above line
    `first_changed` (0: none changed); module-level sites (one piece from line 1) parse the text again."""
    torch_at, helper_at = parse_spans.insert_lines(tree)
    changed_above = bool(first_changed and first_changed <= helper_at)
    if changed_above:
        torch_at, helper_at = parse_spans.insert_lines(ast.parse(code))
    plain = not (options.vendor or changed_above) and helpers.PREFIX in code
    if plain and vendored_legacy.remove(code, path)[1] is None:
        public = _public(code, tree, lines, first_changed, torch_at if torch_line else None)
        if public is not None:
            return public
    if torch_line:
        code = import_form.insert_line(code, torch_at, "import torch")
    # The vendored names the file calls must be ours to convert: a file that binds one itself (a runtime
    # copy, a helper of the user's) is left as it is (RGZ113).
    called = {name for name in import_form.PUBLIC if name in code}
    if options.vendor:
        if runtime_copy.vendor_import_line(code) is None:  # a copy of an earlier release gives way
            code, _ = vendored_legacy.remove(code, path)
        code, imports = _vendored(import_form.to_public(code)[0], path)
        folder = runtime_copy.folder_for(path) if imports else None
        binds = frozenset({import_form.NAME} if imports else ()) | called
        return code, runtime_copy.Placed(code, folder, binds), None
    if helpers.PREFIX not in code and runtime_copy.vendor_import_line(code) is None:
        return code, None, None
    code, removed = vendored_legacy.remove(code, path)
    code, imports = import_form.place(*import_form.to_public(code))
    placed = runtime_copy.Placed(code, binds=frozenset({import_form.NAME} if imports else ()) | called)
    if removed is None:
        return code, placed, None
    reason = f"{removed.text} replaced by `{import_form.IMPORT}`"
    if removed.copy:
        reason += "; the copy is left as it is: delete it once no file imports it"
    return code, placed, Site(removed.line, 1, _MOVED, "the vendored runtime", "", "rewrite", reason)


def _vendored(code: str, path: str | None) -> tuple[str, bool]:
    """The import form's `code` with the copy's import (`runtime_copy.vendor_import`) after its imports in
    place of `import regionalize`, or without it where nothing calls the API; and whether it imports it."""
    code = import_form.drop_line(code)
    calls, written = import_form.holds(code), runtime_copy.vendor_import_line(code)
    if calls and not written:
        at = parse_spans.insert_lines(ast.parse(code))[1]
        return import_form.insert_line(code, at, runtime_copy.vendor_import(path)), True
    if written and not calls and f"{import_form.NAME}." not in code:
        return code[: written.start()] + code[written.end() :], False
    return code, calls


def _public(
    code: str, tree: ast.Module, lines: list[str], first_changed: int, torch_at: int | None
) -> Added | None:
    """The import form of a file that holds no vendored copy, `import torch` (at `torch_at`) inserted
    last: the text above its first changed line and below its last is `tree`'s, and only the rest is
    parsed (`import_form.tree_from`). None where that text does not parse, for the general path."""
    named = code.find(helpers.PREFIX)
    first = min(line for line in (first_changed, code.count("\n", 0, named) + 1) if line)
    before = import_form.tree_from(code, tree, first, lines)
    if before is None:
        return None
    called = {name for name in import_form.PUBLIC if name in code}
    public, after = import_form.to_public(code, before)
    placed, imports = import_form.place(public, after)
    if torch_at is not None:
        # `import regionalize` inserted above it (where isort puts it) moves it down a line.
        inserted = placed.count("\n") > public.count("\n") and after is not None
        below = inserted and import_form.import_line(after) <= torch_at
        placed = import_form.insert_line(placed, torch_at + below, "import torch")
    binds = frozenset({import_form.NAME} if imports else ()) | called
    return placed, runtime_copy.Placed(placed, binds=binds), None
