"""What a name imported from the file's own package is, read from where the package defines it: the answer
`package.py` gives and `prescan.py` asks for (`prescan.Lookup`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Definition:
    """What an imported name is, read from where the package defines it."""

    container: str | None = None  # "ModuleList", "Sequential" or "ModuleDict" for a container subclass
    holds_submodules: bool | None = None  # a class: a block (True), a leaf (False), cannot tell (None)
    clones: bool = False  # a function returning a container of deep copies of its first argument
    # A container subclass with an __init__ of its own (`ResLayer(block, n)`, a Sequential that builds
    # its blocks itself): a call builds one block, it does not hand the container its elements.
    builds_itself: bool = False
    # Does the class hold repeated blocks compiled in its own module? Asked only of blocks, since
    # answering it runs the codemod over that module.
    holds_compiled: Callable[[], bool] = field(default=lambda: False, compare=False)
    # Are they nested regions of it, its module's rewrite making it their owner (a stage: RGZ006)?
    owns_regions: Callable[[], bool] = field(default=lambda: False, compare=False)
    returns: tuple[str, ...] | None = None  # a factory function: the classes it builds, absolute names
