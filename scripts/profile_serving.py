"""Where a decode token's time goes, for one variant of scripts/bench_serving.py on a GPU.

    python scripts/profile_serving.py VARIANT [--rewritten-dir .bench/serving]

The model, prompt and variants are bench_serving's (the Llama-3-8B shape, bf16, a 128-token prompt). After
the first generate and two more, it prints:

- decode per token, (generate(32) - generate(1)) / 31, three rounds;
- the GPU's kernel time per decode token and kernels per token (torch.profiler over a 17-token and a
  1-token generate: the difference over 16 tokens);
- the Python that ran in a 17-token generate, by time spent in each function (cProfile).

A decode per token above the kernel time per token is time the GPU waited: Python, launches, copies. Run
one variant per process, each with an empty Inductor cache (`TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)`).
Prints only; nothing is written.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from pathlib import Path
from typing import Any

import torch
from serving import workers
from serving.settings import LLAMA3_8B, VARIANTS
from torch.profiler import ProfilerActivity, profile


def kernels(run: Any) -> tuple[float, int]:
    """The GPU's kernel time (ms) and kernel count of `run()`."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    found = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.device_time for e in found) / 1e3, len(found)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("variant", choices=list(VARIANTS))
    parser.add_argument("--rewritten-dir", type=Path, default=Path(".bench/serving"))
    args = parser.parse_args()
    job = {"device": "cuda", "prepared": str(args.rewritten_dir.resolve()), "prompt_len": 128}
    workers.warm_up("cuda")
    model, extra = workers.build(job, args.variant, LLAMA3_8B, "bfloat16")
    ids = workers.prompt(job, LLAMA3_8B["vocab_size"])

    def generate(tokens: int) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        workers.generate(model, ids, tokens, extra)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    print(f"{args.variant}: first generate {generate(32):.1f} s")
    generate(32), generate(32)
    rounds = [(generate(32) - generate(1)) / 31 * 1e3 for _ in range(3)]
    print(f"{args.variant}: decode ms/token {', '.join(f'{r:.2f}' for r in rounds)}")
    n = 17
    many, many_count = kernels(lambda: workers.generate(model, ids, n, extra))
    one, one_count = kernels(lambda: workers.generate(model, ids, 1, extra))
    print(
        f"{args.variant}: GPU kernel time {(many - one) / (n - 1):.2f} ms a decode token, "
        f"{(many_count - one_count) / (n - 1):.0f} kernels a token"
    )
    profiler = cProfile.Profile()
    profiler.enable()
    workers.generate(model, ids, n, extra)
    torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(22)
    print(text.getvalue())


if __name__ == "__main__":
    main()
