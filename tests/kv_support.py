"""What the tests of cache-updating regions share: models loaded from source, and transformers' own
modeling files rewritten by the codemod."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import ModuleType
from typing import Any

import runtime_support

from regionalize.codemod import transform_source
from regionalize.shared.options import Options

_names = itertools.count()


def load(source: str) -> ModuleType:
    return runtime_support.load(source, "kv_regions")


def rewritten(original: ModuleType, options: Options | None = None) -> tuple[ModuleType, str]:
    """transformers' modeling module `original` as the codemod rewrites it, imported in its package, and
    its source."""
    from regionalize.bench.loading import import_paths, import_rewritten, resolve_target

    path = Path(str(original.__file__))
    code = transform_source(path.read_text(encoding="utf-8"), options or Options(vendor=True), str(path)).code
    with import_paths(target := resolve_target(str(path), "unused")):
        return import_rewritten(target, code, path), code


def attributes(layer: Any) -> dict[str, Any]:
    """A cache layer's attributes but its keys and values, tensors as (dtype, device, values)."""
    import torch

    return {
        name: (value.dtype, value.device, value.tolist()) if isinstance(value, torch.Tensor) else value
        for name, value in vars(layer).items()
        if name not in ("keys", "values")
    }
