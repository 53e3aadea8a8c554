"""What each fresh process of the serving benchmark measures: a variant's first generate and decode, its
restart, its fp32 tokens, the device's bandwidth. A worker's `phases` say where its process's time went
(from its start, `spawned` in the job), so that a sitting's length can be read from its rows."""

from __future__ import annotations

import contextlib
import importlib
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from .rewrites import load_rewritten
from .settings import MODELING, SPECIAL, VARIANTS


class Phases(dict):
    """Seconds each stage of a worker took, by name; `start_s` is the process's start and the script's
    imports, before the worker ran."""

    def __init__(self, job: dict[str, Any]) -> None:
        super().__init__(start_s=time.time() - job["spawned"])

    @contextlib.contextmanager
    def __call__(self, name: str) -> Any:
        start = time.perf_counter()
        yield
        self[f"{name}_s"] = time.perf_counter() - start


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn: Any, device: str) -> tuple[float, Any]:
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - start, out


def warm_up(device: str) -> None:
    """A compile unrelated to the model: the backend's one-time start-up is not the model's."""
    import torch

    def unrelated(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x @ x.T).softmax(-1).sum(0)

    torch.compile(unrelated)(torch.randn(32, 32, device=device))
    sync(device)


def build(job: dict[str, Any], variant: str, sizes: dict[str, int], dtype_name: str) -> tuple[Any, dict]:
    """The variant's model (weights from seed 0, built on the device) and the keywords of its generate."""
    import torch
    import transformers

    rewrite, how, cache = VARIANTS[variant]
    if rewrite is None:
        module = importlib.import_module(MODELING)
    else:
        module = load_rewritten(Path(job["prepared"]), rewrite)
    config = transformers.LlamaConfig(**sizes, **SPECIAL)
    torch.manual_seed(0)
    with torch.device(job["device"]):
        model = module.LlamaForCausalLM._from_config(config, dtype=getattr(torch, dtype_name))
    model.eval()
    if how == "full":
        model.forward = torch.compile(model.forward)
    elif how == "accelerate":
        from accelerate.utils import compile_regions

        model = compile_regions(model)
    extra = {"cache_implementation": "static"} if cache == "static" else {"disable_compile": True}
    return model, extra


def prompt(job: dict[str, Any], vocab: int) -> Any:
    import torch

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (1, job["prompt_len"]), generator=generator)
    return ids.to(job["device"])


def generate(model: Any, ids: Any, tokens: int, extra: dict[str, Any]) -> Any:
    import torch

    with torch.no_grad():
        return model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=False,
            **extra,
        )


def dynamo_account(body: Any) -> tuple[Any, dict[str, Any]]:
    """Run `body`, with what Dynamo did in it: regionalize's accounting where it imports (graph breaks,
    recompiles, eager fallback at a recompile limit), else Dynamo's counters alone."""
    from torch._dynamo.utils import counters

    try:
        from regionalize.bench.accounting import recording
    except Exception:  # optional: the verifier may be elsewhere or changing
        recording = None
    if recording is None:
        counters.clear()
    with recording() if recording is not None else contextlib.nullcontext() as account:
        out = body()
    found: dict[str, Any] = {
        "graph_breaks": sum(counters["graph_break"].values()),
        "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
        "fell_back_to_eager": None,
    }
    if account is not None:
        found.update(account.to_json())
    return out, found


def served_forms(model: Any) -> dict[str, str] | None:
    try:
        from regionalize.bench.accounting import served_forms as forms
    except Exception:
        return None
    return forms(model)


def restart_worker(job: dict[str, Any]) -> dict[str, Any]:
    """A restarted service's first generate: the compile caches an earlier process left on disk found, no
    warm-up compile first (as `regionalize verify` times a hot start)."""
    phases = Phases(job)
    with phases("imports"):
        import torch
        import transformers  # noqa: F401  (timed with the imports, not with the build)
    with phases("build"):
        model, extra = build(job, job["variant"], job["model"], job["dtype"])
        ids = prompt(job, job["model"]["vocab_size"])
        # torch.compile's own imports paid before the clock starts, as the variants that call it at build do.
        torch.compile(lambda: None)
    first, _ = timed(lambda: generate(model, ids, job["tokens"], extra), job["device"])
    return {"variant": job["variant"], "first_generate_s": first, "phases": phases}


def variant_worker(job: dict[str, Any]) -> dict[str, Any]:
    phases = Phases(job)
    with phases("imports"):
        import torch
        import transformers  # noqa: F401  (as in restart_worker)

    device, variant = job["device"], job["variant"]
    with phases("warm_up"):
        warm_up(device)
    with phases("build"):
        model, extra = build(job, variant, job["model"], job["dtype"])
        ids = prompt(job, job["model"]["vocab_size"])
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    (first, _), account = dynamo_account(
        lambda: timed(lambda: generate(model, ids, job["tokens"], extra), device)
    )
    rounds = []
    with phases("decode"):
        generate(model, ids, 1, extra)  # untimed: whatever the one-token call alone compiles or captures
        generate(model, ids, job["tokens"], extra)
        for _ in range(job["rounds"]):
            one, _ = timed(lambda: generate(model, ids, 1, extra), device)
            many, _ = timed(lambda: generate(model, ids, job["tokens"], extra), device)
            rounds.append(
                {"generate_1_s": one, "generate_n_s": many, "ms": (many - one) / (job["tokens"] - 1) * 1e3}
            )
        from torch._dynamo.utils import counters

        account["cudagraph_skips_all"] = counters["inductor"]["cudagraph_skips"]
        account["cuda_graphs_per_token"] = graphs_per_token(model, ids, job["tokens"], extra)
    return {
        "phases": phases,
        "variant": variant,
        "first_generate_s": first,
        "decode_ms_per_token": statistics.median(r["ms"] for r in rounds),
        "rounds": rounds,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
        "dynamo": account,
        "forms": served_forms(model) if VARIANTS[variant][0] is not None else None,
    }


def graphs_per_token(model: Any, ids: Any, tokens: int, extra: dict[str, Any]) -> float | None:
    """CUDA graphs replayed per decode token, steady: (replays in generate(tokens) - in generate(1)) /
    (tokens - 1). None where regionalize's accounting does not import or no CUDA device is."""
    try:
        from regionalize.bench.accounting import counting_cuda_graphs
    except Exception:  # optional, as in dynamo_account
        return None
    replays = []
    for n in (1, tokens):
        with counting_cuda_graphs() as count:
            generate(model, ids, n, extra)
        if count is None:
            return None
        replays.append(count.replayed)
    return (replays[1] - replays[0]) / (tokens - 1)


def tokens_worker(job: dict[str, Any]) -> dict[str, Any]:
    """The fp32 check of one variant: its tokens on the small config (compared with eager's by the caller)."""
    sizes = job["check_model"]
    model, extra = build(job, job["variant"], sizes, "float32")
    ids = prompt(job, sizes["vocab_size"])
    return {"tokens": generate(model, ids, job["tokens"], extra)[0, job["prompt_len"] :].tolist()}


def bandwidth_worker(job: dict[str, Any]) -> dict[str, Any]:
    """Weight bytes (the model built on the meta device) and the device's copy bandwidth."""
    import torch
    import transformers

    config = transformers.LlamaConfig(**job["model"], **SPECIAL)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM._from_config(config, dtype=getattr(torch, job["dtype"]))
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    device, size, copies = job["device"], job["copy_bytes"], 10
    src = torch.randint(0, 255, (size,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    samples = []
    for _ in range(7):
        seconds, _ = timed(lambda: [dst.copy_(src) for _ in range(copies)], device)
        samples.append(seconds / copies)
    per_copy = statistics.median(samples)
    bandwidth = 2 * size / per_copy
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    versions["transformers"] = transformers.__version__
    with contextlib.suppress(ImportError):
        import accelerate

        versions["accelerate"] = accelerate.__version__
    return {
        "device_name": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "CPU",
        "versions": versions,
        "weight_bytes": weight_bytes,
        "copy_bytes": size,
        "copy_s": samples,
        "bandwidth_gb_s": bandwidth / 1e9,
        "limit_ms_per_token": weight_bytes / bandwidth * 1e3,
    }


WORKERS = {
    "variant": variant_worker,
    "restart": restart_worker,
    "tokens": tokens_worker,
    "bandwidth": bandwidth_worker,
}
