"""The machine a measurement ran on, in the words every results page uses to name it."""

from __future__ import annotations

import os
import platform


def machine() -> str:
    """`Python 3.11.7, 2 CPU cores (x86_64)`: what a figure measured on a CPU depends on, beside the
    packages' versions, which each page names itself."""
    return f"Python {platform.python_version()}, {os.cpu_count()} CPU cores ({platform.machine()})"
