"""The first call of each compiled variant timed in fresh processes (`timing.cold_starts`), recorded in
verify's result: each kind of start, what a hot start found of the saved owners, and full over the rewrite."""

from __future__ import annotations

import statistics
import sys
from typing import Any

from regionalize.bench.progress import Progress
from regionalize.bench.session import Subject
from regionalize.bench.timing import WorkerJob, cold_starts
from regionalize.bench.workloads import GenerateSpec, spec_fields

WORKER_TIMEOUT_S = 900.0


def record_starts(
    subject: Subject,
    factory: str,
    variants: list[str],
    repeats: int,
    result: dict[str, Any],
    progress: Progress,
    kinds: tuple[str, ...],
) -> None:
    """Records in `result` the first-call time of each compiled variant, each run in fresh processes of the
    kinds named, and what each hot start found of the saved owners."""
    job = WorkerJob(
        model_path=str(subject.target.model_path),
        factory=factory,
        variant="",
        sources={key: str(path) for key, path in subject.sources.items()},
        options=result["options"],
        device=subject.device,
        warm=False,
        sys_path=[p for p in sys.path if p],
        workload=spec_fields(subject.spec) if subject.spec else None,
    )
    runs = cold_starts(job, variants, repeats, WORKER_TIMEOUT_S, kinds, progress)
    result["compile_runs"] = runs
    result["compile_s"].update({name: _median(r.get("warm", [])) for name, r in runs.items()})
    result["compile_cold_s"].update({name: _median(r.get("cold", [])) for name, r in runs.items()})
    for key, kind in (
        ("compile_hot_s", "hot"),
        ("compile_artifact_s", "artifact"),
        ("artifact_bytes", "artifact_bytes"),
    ):
        result[key].update({name: _median(r.get(kind, [])) for name, r in runs.items()})
    # Unless REGIONALIZE_SAVED_OWNERS=0 turned them off: what each owner's hot start found, and their files.
    found = {name: r["saved_hot"][-1] for name, r in runs.items() if r.get("saved_hot")}
    if found:
        result["saved_owners_hot"] = found
        result["saved_owner_bytes"] = {name: _median(r.get("saved_bytes", [])) for name, r in runs.items()}
    result["compile_speedup"] = _ratio(result["compile_s"], "full", "regional")
    result["compile_cold_speedup"] = _ratio(result["compile_cold_s"], "full", "regional")
    if isinstance(subject.spec, GenerateSpec):  # the worker's first call was the first token
        result["ttft_s"] = dict(result["compile_s"])
        result["ttft_cold_s"] = dict(result["compile_cold_s"])
        for key, kind in (("first_generate_s", "generate"), ("first_generate_hot_s", "generate_hot")):
            result[key].update({name: _median(r.get(kind, [])) for name, r in runs.items()})


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(times: dict[str, float | None], over: str, under: str) -> float | None:
    top, bottom = times.get(over), times.get(under)
    return top / bottom if top is not None and bottom else None
