"""Command-line flags shared by `regionalize` and `regionalize verify`, merged over pyproject settings.

Both commands must agree on what a rewrite is, so `verify` checks exactly what `rewrite` writes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from regionalize.shared import config
from regionalize.shared.options import FORMS, GUARD_BYPASS, MODES, STYLES, Options

F = TypeVar("F", bound=Callable[..., Any])
EXIT_ERROR = 2

_CODEMOD_OPTIONS = [
    click.option(
        "--style",
        type=click.Choice(STYLES),
        help="inplace (default): each block compiled where it is, after the container is built "
        "(`regionalize.compile_region(*self.layers, owner=self)`, or `block.compile()` with --form "
        "per-block); state_dict keys unchanged. wrap: torch.compile(Block(..)), per block, which prefixes "
        "every key with `_orig_mod.`.",
    ),
    click.option(
        "--form",
        type=click.Choice(FORMS),
        help="hierarchical (default where the blocks' owner is known): the owner compiled whole, each block "
        "a nested region traced once; one compiled frame per call. per-block: each block compiled on its "
        "own, a Dynamo frame per block call. Measured on a 2-core CPU against a full torch.compile "
        "(docs/results/forward/forward.md, docs/results/decode.md): hierarchical starts 1.9-4.5x sooner "
        "and runs a forward in 1.02-1.21x its time; generating with a KV cache at 32 layers it reaches the "
        "first token 3.1-3.5x sooner and decodes in 0.98-1.20x its time. per-block starts 4.8-9.9x sooner "
        "(the first token 4.4-6.3x) but runs a forward in 1.30-1.64x its time and decodes in 2.3-2.4x, "
        "often slower than eager. On a GPU serve with --mode reduce-overhead: without CUDA graphs a small "
        "batch is bound by work per call. "
        "An owner that cannot be compiled whole falls back to per-block at run time, with one warning.",
    ),
    click.option(
        "--mode",
        type=click.Choice(MODES),
        help="torch.compile mode. reduce-overhead and max-autotune use CUDA graphs: the graph goes around "
        "the module that owns the blocks, with each block a nested compile region "
        "(docs/form-cuda-graphs.md).",
    ),
    click.option("--fullgraph/--no-fullgraph", default=None, help="torch.compile fullgraph."),
    click.option("--dynamic/--no-dynamic", default=None, help="torch.compile dynamic (default: automatic)."),
    click.option("--backend", help="torch.compile backend (default: inductor)."),
    click.option(
        "--guard-bypass",
        type=click.Choice(GUARD_BYPASS),
        help="Skip Dynamo's guard checks on each call: on the owner's one frame in the hierarchical form, "
        "on each block's frame with --form per-block. depyf calls the compiled code directly for calls "
        "seen before (the same shapes, plain values, modes); filter drops the guards on the structure of "
        "modules. What is then no longer re-checked, and measured figures: "
        "docs/form-guard-bypass.md.",
    ),
    click.option(
        "--vendor/--no-vendor",
        default=None,
        help="Where rewritten files get the runtime they call. Default (--no-vendor): `import regionalize`, "
        "one line a file; the model then needs regionalize installed (torch alone at run time), and fixes "
        "come by upgrading it. --vendor: a copy of the runtime package in your tree, `_regionalize/` at the "
        "package's top (beside a file outside any package), bound by one import, for packages that must "
        "run on torch alone; a later run brings the copy up to date. A run without --vendor moves a file "
        "that uses a copy to the import form (RGZ005) and leaves the copy for you to delete.",
    ),
    click.option(
        "--saved-owners/--no-saved-owners",
        default=None,
        help="Write `saved=True` (or `saved=False`) into each owner's call, whatever the environment says "
        "at run time. Saved owners: an owner's compiled frame is saved under torch's cache directory and a "
        "restarted process loads it instead of tracing (docs/saved-owners.md). Default: neither written; "
        "on at run time unless REGIONALIZE_SAVED_OWNERS=0. Hierarchical form only.",
    ),
    click.option(
        "--always",
        multiple=True,
        help="Class always treated as a repeated block: its name, or the factory's or variable's that builds "
        "it, as a site line names it (repeatable).",
    ),
    click.option(
        "--never",
        multiple=True,
        help="Class never treated as a repeated block: its name, or the factory's or variable's that builds "
        "it, as a site line names it (repeatable).",
    ),
    click.option(
        "--container",
        "containers",
        multiple=True,
        help="Class (or dotted name) that is a container like ModuleList; a name with Dict or Sequential "
        "in it is read as a ModuleDict or Sequential (repeatable).",
    ),
    click.option(
        "--config",
        "config_file",
        type=click.Path(exists=True, dir_okay=False),
        help="pyproject.toml to read (default: the nearest one above the paths).",
    ),
]


def output_file(context: click.Context, parameter: click.Parameter, value: str | None) -> str | None:
    """A file option a command writes at its end (a report, JSON): its folder must exist, checked before a
    run that can take minutes."""
    if value is not None and not Path(value).resolve().parent.is_dir():
        raise click.BadParameter(f"the folder of {value!r} does not exist", context, parameter)
    return value


def codemod_options(command: F) -> F:
    """Add the codemod's flags to a click command."""
    for option in reversed(_CODEMOD_OPTIONS):
        command = option(command)
    return command


def settings(paths: list[str], config_file: str | None, flags: dict[str, Any]) -> dict[str, Any]:
    """pyproject settings with the flags given on the command line on top; exits 2 on a bad file."""
    try:
        found = Path(config_file) if config_file else config.find_pyproject(paths)
        merged = config.load(found) if found else {}
    except config.ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    merged.update({k: v for k, v in flags.items() if v not in (None, ())})
    return merged


def options(merged: dict[str, Any]) -> Options:
    try:
        return Options.from_settings(merged)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
