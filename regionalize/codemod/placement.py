"""The lines a rewrite adds outside its sites: the one that binds the API its calls name (`import
regionalize`, or with `--vendor` the import of the runtime copy) after the imports, and `import torch`
where isort puts it; an earlier release's copy taken out, with the site line of a file moved from a
vendored copy to the import form (RGZ005)."""

from __future__ import annotations

import ast
from pathlib import Path

from regionalize.codemod import import_form, legacy_calls, parse_spans, runtime_copy, vendored_legacy
from regionalize.codemod.runtime_copy import Placed
from regionalize.shared import helpers
from regionalize.shared.options import Options
from regionalize.shared.sites import Site

_MOVED = "RGZ005"

Added = tuple[str, Placed | None, Site | None]


def add_helpers(
    code: str,
    tree: ast.Module,
    first_changed: int,
    torch_line: bool,
    path: str | None,
    options: Options,
    legacy: frozenset[str] = frozenset(),
) -> Added:
    """`code` (the containers compiled, calling the public API) with the lines it needs, `import torch`
    with `torch_line`. `tree` is the tree of the text before the containers' pass, whose positions still
    hold above line `first_changed` (0: none changed); module-level sites (one piece from line 1) parse
    the text again. `legacy`: the helpers of an earlier release the file named (`legacy_calls.py`)."""
    torch_at, helper_at = parse_spans.insert_lines(tree)
    if first_changed and first_changed <= helper_at:
        tree = ast.parse(code)
        torch_at, helper_at = parse_spans.insert_lines(tree)
    # The helper names an earlier release wrote, and those the calls stand for, must be ours: a file that
    # binds one itself (a runtime copy, a helper of the user's) is left as it is (RGZ113).
    called = legacy | {name for name in helpers.PUBLIC if helpers.public(name) in code}
    removed = None
    if _VENDORED in code and not (options.vendor and runtime_copy.vendor_import_line(code)):
        code, removed = vendored_legacy.remove(code, path)  # the copy gives way to the form asked for
    if legacy:
        code = legacy_calls.collapse(code)
    if options.vendor or removed is not None or legacy:
        if torch_line:  # the text is parsed again below: `import torch` first
            code = import_form.insert_line(code, torch_at, "import torch")
        tree = ast.parse(code)
    if options.vendor:
        code, imports = _vendored(code, tree, path)
        folder = runtime_copy.folder_for(path) if imports else None
        return code, _placed(code, imports, called, folder), None
    # A line `import regionalize` of the user's that nothing calls through stays: placed only with calls.
    placed, imports = import_form.place(code, tree) if import_form.holds(code) else (code, False)
    if torch_line and not (removed is not None or legacy):
        # `import regionalize` inserted above it (where isort puts it) moves it down a line.
        below = placed.count("\n") > code.count("\n") and import_form.import_line(tree) <= torch_at
        placed = import_form.insert_line(placed, torch_at + below, "import torch")
    return placed, _placed(placed, imports, called), _moved(removed)


_VENDORED = "_regionalize"  # in every copy's import, inline copy and helper name; not in the API's calls


def _placed(code: str, imports: bool, called: frozenset[str], folder: Path | None = None) -> Placed | None:
    binds = frozenset({helpers.MODULE} if imports else ()) | called
    return runtime_copy.Placed(code, folder, binds) if binds else None


def _moved(removed: vendored_legacy.Removed | None) -> Site | None:
    """The site line of a file whose vendored copy gave way to `import regionalize` (RGZ005)."""
    if removed is None:
        return None
    reason = f"{removed.text} replaced by `{import_form.IMPORT}`"
    if removed.copy:
        reason += "; the copy is left as it is: delete it once no file imports it"
    return Site(removed.line, 1, _MOVED, "the vendored runtime", "", "rewrite", reason)


def _vendored(code: str, tree: ast.Module, path: str | None) -> tuple[str, bool]:
    """`code` with the copy's import (`runtime_copy.vendor_import`) after its imports in place of the
    import form's `import regionalize`, or without it where nothing calls the API; and whether it imports
    it. `tree` is `code`'s."""
    dropped = import_form.drop_line(code)
    if dropped != code:
        code, tree = dropped, ast.parse(dropped)
    calls, written = import_form.holds(code), runtime_copy.vendor_import_line(code)
    if calls and not written:
        at = parse_spans.insert_lines(tree)[1]
        return import_form.insert_line(code, at, runtime_copy.vendor_import(path)), True
    if written and not calls and f"{helpers.MODULE}." not in code:
        return code[: written.start()] + code[written.end() :], False
    return code, calls
