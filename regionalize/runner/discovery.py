"""Finding the files of a run: the paths given, folders walked (hidden, virtual-env, cache, git-ignored
and runtime-copy ones left out), and the --include / --exclude globs."""

from __future__ import annotations

import fnmatch
import os
import stat
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from regionalize.codemod import runtime_copy

SKIP_DIRS = {"__pycache__", "node_modules", "site-packages", "build", "dist"}


@dataclass(frozen=True)
class Selection:
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    # Exclude files named on the command line too: pre-commit names every file it hands over.
    force_exclude: bool = False

    def excluded(self, file: str) -> bool:
        return _matches(file, self.exclude)


def discover(paths: Iterable[str], selection: Selection = Selection()) -> Iterator[tuple[str, str | None]]:
    """Yield (path, error) for every Python file under `paths`; error is set for a path that is unusable.

    Files named explicitly are always taken; directories are walked, skipping hidden, virtual-env,
    cache and git-ignored folders and files, then --include/--exclude globs are applied.
    """
    seen: set[str] = set()  # a file named twice, or also under a folder named, is taken once

    def first(file: str) -> bool:
        key = os.path.realpath(file)
        if key in seen:
            return False
        seen.add(key)
        return True

    for given in paths:
        path = Path(given)
        try:
            path.stat()
        except OSError as exc:
            yield given, exc.strerror or str(exc)
            continue
        if not path.is_dir():
            if not (selection.force_exclude and selection.excluded(given)) and first(given):
                yield given, None
            continue
        found = sorted(_walk(path))
        ignored = _git_ignored(path, found)
        for file in found:
            if file in ignored or not _selected(file, selection) or not first(file):
                continue
            yield file, None


def _walk(root: Path) -> Iterator[str]:
    for directory, dirnames, filenames in os.walk(root):
        dirnames[:] = [
            d
            for d in dirnames
            if not d.startswith(".")
            and d not in SKIP_DIRS
            and not (Path(directory, d) / "pyvenv.cfg").exists()
            # The runtime copy `--vendor` wrote is regionalize's, not the user's code to rewrite.
            and not (d == runtime_copy.MODULE and runtime_copy.is_copy(Path(directory, d)))
        ]
        for name in filenames:
            path = os.path.join(directory, name)
            # A FIFO, socket or device named *.py is not source (reading a FIFO would wait forever); a
            # link that leads nowhere is still yielded, and reported.
            if name.endswith((".py", ".pyi")) and not name.startswith(".") and _regular_or_broken(path):
                yield path


def _regular_or_broken(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return True


def _selected(file: str, selection: Selection) -> bool:
    if selection.include and not _matches(file, selection.include):
        return False
    return not selection.excluded(file)


def _matches(file: str, patterns: tuple[str, ...]) -> bool:
    """A glob matches the path as given, its file name, or the relative path spelled with or without `./`:
    a walk of `.` gives `./legacy/a.py`, pre-commit names it `legacy/a.py`, and `*/legacy/*` means both."""
    names = {file, os.path.basename(file)}
    if not os.path.isabs(file):
        names.add(file[2:] if file.startswith("./") else f"./{file}")
    return any(fnmatch.fnmatch(name, p) for name in names for p in patterns)


def _git_ignored(root: Path, files: list[str]) -> set[str]:
    """Files git ignores under `root`; empty when git is missing or `root` is not in a work tree.

    A directory named on the command line is walked even when git ignores it (a downloaded model zoo
    under an ignored folder): then only what a user asked for is there, and nothing is left out.
    """
    if not files:
        return set()
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "check-ignore", "--no-index", "-z", "--stdin"],
            # fsencode: a file name that is not valid UTF-8 goes to git as the bytes it is.
            input=b"\0".join([b".", *(os.fsencode(os.path.relpath(f, root)) for f in files)]),
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return set()
    if done.returncode not in (0, 1):  # 128: not a git repository
        return set()
    ignored = [os.fsdecode(f) for f in done.stdout.split(b"\0") if f]
    if "." in ignored:
        return set()
    return {os.path.join(root, f) for f in ignored}
