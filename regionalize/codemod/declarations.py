"""The repeated blocks a model library declares on its model classes, read with `ast`.

- diffusers' `_repeated_blocks`: what its `compile_repeated_blocks()` compiles. A package that uses it
  declares every block it wants compiled, so the declaration holds for the whole package.
- transformers' `_no_split_modules`: what accelerate keeps on one device. Usually the decoder or encoder
  layer, sometimes a stage that repeats layers (Swin) or a part of a layer (ResNet's conv layer). One
  modeling file per model, so it holds for the classes of that file inside the declaring model.

A class named in either is a block, whatever its name. A block class named in neither, inside a model
that declares, is compiled only for a reason the codemod can state: it is repeated inside a declared
class (a finer level of it). Otherwise the site is skipped (RGZ111) and says which declaration.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass

from regionalize.codemod.nodes import Walked

ATTRIBUTES = ("_repeated_blocks", "_no_split_modules")


@dataclass(frozen=True)
class Declaration:
    model: str  # the class that declares
    attribute: str  # one of ATTRIBUTES
    blocks: tuple[str, ...]  # class names, as written

    def __str__(self) -> str:
        return f"{self.model}.{self.attribute} = {list(self.blocks)}"


def read(tree: ast.Module) -> list[Declaration]:
    """The declarations of the file's top-level classes: a list or tuple of class-name strings. An empty
    list, `None` or a computed value declares nothing that can be read."""
    found = []
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for statement in cls.body:
            target, value = _assigned(statement)
            if target not in ATTRIBUTES or not isinstance(value, (ast.List, ast.Tuple)):
                continue
            names = [e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if names and len(names) == len(value.elts):
                found.append(Declaration(cls.name, target, tuple(names)))
    return found


def inside(tree: ast.Module, models: Iterable[str], walked: Walked | None = None) -> set[str]:
    """The file's classes inside the given models: the models, their subclasses, and every class one of
    those builds (in any method, or through a function of the file that returns it), transitively."""
    classes = {c.name: c for c in tree.body if isinstance(c, ast.ClassDef)}
    functions = {f.name: f for f in tree.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    bases = {c: {_last(b) for b in node.bases} for c, node in classes.items()}
    calls = _Calls(functions, walked or Walked(tree))
    reached = {m for m in models if m in classes}
    todo = list(reached)
    while todo:
        name = todo.pop()
        built = calls.through(classes[name])
        built |= {c for c, names in bases.items() if name in names}
        for other in built & classes.keys() - reached:
            reached.add(other)
            todo.append(other)
    return reached


class _Calls:
    """Last names of what a class or function calls; each walked once, though many classes call the
    same functions of the file (its walks were a twentieth of a bulk run when repeated per class)."""

    def __init__(self, functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef], walked: Walked) -> None:
        self.functions = functions
        self.walked = walked
        self.direct: dict[ast.stmt, set[str]] = {}

    def through(self, node: ast.stmt) -> set[str]:
        """What `node` calls, through the file's functions it calls (once each)."""
        names: set[str] = set()
        seen: set[str] = set()
        todo = [node]
        while todo:
            for name in self._in(todo.pop()):
                names.add(name)
                if name in self.functions and name not in seen:
                    seen.add(name)
                    todo.append(self.functions[name])
        return names

    def _in(self, node: ast.stmt) -> set[str]:
        if node not in self.direct:
            self.direct[node] = {_last(n.func) for n in self.walked.under(node) if isinstance(n, ast.Call)}
        return self.direct[node]


def _assigned(statement: ast.stmt) -> tuple[str | None, ast.expr | None]:
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        target = statement.targets[0]
        return (target.id if isinstance(target, ast.Name) else None), statement.value
    if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
        return statement.target.id, statement.value
    return None, None


def _last(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""
