"""The file runner: read files faithfully, run the codemod, write results atomically (the files of a run
are found by `discovery.py`, read and written by `regionalize.shared.source_files`)."""

from __future__ import annotations

import codecs
import contextlib
import difflib
import gc
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from regionalize.codemod import runtime_copy, vendored_legacy
from regionalize.codemod.nodes import split_lines
from regionalize.codemod.transform import might_have_sites, transform_source
from regionalize.shared.options import Options
from regionalize.shared.sites import FileReport, label, shown
from regionalize.shared.source_files import SourceFile, decode_source, read_source, write_atomically


def _os_error(exc: OSError | ValueError) -> str:
    """The reason an error gives, without the path an OSError repeats."""
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)


@dataclass(frozen=True)
class Job:
    """What to do with each file."""

    options: Options
    apply: bool = False
    diff: bool = True  # keep the unified diff; only text output shows it, and a zoo's diffs add up


# What --apply writes for a judged file: its encoding and BOM (not its old text), and the rewritten code.
_Pending = tuple[SourceFile, str]


def _judge(path: str, job: Job) -> tuple[FileReport, _Pending | None]:
    """The file's report, and with --apply what to write: nothing is written yet."""
    report = FileReport(path)
    try:
        source = read_source(path)
    except (OSError, ValueError) as exc:
        report.error = _os_error(exc)
        return report, None
    code = _rewrite(report, source, path, job)
    if code is None or not job.apply:
        return report, None
    return report, (SourceFile("", source.encoding, source.bom), code)


def _write(report: FileReport, source: SourceFile, code: str) -> str | None:
    """Write a rewritten file, its runtime copy first: a run stopped between the two writes leaves a
    package that imports. The error, or None."""
    if report.runtime:
        try:
            report.runtime_before = _runtime_copy(report.runtime, write=True)
        except ValueError as exc:
            return f"not written, as its runtime copy {shown(label(report.runtime))} is not: {exc}"
    try:
        write_atomically(report.path, source, code)
    except OSError as exc:
        return f"cannot write: {_os_error(exc)}"
    return None


def _runtime_copy(path: str, write: bool) -> runtime_copy.Changes | None:
    """What a runtime copy (`runtime_copy.py`) and the joined module of an earlier release beside it need
    (`runtime_copy.Changes`) when the copy is not up to date, and with `write` they get it; None when it is
    up to date. ValueError when it cannot be read or written, or is a file or folder of the user's own,
    which is never written over."""
    folder = Path(path)
    if taken := runtime_copy.foreign_module(folder.parent):
        raise ValueError(_FOREIGN.format(what=taken[1]))
    changes = runtime_copy.pending(folder)
    if not changes:
        return None
    joined = vendored_legacy.joined_module(folder.parent)
    try:
        if joined is not None:  # a package directory would shadow it: with --apply it goes first
            changes[joined] = (read_source(str(joined)).text, "")
            if write:
                joined.unlink()
        if write:
            runtime_copy.write(folder, {f: texts for f, texts in changes.items() if f != joined})
    except (OSError, ValueError) as exc:
        raise ValueError(_os_error(exc)) from None
    return changes


_FOREIGN = (
    "the package's own {what} has the name of the runtime copy that its rewritten files would import: "
    "left as it is, and so are they (RGZ113); rename it to let them be rewritten"
)


def _still_imported(reports: list[FileReport]) -> None:
    """A joined module of an earlier release that a file left out of the run still imports cannot give way
    to the sub-package (which would shadow it): the run's files that would write the sub-package are
    errors, and written as nothing is, with the files to add to the run."""
    rewritten = {Path(r.path).resolve() for r in reports if r.changed and not r.error}
    for folder in sorted({r.runtime for r in reports if r.runtime and not r.error}):
        root = Path(folder).parent
        if vendored_legacy.joined_module(root) is None:
            continue
        left = [f for f in vendored_legacy.importers(root) if f.resolve() not in rewritten]
        if not left:
            continue
        names = ", ".join(shown(label(f)) for f in left[:3]) + (
            f" and {len(left) - 3} more" if len(left) > 3 else ""
        )
        joined = shown(label(root / f"{runtime_copy.MODULE}.py"))
        error = (
            f"not rewritten: {joined}, the runtime copy of an earlier "
            f"regionalize, is still imported by {names}, which this run leaves as they are, and the copy "
            "that replaces it would hide it: run over the whole package to move its files together"
        )
        for report in reports:
            if report.runtime == folder and not report.error:
                report.error, report.changed, report.diff = error, False, ""


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
        split_lines(before),
        split_lines(after),
        f"a/{shown(path)}",
        f"b/{shown(path)}",
    )
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )


def _process(args: tuple[str, Job]) -> tuple[FileReport, _Pending | None]:
    return _judge(*args)


def run(
    files: list[str],
    job: Job,
    jobs: int,
    on_done: Callable[[FileReport], None] = lambda report: None,
) -> list[FileReport]:
    """Process files in parallel; reports come back in the order of `files`, whatever finishes first.

    Every file is judged before any is written (`on_done` is called as each is judged): a file is judged
    by what the rest of its package defines (`codemod/package.py`), and a neighbour rewritten first
    would change that, so the result would depend on the order and the timing of the workers. The
    writes follow, in the order of `files`, each runtime copy before the first file that imports it."""
    work = [(f, job) for f in files]
    judged: list[tuple[FileReport, _Pending | None]] = []
    if jobs <= 1 or len(files) < 2:
        with _bulk_gc():
            for item in work:
                judged.append(_process(item))
                on_done(judged[-1][0])
    else:
        with ProcessPoolExecutor(max_workers=jobs, initializer=_tune_gc) as pool:
            for result in pool.map(_process, work, chunksize=max(1, min(16, len(files) // (jobs * 8)))):
                judged.append(result)
                on_done(result[0])
    _still_imported([report for report, _ in judged])
    reports = []
    for report, pending in judged:
        if pending is not None and not report.error:
            report.error = _write(report, *pending)
            report.changed = report.error is None  # the summary counts files changed on disk
        reports.append(report)
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
    """The runtime copies the files import, each a report of its own, so that the diff and the exit
    status show it: written by --apply before the first file that imports it (`_write`), and here brought
    up to date for the files rewritten before. A file or folder of the user's own in its place is an
    error, and left as it is, as are the files that would import it (RGZ113)."""
    out = []
    # A copy written before its file failed to be is reported too.
    for path in sorted(
        {r.runtime for r in reports if r.runtime and (not r.error or r.runtime_before is not None)}
    ):
        if taken := runtime_copy.foreign_module(Path(path).parent):
            out.append(FileReport(label(taken[0]), error=_FOREIGN.format(what=taken[1])))
            continue
        written = [r.runtime_before for r in reports if r.runtime == path and r.runtime_before is not None]
        report = FileReport(label(path), changed=True)
        try:
            changes = written[0] if written else _runtime_copy(path, job.apply)
        except ValueError as exc:
            report.error = str(exc)
            out.append(report)
            continue
        if changes:
            if job.diff:
                report.diff = "".join(unified_diff(label(f), *texts) for f, texts in sorted(changes.items()))
            out.append(report)
    return out
