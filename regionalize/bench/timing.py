"""Timing: steady-state latency in this process; first-call (compile) time in fresh worker processes."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from regionalize.bench.loading import VerifyError
from regionalize.bench.session import Built
from regionalize.bench.workloads import GENERATE, Generate
from regionalize.shared.options import Options

RESULT_MARKER = "REGIONALIZE-WORKER-RESULT "
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding `regionalize/`
_STDERR_TAIL = 4000
# CPython keeps a thread's frames in 16 KiB chunks of a data stack and frees a chunk as soon as the frame at
# its base returns, so a call whose frame straddles a chunk's end maps and unmaps memory every time (a page
# fault and a system call or two: python/cpython issue 142183, fixed in 2026 on 3.13 and later; 3.11 and
# 3.12 keep it). Where the caller's stack stands so moves any form's time: at some depths transformers'
# `generate` took hundreds of faults a round in a full compile and the default alike, and until runtime 19
# (an owner's call since opens a chunk of its own) the default took one a block, up to 1.75x a decoded
# token's time (docs/results/torch-versions/stack-depths.md). Timed calls are made at these depths, 8
# spread over one chunk (136 of `at_depth`'s frames on CPython 3.11), so a median is the typical
# position's and no one position decides it.
STACK_DEPTHS = tuple(range(0, 136, 17))


def synchronize(device: str) -> None:
    # CUDA kernels run asynchronously: without this a clock read measures only the launch.
    if device == "cuda":
        torch.cuda.synchronize()


def call(built: Built, first: bool = False) -> Any:
    """One inference call (or the whole workload): eval mode without autograd, what a serving process runs,
    unless the workload trains.

    `first` runs what the first-call timing measures: the workload's `first` (for generation, the first
    token only; for training, one step).
    """
    grad = built.workload is not None and built.workload.grad
    with torch.set_grad_enabled(grad), torch._dynamo.config.patch(**built.dynamo):
        if built.workload is None:
            return built.model(*built.args, **built.kwargs)
        if first:
            return built.workload.first(built.model)
        return built.workload.run(built.model)


def first_call_s(built: Built, device: str) -> float:
    synchronize(device)
    start = time.perf_counter()
    call(built, first=True)
    synchronize(device)
    return time.perf_counter() - start


def at_depth(depth: int, fn: Callable[[], Any]) -> Any:
    """`fn()`, called `depth` Python frames deeper than this call."""
    return at_depth(depth - 1, fn) if depth else fn()


def steady_us(
    built: Built,
    device: str,
    warmup: int = 3,
    budget_s: float = 0.5,
    min_calls: int = 5,
    max_calls: int = 200,
    depths: Iterator[int] | None = None,
) -> float:
    """Median latency of one call after `warmup` calls, over as many calls as fit in `budget_s`, the calls
    made at each of `STACK_DEPTHS` in turn (drawn from `depths`, which rounds of a few calls share)."""
    for _ in range(warmup):
        call(built)
    times: list[float] = []
    depths = depths or itertools.cycle(STACK_DEPTHS)
    deadline = time.perf_counter() + budget_s
    while len(times) < max_calls and (len(times) < min_calls or time.perf_counter() < deadline):
        times.append(at_depth(next(depths), lambda: timed(lambda: call(built), device)))
    return statistics.median(times) * 1e6


def decode_timing(
    built: Built,
    device: str,
    warmup: int = 2,
    budget_s: float = 2.0,
    min_rounds: int = 5,
    max_rounds: int = 50,
    depths: Iterator[int] | None = None,
) -> tuple[float, float | None]:
    """(median microseconds of a whole generation, median milliseconds per decoded token) for `Generate`.

    Per token is (time of N tokens - time of 1 token) / (N - 1) within each round, the median over the
    rounds: the difference takes the prefill out, and pairing the two in a round keeps drift out of it.
    Each round is made at the next of `STACK_DEPTHS` (drawn from `depths`, as in `steady_us`).
    """
    workload = built.workload
    assert isinstance(workload, Generate)
    whole: list[float] = []
    per_token: list[float] = []
    with torch._dynamo.config.patch(**built.dynamo):
        for _ in range(warmup):
            workload.run(built.model)  # the first runs compile the decode step and its dynamic-shape variant
        depths = depths or itertools.cycle(STACK_DEPTHS)
        deadline = time.perf_counter() + budget_s
        while len(whole) < max_rounds and (len(whole) < min_rounds or time.perf_counter() < deadline):
            one, many = at_depth(next(depths), lambda: timed_pair(workload, built.model, device))
            whole.append(many)
            if workload.tokens > 1:
                per_token.append((many - one) / (workload.tokens - 1))
    decode_ms = statistics.median(per_token) * 1000 if per_token else None
    return statistics.median(whole) * 1e6, decode_ms


def timed_pair(workload: Generate, model: torch.nn.Module, device: str) -> tuple[float, float]:
    """Seconds of a generation of one token, then of the workload's tokens."""
    return timed(lambda: workload.run(model, tokens=1), device), timed(lambda: workload.run(model), device)


def timed(fn: Any, device: str) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def warm_up(options: Options, device: str) -> None:
    """A compile unrelated to the model: pays the backend's one-time start-up (~10 s for inductor on CPU)."""

    def unrelated(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x @ x.T).softmax(-1).sum(0)

    torch.compile(unrelated, **options.compile_kwargs())(torch.randn(32, 32, device=device))
    synchronize(device)


def options_to_json(options: Options) -> dict[str, Any]:
    return {k: sorted(v) if isinstance(v, frozenset) else v for k, v in dataclasses.asdict(options).items()}


def options_from_json(data: dict[str, Any]) -> Options:
    return Options(**{k: frozenset(v) if isinstance(v, list) else v for k, v in data.items()})


@dataclass(frozen=True)
class WorkerJob:
    """Everything a fresh process needs to rebuild one variant and time its first call."""

    model_path: str
    factory: str
    variant: str
    sources: dict[str, str]  # rewrite key -> file, as Subject.sources
    options: dict[str, Any]
    device: str
    warm: bool  # run the unrelated warm-up compile first
    sys_path: list[str]
    workload: dict[str, Any] | None = None  # the --workload spec's fields (`workloads.spec_fields`)
    save_artifacts: str | None = None  # write torch.compiler.save_cache_artifacts() here after the call
    load_artifacts: str | None = None  # load_cache_artifacts() from here before building


def run_worker(job: WorkerJob, timeout_s: float, cache: str | None = None) -> dict[str, Any]:
    """Run one job in a new interpreter with an empty inductor (and triton) cache, or with `cache` as
    an earlier process left it (kept); its result dict."""
    keep = cache is not None
    cache = cache or tempfile.mkdtemp(prefix="regionalize-inductor-")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TRITON_CACHE_DIR=os.path.join(cache, "triton"))
    env["PYTHONPATH"] = os.pathsep.join([_PACKAGE_ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])
    command = [sys.executable, "-m", "regionalize.bench.worker"]
    try:
        done = subprocess.run(
            command,
            input=json.dumps(dataclasses.asdict(job)),
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise VerifyError("compile timing", f"the {job.variant} worker ran past {timeout_s:.0f} s") from exc
    finally:
        if not keep:
            shutil.rmtree(cache, ignore_errors=True)
    results = [line for line in done.stdout.splitlines() if line.startswith(RESULT_MARKER)]
    if done.returncode != 0 or not results:
        raise VerifyError(
            "compile timing",
            f"the {job.variant} worker exited with status {done.returncode}",
            done.stderr[-_STDERR_TAIL:],
        )
    return json.loads(results[-1][len(RESULT_MARKER) :])


def cold_starts(
    job: WorkerJob,
    variants: list[str],
    repeats: int,
    timeout_s: float,
    kinds: tuple[str, ...] = ("cold", "warm", "hot", "artifact"),
    progress: Callable[[str], None] = lambda step: None,
) -> dict[str, dict[str, list[float]]]:
    """First-call seconds per variant, `repeats` each, in fresh processes of each kind:

    - cold: empty compile caches, nothing compiled before in the process;
    - warm: empty caches, after one unrelated compile (torch's own start-up paid);
    - hot: the caches the cold process left on disk, as a restarted service finds them (its saved owners
      among them, unless REGIONALIZE_SAVED_OWNERS=0 turns them off: `saved_<kind>` says what each found);
    - artifact: empty caches, with the portable artifacts the cold process saved
      (`torch.compiler.save_cache_artifacts`) loaded first, as a service shipping them in its image.
    `artifact_bytes` holds their sizes. For a generation these time its first token; `generate` (warm
    processes) and `generate_hot` its whole first generate, every compile of its tokens included. Runs
    alternate between variants so that drift in the machine's load does not favour one of them.
    """
    runs: dict[str, dict[str, list[float]]] = {
        v: {k: [] for k in (*kinds, "artifact_bytes")} for v in variants
    }
    for number in range(repeats):
        for variant in variants:
            with tempfile.TemporaryDirectory(prefix="regionalize-hot-") as kept:
                artifacts = os.path.join(kept, "artifacts.bin")
                for kind in kinds:
                    progress(f"first call of {variant} in a fresh {kind} process ({number + 1} of {repeats})")
                    run = dataclasses.replace(
                        job,
                        variant=variant,
                        warm=kind == "warm",
                        save_artifacts=artifacts if kind == "cold" and "artifact" in kinds else None,
                        load_artifacts=artifacts if kind == "artifact" else None,
                    )
                    cache = os.path.join(kept, "cache") if kind in ("cold", "hot") else None
                    if cache:
                        os.makedirs(cache, exist_ok=True)
                    result = run_worker(run, timeout_s, cache)
                    runs[variant][kind].append(result["first_call_s"])
                    if result.get("artifact_bytes") is not None:
                        runs[variant]["artifact_bytes"].append(result["artifact_bytes"])
                    if result.get("saved_owners"):  # what each start found of the saved owners
                        runs[variant].setdefault(f"saved_{kind}", []).append(result["saved_owners"])
                        if kind == "cold" and result.get("saved_bytes"):  # the files it wrote
                            runs[variant].setdefault("saved_bytes", []).append(result["saved_bytes"])
            if job.workload is not None and job.workload["kind"] == GENERATE:
                count = f"{number + 1} of {repeats}"
                _first_generates(job, variant, runs[variant], timeout_s, "hot" in kinds, progress, count)
    return runs


def _first_generates(
    job: WorkerJob,
    variant: str,
    runs: dict[str, list[float]],
    timeout_s: float,
    hot: bool,
    progress: Callable[[str], None],
    count: str,
) -> None:
    """A variant's whole first generate, in a warm process of its own (a second generate in one process
    makes a new cache, and a static one's new addresses compile again); with `hot`, again in a process
    that finds the caches it left, as a restarted service does: the first token's caches alone would
    leave the decode step's compile to the restart."""
    whole = {**(job.workload or {}), "first": "generate"}
    with tempfile.TemporaryDirectory(prefix="regionalize-hot-") as kept:
        cache = os.path.join(kept, "cache") if hot else None
        if cache:
            os.makedirs(cache)
        for kind, key in (("warm", "generate"), *((("hot", "generate_hot"),) if hot else ())):
            progress(f"first generate of {variant} in a fresh {kind} process ({count})")
            run = dataclasses.replace(job, variant=variant, warm=kind == "warm", workload=whole)
            runs.setdefault(key, []).append(run_worker(run, timeout_s, cache)["first_call_s"])
