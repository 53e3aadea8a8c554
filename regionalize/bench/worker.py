"""`python -m regionalize.bench.worker`: time one variant's first call in this (fresh) process.

Reads a WorkerJob as JSON on standard input and prints one result line; the parent sets an empty
TORCHINDUCTOR_CACHE_DIR, so nothing compiled by an earlier run can be reused.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from regionalize.bench.accounting import saved_bytes, saved_owners
from regionalize.bench.loading import import_paths, resolve_target
from regionalize.bench.session import BY_NAME, Subject
from regionalize.bench.timing import RESULT_MARKER, WorkerJob, first_call_s, options_from_json, warm_up
from regionalize.bench.workloads import spec_from_fields


def _untraced() -> None:
    """Made a compiled function, never called."""


def main() -> None:
    job = WorkerJob(**json.loads(sys.stdin.read()))
    sys.path[:0] = [p for p in job.sys_path if p not in sys.path]
    options = options_from_json(job.options)
    target = resolve_target(job.model_path, job.factory)
    if job.load_artifacts:
        torch.compiler.load_cache_artifacts(Path(job.load_artifacts).read_bytes())
    with import_paths(target):
        workdir = Path(tempfile.gettempdir())
        spec = spec_from_fields(job.workload) if job.workload else None
        subject = Subject(target, options, job.device, workdir, job.sources, transform=False, spec=spec)
        built = subject.build(BY_NAME[job.variant])
        warmup_s = None
        if job.warm:
            start = time.perf_counter()
            warm_up(options, job.device)
            warmup_s = time.perf_counter() - start
        torch.compiler.reset()
        # torch.compile's own imports (Inductor's, 0.3 s on the CPU box) paid before the clock starts, by
        # every variant: a full compile's `torch.compile(model)` pays them as the model is built, the
        # rewrite's owner at its first call, which would count them against it alone.
        torch.compile(_untraced, **options.compile_kwargs())
        seconds = first_call_s(built, job.device)
    size = None
    if job.save_artifacts:
        saved = torch.compiler.save_cache_artifacts()
        payload = saved[0] if saved else b""
        Path(job.save_artifacts).write_bytes(payload)
        size = len(payload)
    result = {"first_call_s": seconds, "warmup_s": warmup_s, "artifact_bytes": size}
    owners = saved_owners(built.model)  # loaded, saved, or why not (unless turned off)
    if owners:
        result.update(saved_owners=owners, saved_bytes=saved_bytes())
    print(RESULT_MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
