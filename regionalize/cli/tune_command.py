"""`regionalize tune`: the click command; the CLI group adds it. Imports no torch until it runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from regionalize.cli import flags
from regionalize.shared import config
from regionalize.shared.source_files import write_output

HELP = """Measure which repeated blocks of MODEL.py share a compiled graph, and write the settings that leave
the others uncompiled.

The codemod cannot see widths or strides: a block class built at a different width per stage compiles
one graph per block, so compiling it regionally costs start time and shares nothing. tune builds the
rewrite with every block compiled on its own, calls it once, and counts the graphs each block class
made for how many blocks. A class with as many graphs as blocks goes to `never`. A class the model's
declaration of repeated blocks left out (RGZ111) whose blocks do share a graph goes to `always`.

It then times full compile and the rewrite before and after those settings: first call in a fresh
process (empty inductor cache, after one unrelated compile), per call in this one. --write puts the
settings into [tool.regionalize] of the pyproject.toml that configures MODEL.py (or --config, or a
pyproject.toml in the current folder), changing no other line.

FACTORY is as for `regionalize verify` (see its --help).

\b
Exit status: 0 the settings are unchanged, 1 tune found settings to change (written with --write), 2 the
model could not be imported, built or run, or the file could not be written.
"""


@click.command("tune", help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model")
@click.option("--factory", required=True, help="NAME, package.module:NAME or path/file.py:NAME.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--write", is_flag=True, help="Write the settings into [tool.regionalize] of pyproject.toml.")
@click.option(
    "--no-timing", "timing", is_flag=True, flag_value=False, default=True, help="Only count the graphs."
)
@click.option(
    "--json",
    "json_out",
    type=click.Path(dir_okay=False, writable=True),
    callback=flags.output_file,
    help="Also write the measurement and settings as JSON to this file.",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress lines on stderr.")
@flags.codemod_options
def tune(
    model: str,
    factory: str,
    device: str,
    write: bool,
    timing: bool,
    json_out: str | None,
    quiet: bool,
    config_file: str | None,
    **extra: Any,
) -> None:
    from regionalize.bench.loading import VerifyError, resolve_target
    from regionalize.bench.progress import Progress
    from regionalize.bench.tune import render, to_json
    from regionalize.bench.tune import tune as run_tune
    from regionalize.cli import config_update

    local = [model] if Path(model).exists() else []
    options = flags.options(flags.settings(local, config_file, extra))
    try:
        target = resolve_target(model, factory)
        tuning = run_tune(target, factory, options, device, timing, Progress(quiet, "tune"))
    except VerifyError as exc:
        click.echo(f"error: {model}: {exc.stage}: {exc.message}", err=True)
        if exc.details:
            click.echo(exc.details.rstrip(), err=True)
        sys.exit(2)
    click.echo(render(tuning), nl=False)
    if json_out:
        unwritten = write_output(json_out, json.dumps(to_json(tuning), indent=2) + "\n", "JSON")
        if unwritten:
            click.echo(unwritten, err=True)
            sys.exit(2)
    changed = bool(tuning.never or tuning.always)
    if write and changed:
        path = Path(config_file) if config_file else config.find_pyproject([str(target.model_path)])
        path = path or Path("pyproject.toml")
        settings = {key: sorted(getattr(tuning.options, key)) for key in ("never", "always")}
        try:
            config_update.update(path, {k: v for k, v in settings.items() if v})
        except (OSError, config_update.UpdateError) as exc:
            click.echo(f"error: {path}: {exc}", err=True)
            sys.exit(2)
        click.echo(f"wrote the settings into {path}")
    sys.exit(1 if changed else 0)
