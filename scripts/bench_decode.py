"""Greedy generation with transformers decoders, each way of compiling them, through `regionalize verify`.

Each model is a transformers decoder family (Llama, Qwen2, Mistral, Phi3; Gemma2 on request) built from
a small config with random weights, nothing downloaded, at several depths. Each one goes through
`regionalize verify <transformers' modeling_<family>.py> --workload generate` in its own process: the
rewrite of transformers' own file is checked (identical tokens, logits within tolerance), Dynamo's graphs,
recompiles and eager fallbacks are counted over the whole generation, time to first token is the first
call of fresh processes with an empty inductor cache, and decode time per token is steady state. The
variants are verify's: eager, full `torch.compile`, full with Dynamo's graph deduplication, the rewrite
(hierarchical: the decoder stack compiled whole, each layer a nested region) and its per-block form.

    python scripts/bench_decode.py [--families llama qwen2 mistral phi3] [--depths 12 32] [--tokens 16]
                                   [--repeats 1] [--device auto|cpu|cuda] [--cold] [--hot] [--cache static]
                                   [--out FOLDER]

`--families bart marian t5` measures encoder-decoders (an EncoderDecoderCache) the same way.

`--cache static` generates with transformers' fixed-size cache (`cache_implementation="static"`) instead of a
`DynamicCache`, and writes docs/results/decode-static.md and .json. `--hot` also times restarts: the first
token and the first generate of a process that finds the compile caches an earlier one left on disk, as
a restarted service does, beside full's.

writes docs/results/decode.md and docs/results/decode.json. Works with torch >= 2.5 and transformers >= 4.56.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "results"
# family -> (transformers class-name prefix, modeling module); each has `<Prefix>Config` and
# `<Prefix>ForCausalLM`.
FAMILIES = {
    "llama": ("Llama", "transformers.models.llama.modeling_llama"),
    "qwen2": ("Qwen2", "transformers.models.qwen2.modeling_qwen2"),
    "mistral": ("Mistral", "transformers.models.mistral.modeling_mistral"),
    "phi3": ("Phi3", "transformers.models.phi3.modeling_phi3"),
    "gemma2": ("Gemma2", "transformers.models.gemma2.modeling_gemma2"),
}
# Encoder-decoders on request: the model class, their config's names for the sizes below, and for the depth
# (of each side).
ENCODER_DECODERS: dict[str, tuple[str, dict[str, Any], tuple[str, ...]]] = {
    "bart": (
        "BartForConditionalGeneration",
        {
            "d_model": 64,
            "encoder_attention_heads": 4,
            "decoder_attention_heads": 4,
            "encoder_ffn_dim": 128,
            "decoder_ffn_dim": 128,
            "decoder_start_token_id": 2,
            "forced_eos_token_id": None,
        },
        ("encoder_layers", "decoder_layers"),
    ),
    "marian": (
        "MarianMTModel",
        {
            "d_model": 64,
            "encoder_attention_heads": 4,
            "decoder_attention_heads": 4,
            "encoder_ffn_dim": 128,
            "decoder_ffn_dim": 128,
            "decoder_start_token_id": 0,
            "forced_eos_token_id": None,
        },
        ("encoder_layers", "decoder_layers"),
    ),
    "t5": (
        "T5ForConditionalGeneration",
        {"d_model": 64, "d_kv": 16, "d_ff": 128, "num_heads": 4, "decoder_start_token_id": 0},
        ("num_layers",),
    ),
}
FAMILIES.update(
    bart=("Bart", "transformers.models.bart.modeling_bart"),
    marian=("Marian", "transformers.models.marian.modeling_marian"),
    t5=("T5", "transformers.models.t5.modeling_t5"),
)
DEFAULT_FAMILIES = ("llama", "qwen2", "mistral", "phi3")
DEPTHS = (12, 32)
VOCAB = 128
PROMPT_LEN = 16
# Small but shaped like the real thing: grouped-query attention (4 heads, 2 KV heads), head_dim 16.
CONFIG = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    # Special tokens inside the small vocabulary: min_new_tokens masks the EOS logit by index, and Phi3's
    # default pad_token_id (32000) would fall outside the embedding.
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def make(family: str, depth: int, module: ModuleType) -> tuple[Any, tuple[Any]]:
    """The factory `regionalize verify` calls with transformers' module (original or rewritten)."""
    import torch
    import transformers

    prefix, _ = FAMILIES[family]
    if family in ENCODER_DECODERS:
        name, sizes, depths = ENCODER_DECODERS[family]
        ids = {k: CONFIG[k] for k in ("vocab_size", "pad_token_id", "bos_token_id", "eos_token_id")}
        config = getattr(transformers, f"{prefix}Config")(**ids, **sizes, **dict.fromkeys(depths, depth))
    else:
        name = f"{prefix}ForCausalLM"
        config = getattr(transformers, f"{prefix}Config")(num_hidden_layers=depth, **CONFIG)
    model = getattr(module, name)(config)
    prompt_len = int(os.environ.get("BENCH_DECODE_PROMPT_LEN", PROMPT_LEN))
    # The prompt avoids the special tokens, as a tokenized text would.
    ids = torch.randint(3, VOCAB, (1, prompt_len), generator=torch.Generator().manual_seed(0))
    return model, (ids,)


def __getattr__(name: str) -> Callable[[ModuleType], Any]:
    """`make_<family>_<depth>`: the factory names the verifier is given, for any family and depth."""
    family, _, depth = name.removeprefix("make_").rpartition("_")
    if name.startswith("make_") and family in FAMILIES and depth.isdigit():
        return functools.partial(make, family, int(depth))
    raise AttributeError(name)


def modeling_file(family: str) -> str:
    import importlib

    return str(importlib.import_module(FAMILIES[family][1]).__file__)


def run(family: str, depth: int, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """One `regionalize verify` process (which starts its own fresh processes for the TTFT)."""
    label = f"{family}-{depth}"
    json_out = scratch / f"{label}.json"
    command = [
        sys.executable,
        "-m",
        "regionalize",
        "verify",
        modeling_file(family),
        "--factory",
        f"{Path(__file__).resolve()}:make_{family}_{depth}",
        "--workload",
        "generate",
        "--tokens",
        str(args.tokens),
        "--repeats",
        str(args.repeats),
        "--device",
        args.device,
        "--cache",
        args.cache,
        "--json",
        str(json_out),
    ]
    if not args.cold_start:
        command.append("--no-cold-start")
    elif not args.cold:
        # Warm processes (the first call after an unrelated compile), and with --hot restarted ones.
        command += ["--starts", "warm,hot" if args.hot else "warm"]
    env = dict(os.environ, BENCH_DECODE_PROMPT_LEN=str(args.prompt_len))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, check=False, timeout=args.timeout
        )
    except subprocess.TimeoutExpired:  # one model past its time is a row with its reason; the rest go on
        done = subprocess.CompletedProcess(command, 124, "", f"timed out after {args.timeout:.0f} s")
    wall = time.perf_counter() - start
    if json_out.is_file():
        result = json.loads(json_out.read_text())
    else:  # the verifier itself failed or timed out: keep what it said
        result = {"exit_code": done.returncode, "error": {"stage": "verify", "message": done.stderr[-2000:]}}
    result.update(label=label, family=family, depth=depth, wall_s=wall)
    print(f"== {label}: exit {done.returncode} in {wall:.0f} s: {summary(result)}", flush=True)
    if done.returncode == 2:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n", flush=True)
    return result


def summary(r: dict[str, Any]) -> str:
    if r.get("error"):
        return f"ERROR ({r['error']['stage']}): {r['error']['message'][:200]}"
    return (
        f"tokens identical {r['tokens_identical']}, graphs {r['graphs']}, recompiles {r['recompiles']}, "
        f"eager fallback {r['fell_back_to_eager']}, ttft {r['ttft_s']}, decode ms {r['decode_ms_per_token']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=list(DEFAULT_FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--depths", type=int, nargs="+", default=list(DEPTHS))
    parser.add_argument("--tokens", type=int, default=16, help="new tokens per generation")
    parser.add_argument("--prompt-len", type=int, default=PROMPT_LEN)
    parser.add_argument("--repeats", type=int, default=1, help="fresh processes per time-to-first-token")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--no-cold-start", dest="cold_start", action="store_false", help="skip TTFT")
    parser.add_argument("--cold", action="store_true", help="also time cold, hot and artifact processes")
    parser.add_argument(
        "--hot", action="store_true", help="also time restarts: processes that find a cold one's caches"
    )
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per model")
    parser.add_argument(
        "--cache", choices=["dynamic", "static"], default="dynamic", help="the KV cache generated with"
    )
    parser.add_argument("--out", type=Path, default=DOCS, help="folder for decode.md/.json")
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-decode-") as scratch:
        results = [
            run(family, depth, args, Path(scratch)) for depth in args.depths for family in args.families
        ]
    import torch
    import transformers

    from regionalize.codemod.runtime_copy import VERSION

    meta = {
        "date": str(datetime.date.today()),
        "command": shlex.join(["python", "scripts/bench_decode.py", *sys.argv[1:]]),
        "device": next((r["device"] for r in results if "device" in r), args.device),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "cpu_cores": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "runtime": VERSION,
        "tokens": args.tokens,
        "prompt_len": args.prompt_len,
        "cache": args.cache,
        "repeats": args.repeats,
        "wall_s": time.perf_counter() - started,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    everything = {"meta": meta, "results": results}
    stem = "decode" if args.cache == "dynamic" else f"decode-{args.cache}"
    (args.out / f"{stem}.json").write_text(json.dumps(everything, indent=2, default=str) + "\n")
    (args.out / f"{stem}.md").write_text(markdown(meta, results))
    print(f"wrote {args.out / f'{stem}.md'}, {args.out / f'{stem}.json'}")


VARIANTS = ("full", "full_dedup", "per_block", "regional")
CACHES = {"dynamic": "a DynamicCache", "static": 'a StaticCache (`cache_implementation="static"`)'}
# Restarted processes, each a column where some model measured it.
RESTARTS = (("hot TTFT", "compile_hot_s"), ("hot first generate", "first_generate_hot_s"))
LABELS = {"full": "full", "full_dedup": "full + dedup", "per_block": "per-block", "regional": "hierarchical"}


def _encoder_decoders(results: list[dict[str, Any]]) -> str:
    """What the header says of the encoder-decoders among `results`: nothing where there are none."""
    names = [{"bart": "BART"}.get(r["family"], FAMILIES[r["family"]][0]) for r in results]
    names = [name for name, r in zip(names, results, strict=True) if r["family"] in ENCODER_DECODERS]
    if not names:
        return ""
    listed = " and ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else names[0]
    return (
        f" (encoder-decoders: {listed} at d_model 64, 4 heads, feed-forward 128, the depth on each side, an "
        "EncoderDecoderCache)"
    )


def markdown(meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    from regionalize.bench.served import regions_text
    from regionalize.bench.zoo_report import against_full, form, measured

    device = meta["device"] + (f" ({meta['gpu']})" if meta["gpu"] and meta["device"] == "cuda" else "")
    encoder_decoders = _encoder_decoders(results)
    restarts = measured(RESTARTS, results)
    names = " / ".join(LABELS[v] for v in VARIANTS)
    lines = [
        "# Generation: each way of compiling transformers decoders",
        "",
        f"Measured by `{meta['command']}` on {meta['date']}: device {device}, torch {meta['torch']}, "
        f"transformers {meta['transformers']}, regionalize runtime {meta['runtime']}, "
        f"{meta['cpu_cores']} CPU cores ({meta['processor']}), Python {meta['python']}; "
        f"{meta['wall_s'] / 60:.0f} minutes in all.",
        "",
        f"Each model: a small config (hidden 64, 4 heads, 2 KV heads, head_dim 16, intermediate 128, vocab "
        f"{VOCAB}), random weights, a {meta['prompt_len']}-token prompt, greedy generation of "
        f"{meta['tokens']} tokens with {CACHES[meta.get('cache', 'dynamic')]}{encoder_decoders}, verified by "
        "`regionalize verify "
        "<modeling_<family>.py> --workload generate`. *Hierarchical* is the codemod's default rewrite of "
        "transformers' own file (the decoder stack compiled whole, each layer a nested region), *per-block* "
        "its `--form per-block` (each layer compiled on its own), *full* `torch.compile` of the whole "
        "model, *full + dedup* the same with `torch._dynamo.config.use_graph_deduplication`. *TTFT* (time "
        "to first token: prefill and one token) is the first call of a fresh process with an empty inductor "
        f"cache, after an unrelated warm-up compile, median of {meta['repeats']}; *first generate* the whole "
        "first generation, every compile of its tokens included, in a warm process of its own. *Hot* "
        "(where measured): the same in a process that finds the compile caches an earlier one left on "
        "disk, as a restarted service does (TTFT: a cold process's; first generate: the warm one's). "
        "*Decode* is steady state: "
        f"(time of {meta['tokens']} tokens - time of 1 token) / {meta['tokens'] - 1}, median of several "
        "rounds. *Regions* are the hierarchical rewrite's nested regions over one generation: traced, and "
        "reused (stamped out from one traced before).",
        "",
        f"| model | tokens identical | form | regions traced / reused | TTFT {names} "
        f"| TTFT full / hierarchical | first generate {names} | first generate full / hierarchical "
        + "".join(f"| {label} full / hierarchical " for label, _ in restarts)
        + f"| decode ms/token eager / {names} | decode hierarchical / full |",
        "|---|---|---|---|---|---|---|---|" + "---|" * len(restarts) + "---|---|",
    ]
    for r in results:
        if r.get("error"):
            lines.append(f"| {r['label']} | error ({r['error']['stage']}) |" + " |" * (8 + len(restarts)))
            continue
        ttft, decode = r["ttft_s"] or {}, r["decode_ms_per_token"] or {}
        whole = r.get("first_generate_s") or {}
        account = r["accounting"].get("regional", {})
        cells = [
            r["label"],
            "yes" if r["tokens_identical"] else "**NO**",
            form(r),
            regions_text(account),
            " / ".join(_s(ttft.get(v)) for v in VARIANTS),
            _x(ttft.get("full"), ttft.get("regional")),
            " / ".join(_s(whole.get(v)) for v in VARIANTS),
            _x(whole.get("full"), whole.get("regional")),
            *(against_full(r.get(key) or {}) for _, key in restarts),
            " / ".join(_ms(decode.get(v)) for v in ("eager", *VARIANTS)),
            _x(decode.get("regional"), decode.get("full")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for r in results:
        account = (r.get("accounting") or {}).get("regional")
        if account and (account["fallback"] or account["recompile_reasons"]):
            reasons = "; ".join(f"`{k}` x{n}" for k, n in list(account["recompile_reasons"].items())[:4])
            fallback = f" Fell back to eager: {account['fallback']}." if account["fallback"] else ""
            lines += [f"**{r['label']}**, hierarchical recompiles: {reasons}.{fallback}", ""]
    lines += ["Every fresh-process time to first token, in seconds:", ""]
    for r in results:
        for variant, runs in (r.get("compile_runs") or {}).items():
            times = {kind: got for kind, got in runs.items() if got and isinstance(got[0], float)}
            kinds = "; ".join(f"{kind} {', '.join(f'{s:.2f}' for s in got)}" for kind, got in times.items())
            lines.append(f"- {r['label']} {LABELS.get(variant, variant)}: {kinds}")
            found = runs.get("saved_hot")
            if found:  # saved owners (on by default): what the restart found
                owners = ", ".join(f"{name} {what}" for name, what in found[-1].items())
                lines.append(f"  - saved owners, hot: {owners}; {runs['saved_bytes'][-1] / 1e6:.1f} MB")
    return "\n".join(lines) + "\n"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:.2g}"


def _x(over: float | None, under: float | None) -> str:
    return f"{over / under:.2f}x" if over is not None and under else "-"


if __name__ == "__main__":
    main()
