"""The codemod's LibCST dispatch (`nodes.FastDispatch`) visits as LibCST's own does."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

import regionalize.codemod
from regionalize.codemod.nodes import FastDispatch, Positioned, read, split_lines

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SOURCE = """
class Net(nn.Module):
    def __init__(self, n):
        self.layers = nn.ModuleList([Block(i) for i in range(n)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x, scale=[1, 2][0])
        return x
"""


class _Plain(cst.CSTVisitor):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def visit_Name(self, node: cst.Name) -> None:
        self.seen.append(f"name {node.value}")

    def visit_Subscript(self, node: cst.Subscript) -> bool:
        self.seen.append("subscript")
        return False  # its children are not visited

    def leave_Call(self, original_node: cst.Call) -> None:
        self.seen.append("left call")


class _Fast(FastDispatch, _Plain):
    pass


class _Renamer(cst.CSTTransformer):
    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        return (
            updated_node.with_changes(value=updated_node.value.upper())
            if updated_node.value == "x"
            else updated_node
        )


class _FastRenamer(FastDispatch, _Renamer):
    pass


def test_a_visitor_sees_what_libcst_shows_it() -> None:
    module = cst.parse_module(SOURCE)
    plain, fast = _Plain(), _Fast()
    module.visit(plain)
    module.visit(fast)
    assert fast.seen == plain.seen
    assert "subscript" in fast.seen and "name self" in fast.seen


def test_a_transformer_writes_what_libcst_writes() -> None:
    module = cst.parse_module(SOURCE)
    assert module.visit(_FastRenamer()).code == module.visit(_Renamer()).code
    assert "X = layer(X" in module.visit(_FastRenamer()).code


class _Positions(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, int, int, int]] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        span = self.get_metadata(PositionProvider, node)
        self.seen.append(
            (type(node).__name__, span.start.line, span.start.column, span.end.line, span.end.column)
        )
        return True


def test_a_positioned_tree_has_libcst_positions() -> None:
    """`Positioned` resolves the positions on their own, and any other provider as LibCST does."""
    plain, fast = _Positions(), _Positions()
    MetadataWrapper(cst.parse_module(SOURCE)).visit(plain)
    positioned = Positioned(cst.parse_module(SOURCE))
    positioned.visit(fast)
    positioned.visit(again := _Positions())  # resolved once, served again
    assert fast.seen == plain.seen == again.seen and len(plain.seen) > 50
    parents = positioned.resolve(ParentNodeProvider)
    assert parents[positioned.module.body[0]] is positioned.module


class _Everything(cst.CSTVisitor):
    """Every call a walk makes, by node; the visits of `Subscript` say to skip its children."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.seen.append(("visit", id(node)))
        return not isinstance(node, cst.Subscript)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.seen.append(("leave", id(original_node)))


@pytest.mark.parametrize("case", [*sorted(FIXTURES.glob("*.in.py"))[:40], None], ids=str)
def test_a_read_walk_makes_libcst_walks_calls(case: Path | None) -> None:
    """`read` visits as LibCST does, without the copies: every node, in the same order, with the visits
    that skip their children honoured."""
    module = cst.parse_module(case.read_text() if case else SOURCE)
    plain, fast = _Everything(), _Everything()
    module.visit(plain)
    read(module, fast)
    assert fast.seen == plain.seen and len(plain.seen) > 100


def _subclasses(cls: type) -> list[type]:
    return [cls, *(sub for direct in cls.__subclasses__() for sub in _subclasses(direct))]


def test_no_codemod_visitor_defines_an_attribute_visit() -> None:
    """FastDispatch skips `visit_<Type>_<attribute>` methods: none of the codemod's visitors may have one."""
    for info in pkgutil.walk_packages(regionalize.codemod.__path__, "regionalize.codemod."):
        importlib.import_module(info.name)
    visitors = [c for c in _subclasses(FastDispatch) if c.__module__.startswith("regionalize.")]
    assert len(visitors) >= 4  # the finder, the editor and the integer walks
    for visitor in visitors:
        own = {
            name for cls in visitor.__mro__ if cls.__module__.startswith("regionalize.") for name in vars(cls)
        }
        for name in own:
            prefix, _, rest = name.partition("_")
            if prefix in ("visit", "leave") and rest and rest[0].isupper():
                assert "_" not in rest, f"{visitor.__name__}.{name} would never be called"


def test_lines_end_where_python_ends_them() -> None:
    """At \\r\\n, \\r and \\n only: a form feed, \\x1c or \\u2028 stays inside its line, as for `ast`."""
    for text in ("a\n\x0cb\r\nc", "x\u2028y\n\x85z", "plain\ntext\n", "é\x1c\rend"):
        lines = split_lines(text)
        assert "".join(lines) == text
        assert len(lines) == len(text.replace("\r\n", "\n").replace("\r", "\n").rstrip("\n").split("\n"))
    assert split_lines("a\n\x0cb\n") == ["a\n", "\x0cb\n"]
