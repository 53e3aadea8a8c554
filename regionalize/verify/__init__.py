"""`regionalize verify`: prove a rewrite equivalent and checkpoint-compatible, and measure what it buys.

Only this package imports torch, and only once `run_verify` runs, so the rest of regionalize (and
`regionalize --help`) works on machines without it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from regionalize.bench.progress import QUIET, Progress
from regionalize.bench.starts import QUICK_STARTS, STARTS, start_kinds
from regionalize.shared.options import Options
from regionalize.shared.source_files import write_output

if TYPE_CHECKING:
    from regionalize.bench.loading import Target, VerifyError
    from regionalize.bench.workloads import Spec

EXIT_OK, EXIT_FAILED, EXIT_ERROR = 0, 1, 2
DEFAULT_OPTIONS = Options()
# The headline keys lead the JSON object, so a person opening the file sees the verdict first.
_LEADING = (
    "exit_code",
    "error",
    "equivalent",
    "max_abs_diff",
    "max_abs_diff_at",
    "state_dict_compatible",
    "compile_s",
    "compile_cold_s",
    "compile_speedup",
    "compile_cold_speedup",
    "compile_hot_s",
    "compile_artifact_s",
    "artifact_bytes",
    "graphs",
    "recompiles",
    "fell_back_to_eager",
    "steady_us",
    "workload",
    "tokens_identical",
    "ttft_s",
    "first_generate_s",
    "first_generate_hot_s",
    "decode_ms_per_token",
    "losses_equal",
    "train_ms_per_step",
    "peak_step_bytes",
    "device",
    "torch_version",
)


def run_verify(
    model_path: str | None,
    factory: str,
    rewritten: str | None = None,
    device: str = "auto",
    repeats: int = 3,
    json_out: str | None = None,
    options: Options = DEFAULT_OPTIONS,
    cold_start: bool = True,
    out: TextIO | None = None,
    workload: str | None = None,
    tokens: int = 16,
    prompt_len: int = 8,
    progress: Progress = QUIET,
    quick: bool = False,
    cache: str = "dynamic",
    starts: tuple[str, ...] | None = None,
    skip: tuple[str, ...] = (),
    steps: int = 8,
) -> int:
    """Verify `model_path` against its rewrite (`rewritten`, or the codemod's output with `options`).

    Prints a table to `out` (standard output by default) and, with `json_out`, writes the result as one
    JSON object. `cold_start=False` skips the fresh-process compile timings, the slowest part.
    `workload="generate"` verifies greedy generation of `tokens` new tokens instead of one forward
    (`prompt_len` sizes the prompt when the factory gives none), with a cache of the kind `cache` names
    (`"dynamic"`, transformers' default, or `"static"`, its fixed-size one); `workload="train"` verifies
    `steps` training steps of forward, backward and an optimizer step. `progress` reports each step
    as it starts; `quick` times one warm fresh process per variant and no cold ones; `starts` names the
    kinds of fresh process to time (`starts.STARTS`; by default all, or with `quick` the warm one); `skip`
    names variants left out (`manifest.SKIPPABLE`'s values).
    Returns 0 equivalent and checkpoint-compatible, 1 a check failed, 2 the user's code could not run.
    """
    from regionalize.bench.loading import VerifyError

    result = _first_result(model_path, factory, rewritten, options)
    try:
        spec = _workload_spec(workload, tokens, prompt_len, cache, steps)
        target = _import_target(model_path, factory, progress, result)
        from regionalize.verify.verifier import verify

        result = verify(
            target,
            factory,
            rewritten,
            device,
            repeats,
            options,
            cold_start,
            spec,
            progress=progress,
            kinds=start_kinds(starts or (QUICK_STARTS if quick else STARTS)),
            skip=skip,
        )
        code = EXIT_OK if result["equivalent"] and result["state_dict_compatible"] else EXIT_FAILED
    except VerifyError as exc:
        result["error"] = _error_json(exc)
        code = EXIT_ERROR
    return _report(result, code, out, json_out)


def _first_result(
    model_path: str | None, factory: str, rewritten: str | None, options: Options
) -> dict[str, Any]:
    """Returns the result's keys known before anything runs: what is verified, and with which options."""
    return {
        "model": model_path,
        "factory": factory,
        "rewritten": rewritten,
        "options": {"style": options.style, "backend": options.backend},
    }


def _workload_spec(workload: str | None, tokens: int, prompt_len: int, cache: str, steps: int) -> Spec | None:
    """Returns the built-in workload that `workload` names (None: one forward); raises VerifyError for an
    unknown workload or cache, or sizes below 1."""
    from regionalize.bench.loading import VerifyError
    from regionalize.bench.workloads import CACHES, GENERATE, TRAIN, GenerateSpec, TrainSpec

    if workload not in (None, GENERATE, TRAIN):
        raise VerifyError("workload", f"unknown workload {workload!r}: the built-in ones are generate, train")
    if tokens < 1 or prompt_len < 1 or steps < 1:
        raise VerifyError("workload", "--tokens, --prompt-len and --steps must be at least 1")
    if cache not in CACHES:
        raise VerifyError("workload", f"unknown cache {cache!r}: choose one of {', '.join(CACHES)}")
    if workload == TRAIN:
        return TrainSpec(steps)
    return GenerateSpec(tokens, prompt_len, cache) if workload else None


def _import_target(
    model_path: str | None, factory: str, progress: Progress, result: dict[str, Any]
) -> Target:
    """Imports the model's module and finds its factory; records the module's path in `result`."""
    from regionalize.bench.loading import resolve_target

    progress(f"importing {model_path or factory}")
    target = resolve_target(model_path, factory)
    result["model"] = str(target.model_path)
    return target


def _error_json(exc: VerifyError) -> dict[str, Any]:
    """Returns the result's `error` entry for a verify that could not run."""
    from regionalize.bench.loading import Unchanged

    return {
        "stage": exc.stage,
        "message": exc.message,
        "traceback": exc.details,
        "unchanged": isinstance(exc, Unchanged),  # a zoo's row "unchanged", not "error"
    }


def _report(result: dict[str, Any], code: int, out: TextIO | None, json_out: str | None) -> int:
    """Prints the result's table and, with `json_out`, writes its JSON; returns the exit status."""
    from regionalize.verify import render

    result.setdefault("error", None)
    result["exit_code"] = code
    print(render.table(result), end="", file=out or sys.stdout)
    if json_out and not _write_json(result, json_out):
        return EXIT_ERROR
    return code


def _write_json(result: dict[str, Any], json_out: str) -> bool:
    """Writes the result to `json_out` as one JSON object, headline keys first; False (the reason said on
    standard error) where it cannot."""
    ordered = {key: result[key] for key in _LEADING if key in result} | result
    unwritten = write_output(json_out, json.dumps(ordered, indent=2, default=str) + "\n", "JSON")
    if unwritten:
        print(unwritten, file=sys.stderr)
        return False
    return True


def run_manifest(
    manifest: str,
    out_dir: str | None,
    overrides: dict[str, Any],
    progress: Progress = QUIET,
    out: TextIO | None = None,
    ray_address: str | None = None,
    resume: bool = False,
) -> int:
    """Verify every model of a zoo manifest, each in its own process; write STEM.md/.json/.png.

    `overrides` (e.g. {"quick": True, "timeout": 600}) win over the manifest's settings. `ray_address`
    runs the entries as tasks on that Ray cluster ("local" starts one; docs/cluster.md); `resume` keeps
    the rows an earlier run left in the output folder for the same entries and versions. Prints one line
    per model. Returns the worst row's status: 0 all pass, 1 a check failed, 2 an entry could not run
    (error, timeout, crash), the manifest is bad, or the run was interrupted.
    """
    from regionalize.bench import zoo, zoo_report, zoo_resume
    from regionalize.bench.manifest import ManifestError, load

    if ray_address is not None and not _has_ray():
        return EXIT_ERROR
    stream = out or sys.stdout
    path = Path(manifest)
    try:
        entries = [entry.with_settings(overrides) for entry in load(path)]
    except ManifestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    folder = Path(out_dir) if out_dir else path.parent
    folder.mkdir(parents=True, exist_ok=True)
    kept = _resumed(folder / f"{path.stem}.json", entries, progress) if resume else {}
    todo = [entry for entry in entries if entry.name not in kept]
    ran = _run_rows(todo, path, folder / f"{path.stem}-reports", progress, ray_address)
    if isinstance(ran, int):
        return ran
    fresh, interrupted = ran
    by_name = kept | {row.name: row for row in fresh if row is not None}
    rows = [by_name[entry.name] for entry in entries if entry.name in by_name]
    for entry in entries:
        if entry.name in by_name:
            by_name[entry.name].key = zoo_resume.entry_key(entry)
    width = max((len(row.name) for row in rows), default=0)
    for row in rows:
        speedup = (row.result or {}).get("compile_speedup")
        figure = row.reason or "equivalent" + (_first_call(speedup) if speedup else "")
        print(f"{row.name:<{width}}  {row.status:<9}  {figure}", file=stream)
    written = zoo_report.write(rows, path, folder, path.stem)
    print("wrote " + ", ".join(str(p) for p in written), file=stream)
    if interrupted:
        print(f"interrupted: {len(rows)} of {len(entries)} entries done; --resume runs the rest", file=stream)
        return EXIT_ERROR
    return max(zoo.EXIT[row.status] for row in rows)


def _has_ray() -> bool:
    """Whether Ray imports; if not, the one line saying how to install it."""
    try:
        import ray  # noqa: F401
    except ImportError:
        from regionalize.bench.zoo_ray import INSTALL

        print(INSTALL, file=sys.stderr)
        return False
    return True


def _resumed(results: Path, entries: list[Any], progress: Progress) -> dict[str, Any]:
    from regionalize.bench import zoo_resume
    from regionalize.bench.machine import torch_versions

    kept = zoo_resume.earlier_rows(results, entries, torch_versions()["torch"])
    progress(f"--resume: {len(kept)} of {len(entries)} rows kept from {results}")
    return kept


def _run_rows(
    entries: list[Any], path: Path, reports: Path, progress: Progress, ray_address: str | None
) -> tuple[list[Any], bool] | int:
    """The entries' rows, here one after another or on Ray, and whether Ctrl-C cut the run short; or
    the exit status where the cluster cannot run them (one `error:` line said why)."""
    from regionalize.bench import zoo

    if not entries:
        return [], False
    if ray_address is None:
        return zoo.run_zoo(entries, path.parent.resolve(), reports, progress), False
    from regionalize.bench.zoo_ray import ClusterError, run_zoo_ray

    try:
        return run_zoo_ray(entries, path.parent.resolve(), reports, progress, ray_address)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _first_call(speedup: float) -> str:
    if speedup >= 1:
        return f", first call {speedup:.2f}x faster"
    return f", first call {1 / speedup:.2f}x SLOWER"
