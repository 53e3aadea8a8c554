"""Declarations of repeated blocks (`_repeated_blocks`, `_no_split_modules`) and block factories: read
from the source, held package-wide or file-wide, overridden by `--always`."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from regionalize.codemod import declarations, transform_source
from regionalize.shared.options import Options

BLOCKS = """
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.qkv = nn.Linear(dim, dim)


class Resnet(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.conv = nn.Linear(dim, dim)
"""

USER = """
import torch.nn as nn

from .blocks import Resnet


class Decoder(nn.Module):
    def __init__(self, dim, depth):
        super().__init__()
        self.resnets = nn.ModuleList([Resnet(dim) for _ in range(depth)])

    def forward(self, x):
        for resnet in self.resnets:
            x = resnet(x)
        return x
"""


def _codes(source: str, path: Path | None = None, options: Options | None = None) -> list[str]:
    result = transform_source(textwrap.dedent(source), options or Options(), str(path) if path else None)
    return [site.code for site in result.sites]


def _package(tmp_path: Path, declaring: str) -> Path:
    package = tmp_path / "zoo"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "blocks.py").write_text(BLOCKS)
    (package / "model.py").write_text(declaring)
    user = package / "decoder.py"
    user.write_text(USER)
    return user


def test_read_takes_literal_lists_of_names_only() -> None:
    tree = ast.parse(
        textwrap.dedent(
            """
            class A:
                _repeated_blocks = ["Block", "Single"]
            class B:
                _no_split_modules: list[str] = ("Layer",)
            class C:
                _no_split_modules = None
            class D:
                _repeated_blocks = []
            class E:
                _no_split_modules = [name for name in NAMES]
            class F:
                _no_split_modules = ["Layer", OTHER]
            """
        )
    )
    found = declarations.read(tree)
    assert [(d.model, d.attribute, d.blocks) for d in found] == [
        ("A", "_repeated_blocks", ("Block", "Single")),
        ("B", "_no_split_modules", ("Layer",)),
    ]
    assert str(found[0]) == "A._repeated_blocks = ['Block', 'Single']"


def test_inside_follows_subclasses_what_they_build_and_functions() -> None:
    tree = ast.parse(
        textwrap.dedent(
            """
            def make_head(d):
                return Head(d)
            class Base:
                _no_split_modules = ["Layer"]
            class Model(Base):
                def __init__(self):
                    self.encoder = Encoder()
                    self.head = make_head(3)
            class Encoder:
                def __init__(self):
                    self.layers = [Layer() for _ in range(3)]
            class Layer: ...
            class Head: ...
            class Elsewhere:
                def __init__(self):
                    self.layers = [Layer() for _ in range(3)]
            """
        )
    )
    assert declarations.inside(tree, {"Base"}) == {"Base", "Model", "Encoder", "Layer", "Head"}


def test_package_wide_repeated_blocks_skip_other_classes(tmp_path: Path) -> None:
    declaring = "class Model:\n    _repeated_blocks = ['Attention']\n"
    user = _package(tmp_path, declaring)
    assert _codes(USER, user) == ["RGZ111"]
    assert _codes(USER, user, Options(always=frozenset({"Resnet"}))) == ["RGZ001"]


def test_never_takes_the_name_a_site_line_shows() -> None:
    """A factory's name, as the site line shows it, excludes its blocks as the class's name does."""
    source = USER.replace("from .blocks import Resnet", "def make(dim):\n    return Resnet(dim)")
    source = source.replace("[Resnet(dim)", "[make(dim)")
    assert _codes(source) == ["RGZ001"]
    for name in ("make", "Resnet"):
        assert _codes(source, options=Options(never=frozenset({name}))) == ["RGZ105"]


def test_the_text_rewritten_stands_for_its_file_on_disk(tmp_path: Path) -> None:
    """An editor's buffer (standard input with --stdin-filename) that no longer declares: the package's
    declarations are read from the other files, and from the text for its own."""
    user = _package(tmp_path, "class Model:\n    _repeated_blocks = ['Attention']\n")
    assert _codes(USER, user) == ["RGZ111"]
    assert _codes(USER, user.parent / "model.py") == ["RGZ001"]


def test_declaring_the_class_compiles_it(tmp_path: Path) -> None:
    user = _package(tmp_path, "class Model:\n    _repeated_blocks = ['Resnet']\n")
    assert _codes(USER, user) == ["RGZ001"]


def test_no_split_modules_of_another_file_does_not_hold(tmp_path: Path) -> None:
    # accelerate's declaration is per model file: another file of the package is judged as before.
    user = _package(tmp_path, "class Model:\n    _no_split_modules = ['Attention']\n")
    assert _codes(USER, user) == ["RGZ001"]


def test_without_declarations_nothing_changes(tmp_path: Path) -> None:
    user = _package(tmp_path, "class Model:\n    pass\n")
    assert _codes(USER, user) == ["RGZ001"]


def test_factory_returning_one_class_is_that_class() -> None:
    source = """
    import torch.nn as nn
    from lib import Layer, Norm


    def make_layer(d):
        return Layer(d)


    def make_norm(d):
        return Norm(d)


    def get_block(kind, d):
        if kind == "a":
            return Layer(d)
        return Norm(d)


    class Model(nn.Module):
        def __init__(self, d, n):
            super().__init__()
            self.layers = nn.ModuleList([make_layer(d) for _ in range(n)])
            self.norms = nn.ModuleList([make_norm(d) for _ in range(n)])
            self.mixed = nn.ModuleList([get_block(k, d) for k in "ab"])
    """
    # Layer: a block by its name; Norm: a leaf by its name, although the factory's name says block.
    assert _codes(source) == ["RGZ001", "RGZ102", "RGZ112"]
