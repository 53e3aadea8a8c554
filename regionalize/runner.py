"""The file runner: find files, read them faithfully, run the codemod, write results atomically."""

from __future__ import annotations

import codecs
import contextlib
import difflib
import fnmatch
import gc
import os
import stat
import subprocess
import tempfile
import tokenize
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from regionalize import helpers
from regionalize.codemod import might_have_sites, transform_source
from regionalize.options import Options
from regionalize.report import FileReport, shown

MAX_BYTES = 10 * 1024 * 1024  # larger "source" is generated data; parsing it would stall the run
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
            yield given, _os_error(exc)
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


def _os_error(exc: OSError) -> str:
    return exc.strerror or str(exc)


@dataclass
class SourceFile:
    """A file's text plus what is needed to write it back byte-for-byte the same way."""

    text: str
    encoding: str
    bom: bool


def read_source(path: str) -> SourceFile:
    """Raises ValueError with a one-line reason when the file is not usable Python source."""
    # Opened without blocking and checked before reading: a FIFO named on the command line would
    # otherwise hold the whole run until something writes to it.
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise ValueError("not a regular file")
        data = handle.read(MAX_BYTES + 1)
    return decode_source(data)


def decode_source(data: bytes) -> SourceFile:
    """Source bytes (a file's, or standard input's) as text; ValueError with a one-line reason."""
    if len(data) > MAX_BYTES:
        raise ValueError(f"file is larger than {MAX_BYTES // (1024 * 1024)} MiB")
    bom = data.startswith(codecs.BOM_UTF8)
    try:
        encoding, _ = tokenize.detect_encoding(iter(data.splitlines(keepends=True)).__next__)
    except SyntaxError:  # raised both for bytes that are not UTF-8 and for a bad coding cookie
        raise ValueError("not valid utf-8, and no coding declaration that fits") from None
    encoding = "utf-8" if encoding == "utf-8-sig" else encoding
    body = data[len(codecs.BOM_UTF8) :] if bom else data
    try:
        text = body.decode(encoding)
    except UnicodeDecodeError as exc:
        raise ValueError(f"not valid {encoding}: byte {exc.start}") from None
    if "\0" in text:
        raise ValueError("file contains NUL bytes: not Python source")
    return SourceFile(text, encoding, bom)


def write_output(path: str, text: str, what: str) -> str | None:
    """Write a command's output file (`what`: "report", "JSON"): None, or the error line saying why not."""
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        return f"error: {shown(path)}: cannot write the {what}: {exc.strerror or exc}"
    return None


def write_atomically(path: str, source: SourceFile, text: str) -> None:
    """Temp file in the same directory, then rename: a crash leaves the old file or the new one."""
    data = (codecs.BOM_UTF8 if source.bom else b"") + text.encode(source.encoding)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:  # a new file: the mode a plain `open` would give it
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    # Beside the file a symlink leads to: a rename is atomic only within one file system, and replaces
    # the file, not the link.
    target = os.path.realpath(path)
    fd, temp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".regionalize-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, mode & 0o7777)
        os.replace(temp, target)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


@dataclass(frozen=True)
class Job:
    """What to do with each file."""

    options: Options
    apply: bool = False
    diff: bool = True  # keep the unified diff; only text output shows it, and a zoo's diffs add up


def process_file(path: str, job: Job) -> FileReport:
    """Never raises for a bad file: its error goes into the report and the run goes on."""
    report = FileReport(path)
    try:
        source = read_source(path)
    except (OSError, ValueError) as exc:
        report.error = _os_error(exc) if isinstance(exc, OSError) else str(exc)
        return report
    code = _rewrite(report, source, path, job)
    if code is not None and job.apply:
        try:
            write_atomically(path, source, code)
        except OSError as exc:
            report.error = f"cannot write: {_os_error(exc)}"
            report.changed = False  # the summary counts files changed on disk
    return report


def process_stdin(data: bytes, name: str | None, job: Job) -> tuple[FileReport, bytes]:
    """Standard input's source rewritten: the report (its path `name`, the file the text stands for, or
    `-`) and the bytes to print, in the input's encoding, BOM and line endings. On any error they are the
    input unchanged, so that a pipe back into the file loses nothing."""
    report = FileReport(name or "-")
    try:
        source = decode_source(data)
    except ValueError as exc:
        report.error = str(exc)
        return report, data
    code = _rewrite(report, source, name, job)
    if code is None:
        return report, data
    return report, (codecs.BOM_UTF8 if source.bom else b"") + code.encode(source.encoding)


def _rewrite(report: FileReport, source: SourceFile, path: str | None, job: Job) -> str | None:
    """Fill in the report; the rewritten text, or None when there is nothing to write."""
    if not might_have_sites(source.text, job.options):
        return None
    try:
        result = transform_source(source.text, job.options, path)
    except RecursionError:
        report.error = "nested too deeply to parse"
        return None
    except Exception as exc:  # a bug of ours must not stop a run over a whole model zoo
        report.error = f"internal error, please report it: {type(exc).__name__}: {exc}"
        return None
    report.sites = result.sites
    report.runtime = str(result.runtime) if result.runtime else None
    if result.status == "failure":
        report.error = result.reason
        return None
    if not result.changed:
        return None
    report.changed = True
    if job.diff:
        report.diff = unified_diff(report.path, source.text, result.code)
    return result.code


def unified_diff(path: str, before: str, after: str) -> str:
    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        f"a/{shown(path)}",
        f"b/{shown(path)}",
    )
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )


def _process(args: tuple[str, Job]) -> FileReport:
    return process_file(*args)


def run(
    files: list[str],
    job: Job,
    jobs: int,
    on_done: Callable[[FileReport], None] = lambda report: None,
) -> list[FileReport]:
    """Process files in parallel; reports come back in the order of `files`, whatever finishes first."""
    work = [(f, job) for f in files]
    reports: list[FileReport] = []
    if jobs <= 1 or len(files) < 2:
        with _bulk_gc():
            for item in work:
                reports.append(_process(item))
                on_done(reports[-1])
    else:
        with ProcessPoolExecutor(max_workers=jobs, initializer=_tune_gc) as pool:
            for report in pool.map(_process, work, chunksize=max(1, min(16, len(files) // (jobs * 8)))):
                reports.append(report)
                on_done(report)
    for report in runtime_reports(reports, job):
        reports.append(report)
        on_done(report)
    return reports


# Parsing allocates hundreds of thousands of tracked objects per file, and nearly none are cyclic garbage:
# at the default threshold (700) the collector ran ~20,000 times in a run over the transformers models
# and took an eighth of its CPU, mostly full collections walking the modules imported at start.
_GC_THRESHOLD = (10_000, 10, 10)


def _tune_gc() -> None:
    """A worker's setting for its life: what is imported before the files are read is never garbage."""
    gc.freeze()
    gc.set_threshold(*_GC_THRESHOLD)


@contextlib.contextmanager
def _bulk_gc() -> Iterator[None]:
    """The worker's setting, in this process only while the files are processed (it may be a library
    caller's, which keeps running after)."""
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    _tune_gc()
    try:
        yield
    finally:
        gc.set_threshold(*before)
        if not frozen:  # a caller's own freeze stays as it was
            gc.unfreeze()


def runtime_reports(reports: list[FileReport], job: Job) -> list[FileReport]:
    """The packages' runtime copies the rewritten files import, each written (or brought up to date)
    once per run, after the files: a report of its own, so the diff and the exit status show it."""
    out = []
    for path in sorted({r.runtime for r in reports if r.runtime and not r.error}):
        text = helpers.pending_module(Path(path))
        if text is None:
            continue
        label = os.path.relpath(path) if not os.path.relpath(path).startswith("..") else path
        report = FileReport(label, changed=True)
        try:
            before = read_source(path).text if os.path.exists(path) else ""
        except (OSError, ValueError) as exc:
            report.error = f"cannot read the runtime copy: {exc}"
            out.append(report)
            continue
        if job.diff:
            report.diff = unified_diff(label, before, text)
        if job.apply:
            try:
                write_atomically(path, SourceFile(before, "utf-8", False), text)
            except OSError as exc:
                report.error = f"cannot write: {_os_error(exc)}"
        out.append(report)
    return out
