"""The README's "What to expect", rendered from the results files the benchmark scripts wrote.

Every figure of that section is read here from docs/results/**/*.json, never typed: `python
scripts/render_docs.py` writes it between its markers, and tests/test_quoted_figures.py fails when the
README holds anything else. Each row compares one way of compiling against a full `torch.compile` of the
same model, in the same sitting; each column reads one way (x sooner: higher is better; x its time:
lower is better), with the seconds the ratio comes from beside it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"

Run = dict[str, Any]
# A run's (full compile's, other's) figure for one column; None where the run has none.
Pair = Callable[[Run], tuple[float, float] | None]


@dataclass(frozen=True)
class Source:
    """A results file, the page rendered from it (which the README links), and its runs."""

    json: str  # relative to docs/results
    page: str  # relative to docs/results
    label: str

    def data(self) -> Any:
        return json.loads((RESULTS / self.json).read_text(encoding="utf-8"))

    def stamp(self) -> tuple[str, str]:
        """The run's date and runtime, as its page's header states them."""
        data = self.data()
        meta = data.get("meta", data) if isinstance(data, dict) else data[-1]
        prepared = meta.get("prepared", {})
        when = meta.get("date") or f"torch {meta.get('torch', '?')}, no date in {Path(self.json).name}"
        return str(when), str(meta.get("runtime", prepared.get("runtime", "")))


FORWARD = Source("forward/forward.json", "forward/forward.md", "forward")
STOCHASTIC = Source("forward/stochastic-depth.json", "forward/stochastic-depth.md", "stochastic depth")
DECODE = Source("decode.json", "decode.md", "decode")
STATIC = Source("decode-static.json", "decode-static.md", "static")
ENCODER_DECODERS = Source("encoder-decoders/decode.json", "encoder-decoders/decode.md", "encoder-decoders")
CUDA = Source("cuda.json", "cuda.md", "CUDA")
SERVING = Source("serving/serving.json", "serving/serving.md", "serving")
VERSIONS = Source("torch-versions/versions.json", "torch-versions/versions.md", "by torch")
RESTART = Source("restart.json", "restart.md", "restart")
RESTART_DECODE = Source("restart-decode/decode.json", "restart-decode/decode.md", "decoder restart")
SOURCES = (
    FORWARD,
    STOCHASTIC,
    DECODE,
    STATIC,
    ENCODER_DECODERS,
    CUDA,
    SERVING,
    VERSIONS,
    RESTART,
    RESTART_DECODE,
)


def runs(source: Source) -> list[Run]:
    """One result per model, named under "name", as the script wrote it."""
    data = source.data()
    if "models" in data:  # a verify manifest's run
        return [{**m["result"], "name": m["name"]} for m in data["models"]]
    return [{**r, "name": f"{r['family']}-{r['depth']}"} for r in data["results"]]


def pair(key: str, form: str, scale: float = 1.0) -> Pair:
    def read(run: Run) -> tuple[float, float] | None:
        values = run.get(key) or {}
        if values.get("full") is None or values.get(form) is None:
            return None
        return values["full"] * scale, values[form] * scale

    return read


def seconds(value: float) -> str:
    return f"{value:.1f} s"


def millis(value: float) -> str:
    return f"{value:.2f} ms"


def span(items: list[Run], read: Pair, unit: Callable[[float], str], sooner: bool) -> str:
    """The lowest and highest ratio over the runs, each with its model and seconds: '2.01x (vit-12, 11.5
    s → 5.7 s) to 4.71x (gpt-32, 24.1 s → 5.1 s)'; '-' where no run has the figure."""
    rows = [(run["name"], got) for run in items if (got := read(run)) is not None]
    if not rows:
        return "not measured"

    def ratio(got: tuple[float, float]) -> float:
        return got[0] / got[1] if sooner else got[1] / got[0]

    rows.sort(key=lambda row: ratio(row[1]))
    shown = [rows[0]] if len(rows) == 1 else [rows[0], rows[-1]]
    text = [f"{ratio(got):.2f}x ({name}, {unit(got[0])} → {unit(got[1])})" for name, got in shown]
    return " to ".join(text)


@dataclass(frozen=True)
class Row:
    workload: str
    source: Source
    items: list[Run]
    first: Pair
    restart: Pair
    per_call: Pair
    per_unit: Callable[[float], str] = millis
    default_form: bool = True  # the rewrite in its default form: counted in the summary's ranges

    def render(self) -> str:
        date, runtime = self.source.stamp()
        stamp = f"{date}, runtime {runtime}" if runtime else date
        cells = [
            self.workload,
            span(self.items, self.first, seconds, sooner=True),
            span(self.items, self.restart, seconds, sooner=True),
            span(self.items, self.per_call, self.per_unit, sooner=False),
            f"[{self.source.label}](docs/results/{self.source.page}) ({stamp})",
        ]
        return "| " + " | ".join(cells) + " |"


def _cuda_runs() -> list[Run]:
    """The GPT-style model at batch 1, the rewrite's CUDA-graph form against full `reduce-overhead`."""
    rows = {r["variant"]: r for r in CUDA.data()["results"] if r["model"] == "gpt" and r["batch"] == 1}
    full, rewrite = rows["full_reduce_overhead"], rows["hierarchical_cuda_graphs"]
    return [
        {
            "name": "gpt-32",
            "first": {"full": full["first_call_s"], "regional": rewrite["first_call_s"]},
            "ms": {"full": full["ms_per_call"]["median"], "regional": rewrite["ms_per_call"]["median"]},
        }
    ]


def _restart_runs() -> list[Run]:
    """The restart page's model at each depth: the default's (saved owners) cold start, hot start and time
    a call against the full compile's, medians of one sitting (scripts/bench_restart.py)."""
    summary = RESTART.data()["summary"]

    def both(depth: int, kind: str, figure: str) -> dict[str, float | None]:
        return {
            name: summary.get(f"{depth} {mode} {kind}", {}).get(figure)
            for name, mode in (("full", "full"), ("regional", "saved"))
        }

    return [
        {
            "name": f"vit-{depth}",
            "cold": both(depth, "cold", "first_call_s"),
            "hot": both(depth, "hot", "first_call_s"),
            "ms": both(depth, "hot", "per_call_ms"),
        }
        for depth in RESTART.data()["meta"]["depths"]
    ]


def _serving_sitting(variant: str) -> str:
    """serving.json keeps each variant's latest run, which may be another sitting than full's: say so, as
    its page asks to compare rows of one run."""
    rows = SERVING.data()["results"]
    full, other = rows["full"].get("date"), rows[variant].get("date")
    return "" if full == other else f", measured {other}, full {full}: another sitting"


def _serving_runs(variant: str) -> list[Run]:
    """Serving's full compile against one variant: first generate, its restart, decode a token."""
    rows = SERVING.data()["results"]
    full, other = rows["full"], rows[variant]
    keys = ("first_generate_s", "restart_first_generate_s", "decode_ms_per_token")
    return [{"name": "llama-8b-shape", **{k: {"full": full.get(k), variant: other.get(k)} for k in keys}}]


def table() -> list[Row]:
    forward, decoders = runs(FORWARD), [r for r in runs(DECODE) if r["depth"] == 32]
    reduce = "`--mode reduce-overhead`"
    return [
        Row("forward, CPU: the rewrite", FORWARD, forward, *_forward("regional")),
        Row(
            "forward, CPU: torch's `use_graph_deduplication`, no rewrite",
            FORWARD,
            forward,
            *_forward("full_dedup"),
        ),
        Row("forward, CPU: `--form per-block`", FORWARD, forward, *_forward("per_block"), default_form=False),
        Row(
            "forward with stochastic depth, CPU: the rewrite",
            STOCHASTIC,
            runs(STOCHASTIC),
            *_forward("regional"),
        ),
        Row(
            "generate with a `DynamicCache`, CPU, 32 layers: the rewrite (first token; per token)",
            DECODE,
            decoders,
            pair("ttft_s", "regional"),
            pair("compile_hot_s", "regional"),
            pair("decode_ms_per_token", "regional"),
        ),
        Row(
            "the same, `--form per-block`",
            DECODE,
            decoders,
            pair("ttft_s", "per_block"),
            pair("compile_hot_s", "per_block"),
            pair("decode_ms_per_token", "per_block"),
            default_form=False,
        ),
        Row(
            "generate with a `StaticCache`, CPU: the rewrite (first generate; per token)",
            STATIC,
            [r for r in runs(STATIC) if r["depth"] == 32],
            pair("first_generate_s", "regional"),
            pair("first_generate_hot_s", "regional"),
            pair("decode_ms_per_token", "regional"),
        ),
        Row(
            "restarts, CPU, a ViT-like encoder of 12 to 64 blocks: the rewrite, its owners saved (first call "
            "with empty caches; restarted; per call)",
            RESTART,
            _restart_runs(),
            pair("cold", "regional"),
            pair("hot", "regional"),
            pair("ms", "regional"),
        ),
        Row(
            "generate with a `DynamicCache`, CPU, llama-32, its owners saved (first token; per token)",
            RESTART_DECODE,
            runs(RESTART_DECODE),
            pair("ttft_s", "regional"),
            pair("compile_hot_s", "regional"),
            pair("decode_ms_per_token", "regional"),
        ),
        Row(
            "encoder-decoders, CPU: the rewrite (first token; per token)",
            ENCODER_DECODERS,
            runs(ENCODER_DECODERS),
            pair("ttft_s", "regional"),
            pair("compile_hot_s", "regional"),
            pair("decode_ms_per_token", "regional"),
        ),
        Row(
            f"forward, H100, {reduce}: the rewrite against full {reduce}",
            CUDA,
            _cuda_runs(),
            pair("first", "regional"),
            pair("restart", "regional"),
            pair("ms", "regional"),
        ),
        *(
            Row(
                f"serving, H200, bf16, 32 tokens: {what} "
                f"(first generate; per token{_serving_sitting(variant)})",
                SERVING,
                _serving_runs(variant),
                pair("first_generate_s", variant),
                pair("restart_first_generate_s", variant),
                pair("decode_ms_per_token", variant),
                default_form=variant != "transformers_static",
            )
            for what, variant in (
                (f"the rewrite, static cache, {reduce}", "rewrite_static_cuda_graphs"),
                ("transformers' own static-cache path, no rewrite", "transformers_static"),
            )
        ),
    ]


def _forward(form: str) -> tuple[Pair, Pair, Pair]:
    return pair("compile_s", form), pair("compile_hot_s", form), pair("steady_us", form, scale=1e-3)


HEADER = (
    "| workload | first call: x sooner than a full compile (higher is better) | restarted, caches on disk: "
    "x sooner | per call: x a full compile's time (lower is better) | measured |\n|---|---|---|---|---|"
)


def by_torch() -> str:
    """One line a torch version: the default rewrite against a full compile on that torch."""
    lines = []
    for run in VERSIONS.data():
        items = [{**result, "name": name} for name, result in run["models"].items()]
        first = span(items, pair_of("first_s"), seconds, sooner=True)
        per = span(items, pair_of("ms"), millis, sooner=False)
        version = run["versions"]["torch"].split("+")[0]
        lines.append(f"| {version} | {first} | {per} |")
    head = "| torch | first call: x sooner | per call: x a full compile's time |\n|---|---|---|"
    return head + "\n" + "\n".join(lines)


def pair_of(key: str) -> Pair:
    """versions.json keeps each form's figures under the form: {"full": {"first_s": ..}, ..}."""

    def read(run: Run) -> tuple[float, float] | None:
        full, regional = run.get("full") or {}, run.get("regional") or {}
        if full.get(key) is None or regional.get(key) is None:
            return None
        return full[key], regional[key]

    return read


def summary() -> str:
    """The claim, worded as the rows show it: the default form's ranges over every row that measures it."""
    rows = [row for row in table() if row.default_form]
    firsts = [ratio for row in rows for ratio in _ratios(row.items, row.first, sooner=True)]
    calls = [ratio for row in rows for ratio in _ratios(row.items, row.per_call, sooner=False)]
    return (
        f"Rewritten in the default form, the first call came {min(firsts):.2f}x to {max(firsts):.2f}x sooner "
        f"than a full compile's in these rows (below 1.00x: later), and a call then took {min(calls):.2f}x "
        f"to {max(calls):.2f}x a full compile's time (above 1.00x: slower)."
    )


def _ratios(items: list[Run], read: Pair, sooner: bool) -> list[float]:
    pairs = [got for run in items if (got := read(run)) is not None]
    return [full / other if sooner else other / full for full, other in pairs]


def headline() -> str:
    """The example a reader remembers: GPT-32's first call, three ways, in seconds."""
    gpt = next(r for r in runs(FORWARD) if r["name"] == "gpt-32")["compile_s"]
    return (
        f"On a 2-core CPU (torch 2.13, [forward](docs/results/{FORWARD.page})), GPT-32's first call takes "
        f"{seconds(gpt['full'])} with a full `torch.compile`, {seconds(gpt['full_dedup'])} with torch's "
        f"`use_graph_deduplication` and {seconds(gpt['regional'])} rewritten."
    )


def what_to_expect() -> str:
    """The README's block between its markers."""
    rows = "\n".join(row.render() for row in table())
    versions = (
        f"By torch version ([the table](docs/results/{VERSIONS.page}); GPT-style and Llama forward, "
        "Llama and "
        "Qwen2 generate, 32 layers, CPU; the default rewrite against a full compile):"
    )
    return f"{headline()} {summary()}\n\n{HEADER}\n{rows}\n\n{versions}\n\n{by_torch()}\n"


def _range(values: list[float], decimals: int = 2) -> str:
    return f"{min(values):.{decimals}f}x to {max(values):.{decimals}f}x"


def decode_section() -> str:
    """form-caches.md's account of the generation benchmark, from decode.json: the latest run's figures."""
    meta, items = DECODE.data()["meta"], [r for r in runs(DECODE) if r["depth"] == 32]
    families = (
        ", ".join(r["family"].capitalize() for r in items[:-1]) + f" and {items[-1]['family'].capitalize()}"
    )
    eager = [r["decode_ms_per_token"]["eager"] for r in items]
    ratio = {k: _ratios(items, pair(k, "regional"), sooner=True) for k in ("ttft_s", "compile_hot_s")}
    generate_hot = _ratios(items, pair("first_generate_hot_s", "regional"), sooner=True)
    late = [r["ttft_s"]["regional"] / r["ttft_s"]["per_block"] for r in items]
    decode = _ratios(items, pair("decode_ms_per_token", "regional"), sooner=False)
    per_block = _ratios(items, pair("decode_ms_per_token", "per_block"), sooner=False)
    slower = sum(r["decode_ms_per_token"]["per_block"] > r["decode_ms_per_token"]["eager"] for r in items)
    same = all(r["tokens_identical"] and not r["fell_back_to_eager"] for r in items)
    first, hot = _range(ratio["ttft_s"]), _range(ratio["compile_hot_s"])
    return (
        f"Measured in [decode.md](results/decode.md) (CPU, {families} at 32 layers, greedy generation, "
        f"runtime {meta['runtime']}, {meta['date']}; eager decoded at {min(eager):.1f} to "
        f"{max(eager):.1f} ms a token in that sitting, so read the ratios, not the seconds; written from "
        "decode.json by `python scripts/render_docs.py`):\n"
        + ("- Every family generated the original's tokens, with no fallback.\n" if same else "")
        + f"- The first token came {first} sooner than with a full compile, and {_range(late, 1)} as late as "
        "with the per-block form. Restarted, with the compile caches an earlier process left on disk, it "
        f"came {hot} sooner than a full compile's restart, and the first generate {_range(generate_hot)} "
        "sooner.\n"
        f"- Decoding took {_range(decode)} a full compile's time per token, where the per-block form took "
        f"{_range(per_block, 1)} and was slower than eager on {slower} of the {len(items)}.\n"
    )


def serving_section() -> str:
    """form-cuda-graphs.md's figures of the CUDA-graph rewrite served on the H200, from serving.json."""
    rows, checks = SERVING.data()["results"], SERVING.data()["token_check"]
    full, ours, theirs = rows["full"], rows["rewrite_static_cuda_graphs"], rows["transformers_static"]
    first, full_first, their_first = (r["first_generate_s"] for r in (ours, full, theirs))
    tokens = (
        "eager's tokens" if checks["rewrite_static_cuda_graphs"]["verdict"] == "identical" else "other tokens"
    )
    return (
        "On the H200 ([serving.md](results/serving/serving.md), its latest run of each variant; written "
        "from serving.json by `python scripts/render_docs.py`) the `--mode reduce-overhead` rewrite served "
        f'through `generate(cache_implementation="static")` reached its first generate in {first:.1f} s, '
        f"{full_first / first:.2f}x sooner than a full compile ({full_first:.1f} s, measured {full['date']}) "
        f"and {their_first / first:.2f}x sooner than transformers' own compile of the original "
        f"({their_first:.1f} s, measured {theirs['date']}; the rewrite {ours['date']}), with {tokens} in "
        f"fp32; it decoded at {ours['decode_ms_per_token']:.2f} ms a token against transformers' "
        f"{theirs['decode_ms_per_token']:.2f} ms.\n"
    )
