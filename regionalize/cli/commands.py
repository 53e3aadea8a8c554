"""The `regionalize` command: parse flags, merge pyproject settings, hand files to the runner, report."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from regionalize import __version__
from regionalize.cli import flags
from regionalize.cli.report import NEXT_STEP, site_line, summarize, summary_line, to_json, to_sarif
from regionalize.cli.tune_command import tune
from regionalize.cli.verify_command import verify
from regionalize.codemod import runtime_copy
from regionalize.runner.discovery import Selection, discover
from regionalize.runner.run import Job, process_stdin, run, runtime_reports
from regionalize.shared import rules
from regionalize.shared.sites import FileReport, shown
from regionalize.shared.source_files import write_output

EXIT_CLEAN, EXIT_PENDING, EXIT_ERROR = 0, 1, flags.EXIT_ERROR

HELP = """Rewrite PyTorch models so that each repeated block (a layer of a ModuleList, Sequential or
ModuleDict) is compiled once and reused, instead of torch.compile inlining every layer into one graph.

By default prints a unified diff and one line per site, and changes nothing. --apply writes the
files and prints the site lines (add --diff to see the diffs too); --check prints only the site lines
(for CI and pre-commit; --diff adds the diffs, as Black's --check --diff). A PATH of - reads the source
from standard input, and --apply then prints the rewritten code (as Black's and Ruff's -; see
--stdin-filename).

\b
Exit status: 0 nothing left to rewrite, 1 rewrites pending (without --apply), 2 an error.
Settings can also live in [tool.regionalize] of pyproject.toml; flags win over the file.
See also: regionalize verify --help (prove a rewrite equivalent and faster to compile), regionalize
tune --help (measure which blocks share a graph, and write the settings), and regionalize rule CODE
(what a site code such as RGZ108 means, and what to do about it).
"""


def runtime_version() -> int | None:
    """The runtime's version, from the header of regionalize/runtime/__init__.py: the number rewritten
    files and vendored copies name ("runtime 28"), which changes with the runtime, not with a release."""
    return runtime_copy.version_of((runtime_copy.RUNTIME / "__init__.py").read_text(encoding="utf-8"))


class _RewriteContext(click.Context):
    @property
    def command_path(self) -> str:
        return "regionalize"  # usage errors say "Try 'regionalize --help'", the form a user typed


class _RewriteCommand(click.Command):
    """`rewrite` is what `regionalize PATH...` runs: its help and usage errors name that form, which the
    pages use, not the subcommand's own name, and list the other commands."""

    context_class = _RewriteContext

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage("regionalize", "[OPTIONS] PATH...")
        formatter.write_usage("regionalize", "verify|tune|rule ...", prefix="   or: ")

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        root = ctx.find_root().command
        assert isinstance(root, click.Group)
        rows = [
            (name, cmd.get_short_help_str(120)) for name, cmd in root.commands.items() if name != "rewrite"
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)
        super().format_epilog(ctx, formatter)


class _DefaultCommandGroup(click.Group):
    """`regionalize PATH...` runs the rewrite; a first argument naming a subcommand (`verify`, `rule`, ...)
    runs that instead, so a path with such a name needs a `./` before it."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] != "--version"):
            args = ["rewrite", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_DefaultCommandGroup, help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    __version__,
    "--version",
    prog_name="regionalize",
    message=f"%(prog)s %(version)s (runtime {runtime_version()})",
)
def main() -> None:
    pass


@main.command("rewrite", cls=_RewriteCommand, help=HELP)
@click.argument("paths", nargs=-1, type=click.Path(path_type=str), required=True)
@click.option("--apply", is_flag=True, help="Write the rewritten files.")
@click.option(
    "--check",
    is_flag=True,
    help="Print only the site lines (and the diffs with --diff, as Black's --check --diff); exit 1 if "
    "rewrites are pending.",
)
@click.option(
    "--diff/--no-diff",
    "show_diff",
    default=None,
    help="Print the unified diff of each changed file (default: on for the dry run, off with --apply).",
)
@flags.codemod_options
@click.option("--include", multiple=True, help="Glob of files to take when walking directories (repeatable).")
@click.option("--exclude", multiple=True, help="Glob of files to leave out when walking directories.")
@click.option(
    "--force-exclude",
    is_flag=True,
    default=None,
    help="Leave out files that --exclude matches even when they are named on the command line, as "
    "pre-commit names them (and the text of --stdin-filename, printed back unchanged).",
)
@click.option("-j", "--jobs", type=click.IntRange(min=1), help="Parallel processes (default: CPU cores).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "sarif"]),
    default="text",
    show_default=True,
    help="Report format on standard output.",
)
@click.option(
    "--report",
    "report_file",
    type=click.Path(dir_okay=False, writable=True),
    callback=flags.output_file,
    help="Also write the JSON report (or SARIF with --format sarif) to this file.",
)
@click.option(
    "--stdin-filename",
    type=click.Path(dir_okay=False, path_type=str),
    help="With - (source on standard input): the file it stands for, which names it in the output and "
    "places it in its package (declarations, the package's runtime module) and under its pyproject.toml.",
)
@click.option("-q", "--quiet", is_flag=True, help="No summary line.")
def rewrite(
    paths: tuple[str, ...],
    apply: bool,
    check: bool,
    fmt: str,
    report_file: str | None,
    config_file: str | None,
    quiet: bool,
    show_diff: bool | None,
    stdin_filename: str | None,
    **extra: Any,
) -> None:
    if apply and check:
        raise click.UsageError("--apply and --check exclude each other")
    stdin = "-" in paths
    if stdin and len(paths) > 1:
        raise click.UsageError("- (source on standard input) cannot be given with other paths")
    if stdin_filename and not stdin:
        raise click.UsageError("--stdin-filename goes with - (source on standard input)")
    if stdin and apply and fmt != "text":
        raise click.UsageError(
            f"with - and --apply the code goes to standard output: write the {fmt} report with --report"
        )
    settings = flags.settings([stdin_filename] if stdin_filename else list(paths), config_file, extra)
    options = flags.options(settings)
    if options.style == "wrap" and fmt == "text":
        click.echo(
            "warning: --style wrap prefixes every state_dict key with `_orig_mod.`: existing "
            "checkpoints no longer load without remapping",
            err=True,
        )
    # As Black and Ruff: a bulk --apply and --check print no diffs; the dry run does, and any run asked.
    wanted = (not apply and not check) if show_diff is None else show_diff
    job = Job(options, apply, diff=fmt == "text" and wanted)
    selection = Selection(
        tuple(settings.get("include", ())),
        tuple(settings.get("exclude", ())),
        bool(settings.get("force_exclude")),
    )
    if stdin:
        left_out = bool(stdin_filename) and selection.force_exclude and selection.excluded(stdin_filename)
        reports = _rewrite_stdin(stdin_filename, job, left_out)
    else:
        files: list[str] = []
        reports = []
        for path, error in discover(paths, selection):
            if error is None:
                files.append(path)
            else:
                reports.append(FileReport(path, error=error))
        jobs = settings.get("jobs") or os.cpu_count() or 1
        reports += _run_with_progress(files, job, jobs, show=fmt == "text" and not quiet)
    report = to_sarif(reports) if fmt == "sarif" else to_json(reports)
    unwritten = write_output(report_file, report, "report") if report_file else None
    # With - --apply, standard output carries the code, so the diffs and site lines go to stderr.
    _emit(reports, fmt, quiet, err=stdin and apply, written=apply)
    if unwritten:
        click.echo(unwritten, err=True)
        sys.exit(EXIT_ERROR)
    sys.exit(_exit_code(reports, apply))


def _run_with_progress(files: list[str], job: Job, jobs: int, show: bool) -> list[FileReport]:
    """A progress bar only for a person watching a long run: not when piped, not in CI."""
    interactive = show and sys.stderr.isatty() and not os.environ.get("CI") and len(files) > 50
    if not interactive:
        return run(files, job, jobs)
    with click.progressbar(length=len(files), label="regionalize", file=sys.stderr) as bar:
        return run(files, job, jobs, on_done=lambda report: bar.update(1))


def _rewrite_stdin(name: str | None, job: Job, left_out: bool) -> list[FileReport]:
    """Source from standard input. With --apply the rewritten code goes to standard output (the input
    itself when there is nothing to rewrite, on an error, or where --force-exclude leaves the file out),
    as Black and Ruff do with `-`; the package's runtime module the code imports is written as for a
    file."""
    data = sys.stdin.buffer.read()  # all of it, even past the size limit: on an error it is printed back
    if left_out:
        if job.apply:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        return []
    report, code = process_stdin(data, name, job)
    # The runtime copy before the code that imports it, which an editor writes into the file.
    runtimes = runtime_reports([report], job)
    if job.apply:
        sys.stdout.buffer.write(code)
        sys.stdout.buffer.flush()
    return [report, *runtimes]


def _emit(reports: list[FileReport], fmt: str, quiet: bool, err: bool = False, written: bool = True) -> None:
    if fmt == "json":
        click.echo(to_json(reports))
        return
    if fmt == "sarif":
        click.echo(to_sarif(reports))
        return
    for report in reports:
        if report.diff:
            click.echo(report.diff, nl=False, err=err)
        for site in report.sites:
            click.echo(site_line(report.path, site), err=err)
        if report.error:
            click.echo(f"error: {shown(report.path)}: {report.error}", err=True)
    if not quiet:
        summary = summarize(reports)
        line = summary_line(summary, written)
        # The site lines name codes; the summary says once where a code's page is.
        skipped, warnings = summary["skipped"], summary["warnings"]
        assert isinstance(skipped, dict) and isinstance(warnings, dict)
        if codes := [*skipped, *warnings]:
            line += f"; regionalize rule {codes[0]} explains a code"
        if not written and summary["files_changed"]:
            line += f"; {NEXT_STEP}"
        click.echo(line, err=True)


def _exit_code(reports: list[FileReport], apply: bool) -> int:
    if any(r.error for r in reports):
        return EXIT_ERROR
    if not apply and any(r.changed for r in reports):
        return EXIT_PENDING
    return EXIT_CLEAN


main.add_command(verify)
main.add_command(tune)


@main.command("rule")
@click.argument("code", required=False)
@click.option("--all", "show_all", is_flag=True, help="Print the page of every code.")
def rule(code: str | None, show_all: bool) -> None:
    """Print what a site code means, why the codemod decides so and what to do about it (as `ruff rule`).

    \b
    regionalize rule RGZ108     one code's page
    regionalize rule --all      every code's page
    """
    if show_all == (code is not None):
        raise click.UsageError("give one CODE, or --all")
    if show_all:
        click.echo("\n".join(rules.pages().values()), nl=False)
        return
    assert code is not None
    try:
        click.echo(rules.page(code), nl=False)
    except rules.UnknownCode:
        click.echo(f"error: unknown code {code!r} (known: {', '.join(rules.pages())})", err=True)
        sys.exit(EXIT_ERROR)
