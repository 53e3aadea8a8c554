"""What the tests of rewritten packages on disk share: a small model, the package's files as they are,
and importing the package as its users would, then forgetting it."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

MODEL = """\
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(x).tanh()


class Net(nn.Module):
    def __init__(self, d=8, n=3):
        super().__init__()
        self.layers = nn.ModuleList([Block(d) for _ in range(n)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
"""


def snapshot(root: Path) -> dict[Path, bytes | None]:
    """Every file and folder under `root` (a folder as None), by its path under it: what a run may change."""
    return {
        path.relative_to(root): None if path.is_dir() else path.read_bytes()
        for path in sorted(root.rglob("*"))
        if "__pycache__" not in path.parts
    }


def module_name(path: Path) -> str:
    """The module's name, for a file's path under the folder it is imported from."""
    return ".".join(path.with_suffix("").parts).removesuffix(".__init__")


@contextlib.contextmanager
def imported_from(root: Path) -> Iterator[None]:
    """Modules under `root` import as a user's would while inside (`importlib.import_module`); after, they
    are forgotten, with the global hook each runtime module registers, so the next package starts afresh.
    No bytecode is written: a file rewritten within the clock's second would be read from a stale one."""
    hooks = dict(torch.nn.modules.module._global_module_registration_hooks)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "dont_write_bytecode", True)
        patch.syspath_prepend(str(root))
        # A package of the same name that an earlier test imported from elsewhere (test_zoo's `zoo`) is
        # set aside until the end, or `zoo.fresh` would be looked for in that package's folder.
        for name in list(sys.modules):
            top = name.partition(".")[0]
            if (root / top).is_dir() or (root / f"{top}.py").is_file():
                patch.delitem(sys.modules, name)
        importlib.invalidate_caches()
        try:
            yield
        finally:
            for name, module in list(sys.modules.items()):
                if _under(module, root):
                    del sys.modules[name]
            registered = torch.nn.modules.module._global_module_registration_hooks
            registered.clear()
            registered.update(hooks)


def _under(module: ModuleType | None, root: Path) -> bool:
    names = getattr(module, "__dict__", {})  # not getattr: some libraries' lazy modules raise on it
    places = [names.get("__file__"), *(names.get("__path__") or [])]
    return any(isinstance(place, str) and Path(place).is_relative_to(root) for place in places)
