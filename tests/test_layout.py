"""The package's layout (docs/design.md#layout): one folder per part, imports that run one way, no cycles,
and no module name used for two things. Read with `ast` from the source, imports inside functions too."""

from __future__ import annotations

import ast
import re
import sys
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "regionalize"
TOP = "regionalize"  # the package's own `__init__.py`: its version, and nothing it imports
PARTS = ("shared", "codemod", "runner", "cli", "runtime", "bench", "verify", "workarounds")
# What each part may import, besides itself and `regionalize` (the version). The command line may import
# anything, as may `python -m regionalize`.
MAY_IMPORT = {
    "shared": set(),
    "codemod": {"shared"},
    "runner": {"shared", "codemod"},
    "bench": {"shared", "codemod", "runtime"},
    "verify": {"shared", "codemod", "runtime", "bench"},
    "workarounds": {"runtime"},
    "cli": set(PARTS),
    "__main__": set(PARTS),
}
# The codemod's finders, layer by layer: a module imports only from the layers before its own.
FINDER_LAYERS = (
    {"model", "ints"},
    {"context"},
    {"judgement", "emit"},
    {"triage"},
    {"containers", "loops", "extend"},
)
CODEMOD_TOP = {"regionalize.codemod", "regionalize.codemod.transform"}
FINDERS = "regionalize.codemod.patterns"


def _modules() -> dict[str, Path]:
    """Every module of the package by its dotted name; a package by its own (`regionalize.cli`)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path, typing: bool = True) -> set[str]:
    """Every module `name` imports, absolute or relative, anywhere in it: `from a import b` counts as an
    import of `a.b` when that is a module of the package, else of `a`. Without `typing`, the imports under
    `if TYPE_CHECKING:` are left out: they never run, so they make no cycle."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    typed = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for inner in ast.walk(node)
    }
    for node in ast.walk(tree):
        if not typing and id(node) in typed:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join([*base, module] if module else base)
            found.update(
                f"{module}.{alias.name}" if f"{module}.{alias.name}" in MODULES else module
                for alias in node.names
            )
    return found


IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}
# The package's own modules each imports: the graph the checks below walk.
GRAPH = {
    name: {m for m in imported if m == TOP or m.startswith(TOP + ".")} for name, imported in IMPORTS.items()
}
# The same, of the imports that run: the graph whose cycles are checked.
RUN_GRAPH = {
    name: {m for m in _imports(name, path, typing=False) if m == TOP or m.startswith(TOP + ".")}
    for name, path in MODULES.items()
}


def _part(name: str) -> str:
    return "" if name == TOP else name.split(".")[1]


def test_every_module_is_in_a_part_and_every_folder_is_a_package() -> None:
    """A package folder (with its `__init__.py`) is what `packages.find` in pyproject.toml ships."""
    assert {_part(name) for name in MODULES} == {"", "__main__", *PARTS}
    folders = {path.parent for path in MODULES.values()}
    assert all((folder / "__init__.py").is_file() for folder in folders), folders


def test_every_import_of_the_package_names_one_of_its_modules() -> None:
    unknown = {(name, m) for name, imported in GRAPH.items() for m in imported if m not in MODULES}
    assert not unknown


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module, or one importing itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles() -> None:
    assert not _cycles(RUN_GRAPH)


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}, "e": {"a"}}) == [["a", "b", "c"], ["d"]]


def test_each_part_imports_only_the_parts_it_may() -> None:
    wrong = sorted(
        (name, m)
        for name, imported in GRAPH.items()
        for m in imported
        if _part(name) not in ("", "runtime")
        and m != TOP
        and _part(m) not in {_part(name), *MAY_IMPORT[_part(name)]}
    )
    assert not wrong


def test_the_runtime_needs_torch_alone() -> None:
    """It is copied into users' packages: no other module of regionalize, nothing but torch installed."""
    runtime = {name: imported for name, imported in IMPORTS.items() if _part(name) == "runtime"}
    assert runtime
    wrong = sorted(
        (name, m)
        for name, imported in runtime.items()
        for m in imported
        if not m.startswith("regionalize.runtime.")
        and m.split(".")[0] not in {"torch", *sys.stdlib_module_names}
    )
    assert not wrong


def test_the_codemods_lower_modules_never_import_its_finders_or_its_top() -> None:
    lower = [
        name
        for name in MODULES
        if _part(name) == "codemod" and name not in CODEMOD_TOP and not name.startswith(FINDERS)
    ]
    assert "regionalize.codemod.prescan" in lower
    wrong = sorted(
        (name, m) for name in lower for m in GRAPH[name] if m in CODEMOD_TOP or m.startswith(FINDERS)
    )
    assert not wrong


def test_the_finders_import_only_the_layers_before_their_own() -> None:
    layer_of = {f"{FINDERS}.{module}": n for n, layer in enumerate(FINDER_LAYERS) for module in layer}
    finders = {name for name in MODULES if name.startswith(FINDERS + ".")}
    assert finders == set(layer_of), "a new finder module needs its place in FINDER_LAYERS"
    wrong = sorted(
        (name, m)
        for name in finders
        for m in GRAPH[name]
        if m in CODEMOD_TOP
        or (m.startswith(FINDERS) and layer_of.get(m, len(FINDER_LAYERS)) >= layer_of[name])
    )
    assert not wrong


def test_no_two_modules_share_a_name() -> None:
    """A name says one thing: no module or package is named as another anywhere in the package."""
    names = Counter(name.rpartition(".")[2] for name in MODULES if name != TOP)
    assert not [name for name, count in names.items() if count > 1]


def test_only_the_runtimes_internals_module_names_torchs_private_names() -> None:
    """torch's private names (`torch._dynamo`, `torch.utils._pytree`, `torch._C._dynamo`, ...) are reached
    through `regionalize/runtime/internals/` alone, so that a torch that moves one breaks one module.
    Its docstrings and comments count too: a name quoted there is one a reader would look for there."""
    private = re.compile(r"torch\._|utils\._|_C\._")
    named = sorted(
        f"{name}:{number}"
        for name, path in MODULES.items()
        if _part(name) == "runtime" and not name.startswith("regionalize.runtime.internals")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if private.search(line)
    )
    assert not named
    door = PACKAGE / "runtime" / "internals"
    assert any(private.search(p.read_text(encoding="utf-8")) for p in door.glob("*.py"))


def test_the_scripts_measure_with_the_bench_part_not_the_verifiers_modules() -> None:
    """scripts/ times models through regionalize.bench; of verify it may call the command's entry points
    (`regionalize.verify.run_verify`), not the modules behind them."""
    scripts = PACKAGE.parent / "scripts"
    imported = {
        (path.name, module)
        for path in sorted(scripts.rglob("*.py"))
        for module in _imports(f"scripts.{path.stem}", path)
        if module.startswith(TOP + ".")
    }
    assert any(module.startswith("regionalize.bench.") for _, module in imported)
    wrong = sorted((name, module) for name, module in imported if module.startswith("regionalize.verify."))
    assert not wrong
