"""What a run finds in a file: its sites (`Site`) and the file's report (`FileReport`), with the codes'
meanings, and how a path is shown. Every part reads them; `regionalize.cli.report` renders them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from regionalize.shared import rules

# Stable codes: tools and people grep for these, so they never change meaning. Each meaning is the title of
# the code's page (regionalize/codes/RGZnnn.md), which says what to do about it: `regionalize rule CODE`.
CODES = rules.meanings()


@dataclass(frozen=True)
class Site:
    line: int
    col: int
    code: str
    pattern: str
    block: str
    action: str  # "rewrite", "skip" or "warn"
    reason: str = ""


@dataclass
class FileReport:
    path: str
    sites: list[Site] = field(default_factory=list)
    error: str | None = None
    changed: bool = False
    diff: str = ""
    runtime: str | None = None  # the runtime copy (`_regionalize/`) the file imports, with --vendor
    # What this file's --apply changed in the runtime copy, writing it first (each file's text before and
    # after: `runtime_copy.Changes`); None when it did not write it.
    runtime_before: dict[Path, tuple[str, str]] | None = None

    @property
    def rewrites(self) -> int:
        return sum(site.action == "rewrite" for site in self.sites)


def shown(path: str) -> str:
    """`path` as text any output stream takes: a file name that is not valid UTF-8 reaches Python with its
    bytes as surrogates, which a strict stream (a UTF-8 locale other than C) refuses to print."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def label(path: str | os.PathLike[str]) -> str:
    """A path the run came to by itself (a package's runtime module), relative to the current folder
    when it is under it, as paths given on the command line mostly are."""
    relative = os.path.relpath(path)
    return os.fspath(path) if relative.startswith("..") else relative
