"""What a class or a function of a file builds, read from its `ast`: whether a class holds submodules
(a block, or a leaf such as a norm), whether a function makes clones of a block (`_get_clones`), and which
classes a factory function returns (`get_down_block`). prescan.py asks these of every file's top-level
statements."""

from __future__ import annotations

import ast
from typing import Protocol

from regionalize.codemod.nodes import Walked, dotted_name, walk


class FileFacts(Protocol):
    """What these readers ask of a file's facts (`file_facts.FileFacts`, which prescan fills;
    prescan imports this module)."""

    def resolve(self, dotted: str) -> str: ...
    def holds(self, full: str) -> bool | None: ...
    def is_container(self, func: ast.expr) -> bool: ...
    def container_kind(self, name: str) -> str | None: ...


_NOT_MODULES = {"Parameter", "Buffer", "Tensor", "ParameterList", "ParameterDict"}


def holds_submodules(cls: ast.ClassDef, facts: FileFacts, walked: Walked) -> bool | None:
    """What the class builds, with what its bases defined earlier in the file build; a leaf only when
    it derives from torch.nn.Module directly (another base may build the parts)."""
    own = _builds_submodules(walked.under(cls))
    bases = [facts.resolve(n) for b in cls.bases if (n := dotted_name(b))]
    if own or any(facts.holds(b) for b in bases):
        return True
    if own is False and bases and all(b == "torch.nn.Module" for b in bases):
        return False
    return None


def _builds_submodules(nodes: list[ast.AST]) -> bool | None:
    """True when a method assigns `self.x = Something(..)` (a class, by its capital, not a tensor) or
    calls add_module; False when no attribute of self is assigned a call or a name at all (a norm with
    only parameters); None when functions build the parts (`self.conv = conv3x3(..)`) or a name is
    stored (`self.module = module`, maybe a block handed in): cannot tell."""
    calls = False
    for node in nodes:  # the class's, for both questions: true if either finds one
        if isinstance(node, ast.Call) and (dotted_name(node.func) or "").endswith("add_module"):
            return True
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if not any(isinstance(t, ast.Attribute) and dotted_name(t.value) == "self" for t in targets):
            continue
        if isinstance(node.value, ast.Name):
            calls = True  # `self.module = module`: a block may be handed in
        if isinstance(node.value, ast.Call):
            last = (dotted_name(node.value.func) or "").rsplit(".", 1)[-1]
            if last[:1].isupper() and last not in _NOT_MODULES:
                return True
            calls |= last not in _NOT_MODULES
    return None if calls else False


def makes_clones(function: ast.FunctionDef, facts: FileFacts, walked: Walked) -> bool:
    """`def _get_clones(module, n): return nn.ModuleList([copy.deepcopy(module) for _ in range(n)])`."""
    params = function.args.posonlyargs + function.args.args
    if not params:
        return False
    returned = [n.value for n in walked.under(function) if isinstance(n, ast.Return) and n.value is not None]
    return any(
        isinstance(value, ast.Call)
        and facts.is_container(value.func)
        and any(
            isinstance(n, ast.Call)
            and facts.resolve(dotted_name(n.func) or "") == "copy.deepcopy"
            and n.args
            and dotted_name(n.args[0]) == params[0].arg
            for n in walk(value)
        )
        for value in returned
    )


def returns_classes(function: ast.FunctionDef, facts: FileFacts, walked: Walked) -> tuple[str, ...] | None:
    """`get_down_block(..)`: the classes built by its returns, when each return builds a class by name
    (not a container: `_make_layer` returning `nn.Sequential(*layers)` is judged by what it holds)."""
    returns = sorted((n for n in walked.under(function) if isinstance(n, ast.Return)), key=lambda n: n.lineno)
    returned = [n.value for n in returns if n.value is not None]
    names: list[str] = []
    for value in returned:
        name = dotted_name(value.func) if isinstance(value, ast.Call) else None
        if name is None or not name.rsplit(".", 1)[-1][:1].isupper() or facts.container_kind(name):
            return None
        if (full := facts.resolve(name)) not in names:
            names.append(full)
    return tuple(names) or None
