"""regionalize: rewrite PyTorch models to compile their repeated blocks regionally.

The codemod is the `regionalize` command. What rewritten models call at run time is imported from here
(`regionalize.compile_region`, ...; `regionalize/runtime/api.py`), and so is `compile_regions` for a
built model.
Those names load the runtime, and torch, at their first use: the command itself never imports torch.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.2.0"
__all__ = [
    "compile_direct",
    "compile_region",
    "compile_regions",
    "describe",
    "eager",
    "guard_filter",
    "symbolic_ints",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from regionalize.runtime import api

        # Bound here once, all together: later reads, Dynamo's while it traces a model too, find plain
        # module attributes.
        globals().update({public: getattr(api, public) for public in __all__})
        return globals()[name]
    raise AttributeError(f"module 'regionalize' has no attribute {name!r}")
