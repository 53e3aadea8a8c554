"""`regionalize verify`: the click command; the CLI group adds it with `main.add_command(verify)`.

Imports no torch: `regionalize.verify` loads it only when the command runs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from regionalize.bench.manifest import SKIPPABLE
from regionalize.bench.starts import checked
from regionalize.cli import flags


def _starts(context: click.Context, parameter: click.Parameter, value: str | None) -> tuple[str, ...] | None:
    """--starts: the kinds of fresh process named, checked before a run that can take minutes."""
    if value is None:
        return None
    try:
        return checked([kind.strip() for kind in value.split(",") if kind.strip()])
    except ValueError as exc:
        raise click.BadParameter(f"{value!r}: give {exc}", context, parameter) from None


HELP = """Prove that the rewrite of MODEL.py computes the same thing and loads the same checkpoints, and
measure what regional compilation buys: compile time, graphs, recompiles, steady-state latency.

\b
FACTORY is a function returning (model, args), (model, args, kwargs) or (model, run), where run is a
callable taking the model and returning what to compare (a workload: several calls, a cache):
  NAME                  defined in MODEL.py
  package.module:NAME   defined in that module; MODEL.py defaults to the module's file
  path/file.py:NAME     defined in another file
A factory outside MODEL.py takes one argument, the model module (original or rewritten), and builds
the model from it, e.g. `def make(m): return m.LlamaForCausalLM(config), (ids,)`.

Without --rewritten the codemod's output for these options is verified, in memory. Timings are for
inference (eval mode, no autograd) unless --workload train; each compile time is the first call (a
workload's whole run; with --workload generate, the first token; with --workload train, the first
training step) in a fresh process, started four ways by default (--starts): warm
(after one unrelated warm-up compile), cold (nothing compiled before), hot (the compile caches a cold
process left on disk, as a restarted service finds them) and artifact (torch's portable cache artifacts
loaded); --quick times the warm start only.

MODEL may also be a module's dotted name (transformers.models.bert.modeling_bert).

With --manifest zoo.toml, every model the manifest lists is verified in its own process, one after
another, each with a timeout; the results go to STEM.md, STEM.json and STEM.png (docs/verify.md).
With --ray, the entries run as tasks on a Ray cluster instead, into the same report (docs/cluster.md).

\b
Exit status: 0 equivalent and checkpoint-compatible, 1 a check failed, 2 the model could not be
imported, built or run (the report says which step, with the traceback). With --manifest: the worst
model's status, a timeout or a crash counting as 2.
"""


@click.command("verify", help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model", required=False)
@click.option("--factory", help="NAME, package.module:NAME or path/file.py:NAME.")
@click.option(
    "--rewritten",
    type=click.Path(exists=True, dir_okay=False),
    help="A rewritten MODEL.py to verify instead of the codemod's output.",
)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Fresh processes per compile timing; the median is reported.",
)
@click.option(
    "--no-cold-start",
    "cold_start",
    is_flag=True,
    flag_value=False,
    default=True,
    help="Skip the fresh-process compile timings (the slow part).",
)
@click.option(
    "--workload",
    type=click.Choice(["generate", "train"]),
    help="generate: verify greedy generation (a transformers causal LM) instead of one forward; the "
    "factory returns (model, (input_ids,)) or just the model; tokens must be identical, time to first "
    "token and decode time per token are measured. train: verify training steps on the factory's inputs "
    "(forward in training mode, the output's loss or a fixed projection of its outputs, backward, an AdamW "
    "step); every step's loss and the first step's gradients must match, the first step and a step's time "
    "are measured, and the most memory a step's tensors hold at once.",
)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Training steps compared (--workload train).",
)
@click.option(
    "--tokens",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="New tokens per generation (--workload generate).",
)
@click.option(
    "--prompt-len",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Length of the prompt made from the config when the factory gives no input_ids.",
)
@click.option(
    "--cache",
    type=click.Choice(["dynamic", "static"]),
    default="dynamic",
    show_default=True,
    help="The KV cache generate makes (--workload generate): transformers' default, or its fixed-size one "
    '(cache_implementation="static", the way it serves compiled; its own compile of the forward is turned '
    "off, so that each variant runs as it says).",
)
@click.option(
    "--json",
    "json_out",
    type=click.Path(dir_okay=False, writable=True),
    callback=flags.output_file,
    help="Also write the results as one JSON object to this file.",
)
@click.option(
    "--quick",
    is_flag=True,
    help="Everyday preset: one fresh process per compile timing (unless --repeats is given), warm start "
    "only (no cold process).",
)
@click.option(
    "--starts",
    callback=_starts,
    metavar="KINDS",
    help="The fresh processes the first call is timed in, comma-separated: warm (after an unrelated "
    "compile), cold (nothing compiled before), hot (the caches a cold process left on disk, as a restarted "
    "service finds them; runs the cold one too), artifact (its portable cache artifacts loaded). Default: "
    "all four, or warm with --quick.",
)
@click.option(
    "--manifest",
    type=click.Path(exists=True, dir_okay=False),
    help="Verify every model of a zoo manifest (TOML, see docs/verify.md), each in its own process, "
    "instead of MODEL; writes STEM.md, STEM.json and STEM.png. With it, only --out, --timeout, --quick, "
    "--starts, --device and -q apply: everything else is set per model in the manifest.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    help="Folder for the --manifest results (default: the manifest's folder).",
)
@click.option(
    "--timeout",
    type=click.IntRange(min=1),
    help="Seconds per manifest entry before it is killed and reported (overrides the manifest).",
)
@click.option(
    "--ray",
    "ray_address",
    is_flag=False,
    flag_value="local",
    metavar="[ADDRESS]",
    help="With --manifest: run each entry as a Ray task, a whole GPU (CUDA) or a whole node's CPUs each "
    "(docs/cluster.md). No ADDRESS starts a local cluster; auto joins the running one, as ray.init does. "
    'Needs pip install "regionalize[ray]".',
)
@click.option(
    "--resume",
    is_flag=True,
    help="With --manifest: keep the rows an earlier run left in the output folder for the same entries "
    "and versions; run the rest.",
)
@click.option(
    "--skip",
    "skip",
    multiple=True,
    type=click.Choice(list(SKIPPABLE)),
    help="Leave a variant out of the run (repeatable): dedup, a full compile with Dynamo's graph "
    "deduplication; per-block, the rewrite's --form per-block; bypass, its guard bypass. Its cells read "
    "'-', and the report says it was left out.",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress lines on stderr; the report alone.")
@flags.codemod_options
def verify(
    model: str | None,
    factory: str | None,
    rewritten: str | None,
    device: str,
    repeats: int,
    cold_start: bool,
    workload: str | None,
    tokens: int,
    steps: int,
    prompt_len: int,
    cache: str,
    json_out: str | None,
    config_file: str | None,
    quick: bool,
    starts: tuple[str, ...] | None,
    quiet: bool,
    manifest: str | None,
    out_dir: str | None,
    timeout: int | None,
    ray_address: str | None,
    resume: bool,
    skip: tuple[str, ...],
    **extra: Any,
) -> None:
    from regionalize.bench.progress import Progress
    from regionalize.verify import run_verify

    if manifest:
        _verify_manifest(manifest, out_dir, device, quick, starts, timeout, quiet, ray_address, resume)
    if factory is None:
        raise click.UsageError("give --factory (or --manifest)")
    if out_dir or timeout or ray_address or resume:
        raise click.UsageError("--out, --timeout, --ray and --resume go with --manifest")
    # The same [tool.regionalize] settings and flags as `regionalize rewrite`: verify what it writes.
    local = [model] if model and Path(model).exists() else []
    options = flags.options(flags.settings(local, config_file, extra))
    code = run_verify(
        model,
        factory,
        rewritten,
        device,
        _repeats(repeats, quick),
        json_out,
        options,
        cold_start=cold_start,
        workload=workload,
        tokens=tokens,
        prompt_len=prompt_len,
        cache=cache,
        steps=steps,
        progress=Progress(quiet),
        quick=quick,
        starts=starts,
        skip=tuple(SKIPPABLE[name] for name in skip),
    )
    sys.exit(code)


def _verify_manifest(
    manifest: str,
    out_dir: str | None,
    device: str,
    quick: bool,
    starts: tuple[str, ...] | None,
    timeout: int | None,
    quiet: bool,
    ray_address: str | None,
    resume: bool,
) -> NoReturn:
    """Verify every entry of a zoo manifest, the flags given overriding the manifest's settings, and exit
    with the worst entry's status."""
    from regionalize.bench.progress import Progress
    from regionalize.verify import run_manifest

    _manifest_only(click.get_current_context())
    overrides: dict[str, Any] = {"quick": True} if quick else {}
    overrides |= {"starts": list(starts)} if starts else {}
    overrides |= {"timeout": timeout} if timeout else {}
    overrides |= {"device": device} if device != "auto" else {}
    progress = Progress(quiet, "zoo")
    sys.exit(run_manifest(manifest, out_dir, overrides, progress, None, ray_address, resume))


def _repeats(repeats: int, quick: bool) -> int:
    """Fresh processes per timing: --quick times one unless --repeats is given too."""
    given = (
        click.get_current_context().get_parameter_source("repeats") is not click.core.ParameterSource.DEFAULT
    )
    return repeats if given or not quick else 1


_WITH_MANIFEST = {"manifest", "out_dir", "timeout", "quick", "starts", "device", "quiet"}
_WITH_MANIFEST |= {"ray_address", "resume"}


def _manifest_only(context: click.Context) -> None:
    """With --manifest, per-model flags would silently not apply: refuse them."""
    for name, value in context.params.items():
        given = context.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT
        if given and name not in _WITH_MANIFEST and value not in (None, ()):
            raise click.UsageError(f"{name} is set per model in the manifest, not with --manifest")
