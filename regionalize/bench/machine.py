"""The machine a measurement ran on, in the words every results page uses to name it."""

from __future__ import annotations

import importlib.util
import os
import platform
from pathlib import Path
from typing import Any


def machine() -> str:
    """`Python 3.11.7, 2 CPU cores (x86_64)`: what a figure measured on a CPU depends on, beside the
    packages' versions, which each page names itself."""
    return f"Python {platform.python_version()}, {os.cpu_count()} CPU cores ({platform.machine()})"


def torch_versions() -> dict[str, str | None]:
    """torch's and its CUDA's versions here, read from torch/version.py without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return {"torch": None, "cuda": None}
    path = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    names: dict[str, Any] = {}
    try:
        exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), names)
    except (OSError, SyntaxError, ImportError):
        return {"torch": None, "cuda": None}
    return {"torch": names.get("__version__"), "cuda": names.get("cuda")}
