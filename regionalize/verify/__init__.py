"""`regionalize verify`: prove a rewrite equivalent and checkpoint-compatible, and measure what it buys.

Only this package imports torch, and only once `run_verify` runs, so the rest of regionalize (and
`regionalize --help`) works on machines without it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, TextIO

from regionalize.bench.progress import QUIET, Progress
from regionalize.bench.starts import QUICK_STARTS, STARTS, start_kinds
from regionalize.shared.options import Options
from regionalize.shared.source_files import write_output

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
) -> int:
    """Verify `model_path` against its rewrite (`rewritten`, or the codemod's output with `options`).

    Prints a table to `out` (standard output by default) and, with `json_out`, writes the result as one
    JSON object. `cold_start=False` skips the fresh-process compile timings, the slowest part.
    `workload="generate"` verifies greedy generation of `tokens` new tokens instead of one forward
    (`prompt_len` sizes the prompt when the factory gives none), with a cache of the kind `cache` names
    (`"dynamic"`, transformers' default, or `"static"`, its fixed-size one). `progress` reports each step
    as it starts; `quick` times one warm fresh process per variant and no cold ones; `starts` names the
    kinds of fresh process to time (`starts.STARTS`; by default all, or with `quick` the warm one); `skip`
    names variants left out (`manifest.SKIPPABLE`'s values).
    Returns 0 equivalent and checkpoint-compatible, 1 a check failed, 2 the user's code could not run.
    """
    from regionalize.bench.loading import Unchanged, VerifyError, resolve_target
    from regionalize.verify import render

    result: dict[str, Any] = {
        "model": model_path,
        "factory": factory,
        "rewritten": rewritten,
        "options": {"style": options.style, "backend": options.backend},
    }
    try:
        if workload not in (None, "generate"):
            raise VerifyError("workload", f"unknown workload {workload!r}: the one built in is generate")
        if tokens < 1 or prompt_len < 1:
            raise VerifyError("workload", "--tokens and --prompt-len must be at least 1")
        progress(f"importing {model_path or factory}")
        target = resolve_target(model_path, factory)
        result["model"] = str(target.model_path)
        from regionalize.bench.workloads import CACHES, GenerateSpec
        from regionalize.verify.verifier import verify

        if cache not in CACHES:
            raise VerifyError("workload", f"unknown cache {cache!r}: choose one of {', '.join(CACHES)}")
        generate = GenerateSpec(tokens, prompt_len, cache) if workload else None
        result = verify(
            target,
            factory,
            rewritten,
            device,
            repeats,
            options,
            cold_start,
            generate,
            progress=progress,
            kinds=start_kinds(starts or (QUICK_STARTS if quick else STARTS)),
            skip=skip,
        )
        code = EXIT_OK if result["equivalent"] and result["state_dict_compatible"] else EXIT_FAILED
    except VerifyError as exc:
        result["error"] = {
            "stage": exc.stage,
            "message": exc.message,
            "traceback": exc.details,
            "unchanged": isinstance(exc, Unchanged),  # a zoo's row "unchanged", not "error"
        }
        code = EXIT_ERROR
    result.setdefault("error", None)
    result["exit_code"] = code
    print(render.table(result), end="", file=out or sys.stdout)
    if json_out:
        ordered = {key: result[key] for key in _LEADING if key in result} | result
        unwritten = write_output(json_out, json.dumps(ordered, indent=2, default=str) + "\n", "JSON")
        if unwritten:
            print(unwritten, file=sys.stderr)
            return EXIT_ERROR
    return code


def run_manifest(
    manifest: str,
    out_dir: str | None,
    overrides: dict[str, Any],
    progress: Progress = QUIET,
    out: TextIO | None = None,
) -> int:
    """Verify every model of a zoo manifest, each in its own process; write STEM.md/.json/.png.

    `overrides` (e.g. {"quick": True, "timeout": 600}) win over the manifest's settings. Prints one line
    per model. Returns the worst row's status: 0 all pass, 1 a check failed, 2 an entry could not run
    (error, timeout, crash) or the manifest is bad.
    """
    from regionalize.bench import zoo, zoo_report
    from regionalize.bench.manifest import ManifestError, load

    stream = out or sys.stdout
    path = Path(manifest)
    try:
        entries = load(path)
    except ManifestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    entries = [entry.with_settings(overrides) for entry in entries]
    folder = Path(out_dir) if out_dir else path.parent
    folder.mkdir(parents=True, exist_ok=True)
    rows = zoo.run_zoo(entries, path.parent.resolve(), folder / f"{path.stem}-reports", progress)
    width = max(len(row.name) for row in rows)
    for row in rows:
        speedup = (row.result or {}).get("compile_speedup")
        figure = row.reason or "equivalent" + (_first_call(speedup) if speedup else "")
        print(f"{row.name:<{width}}  {row.status:<9}  {figure}", file=stream)
    written = zoo_report.write(rows, path, folder, path.stem)
    print("wrote " + ", ".join(str(p) for p in written), file=stream)
    return max(zoo.EXIT[row.status] for row in rows)


def _first_call(speedup: float) -> str:
    if speedup >= 1:
        return f", first call {speedup:.2f}x faster"
    return f", first call {1 / speedup:.2f}x SLOWER"
