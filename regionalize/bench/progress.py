"""Where verify is, on stderr: each step with the seconds since the start, so a slow step is not a hang."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, quiet: bool = False, name: str = "verify") -> None:
        self.quiet = quiet
        self.name = name
        self.start = time.perf_counter()

    def __call__(self, step: str) -> None:
        if not self.quiet:
            elapsed = time.perf_counter() - self.start
            print(f"{self.name} [{elapsed:7.1f}s] {step}", file=sys.stderr, flush=True)


QUIET = Progress(quiet=True)
