"""A copy of the runtime for one test: the package loaded from its files under a name of its own, as a
vendored copy is, so that its probes, its process record and what it compiled start afresh, and a test
can read and patch its names without touching the installed runtime."""

from __future__ import annotations

import importlib.util
import itertools
import re
import sys
from types import ModuleType
from typing import Any

import pytest

from regionalize.bench.loading import load_runtime

_IMPORT = re.compile(r"^import regionalize$", re.M)
_names = itertools.count()
_copies: dict[str, RuntimeCopy] = {}  # a loaded module's name -> the runtime copy it calls


class RuntimeCopy:
    """The runtime package `package` (a new copy where None), its names read across its modules, as the
    one module that vendored copies once were."""

    def __init__(self, package: ModuleType | None = None) -> None:
        if package is None:
            package = load_runtime(f"runtime_copy_{next(_names)}")
        self.package = package
        prefix = f"{package.__name__}."
        self.modules = [module for name, module in sorted(sys.modules.items()) if name.startswith(prefix)]

    def __getattr__(self, name: str) -> Any:
        for module in self.modules:
            if name in vars(module):
                return vars(module)[name]
        raise AttributeError(name)

    def patch(self, monkeypatch: pytest.MonkeyPatch, name: str, value: Any) -> None:
        """Set `name` to `value` in every module of the copy that binds it, for the test."""
        bound = [module for module in self.modules if name in vars(module)]
        assert bound, name
        for module in bound:
            monkeypatch.setitem(vars(module), name, value)


def load(source: str, prefix: str) -> ModuleType:
    """`source` as a fresh module named after `prefix`; a rewrite's `import regionalize` binds a runtime
    copy of its own (`runtime_of`). Registered, as an import would be: pickle finds classes by module."""
    module = ModuleType(f"{prefix}_{next(_names)}")
    sys.modules[module.__name__] = module
    if _IMPORT.search(source):
        copy = _copies[module.__name__] = RuntimeCopy()
        module.regionalize = copy.package
        source = _IMPORT.sub("# import regionalize: a copy of its own, bound before", source, count=1)
    exec(compile(source, module.__name__, "exec"), module.__dict__)
    return module


def runtime_of(model: Any) -> RuntimeCopy:
    """The runtime copy that `model` (a module of a class `load` made, or such a loaded module) calls; for
    another rewritten model, the runtime its module binds: the package's copy with `--vendor`, else the
    installed one."""
    name = model.__name__ if isinstance(model, ModuleType) else type(model).__module__
    if name in _copies:
        return _copies[name]
    regionalize = vars(sys.modules[name]).get("regionalize")
    assert isinstance(regionalize, ModuleType), name
    if regionalize.__name__ == "regionalize":  # the import form: the installed package's runtime
        return RuntimeCopy(importlib.import_module("regionalize.runtime"))
    return RuntimeCopy(regionalize)
