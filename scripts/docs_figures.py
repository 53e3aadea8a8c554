"""The README's "What to expect", docs/benchmarks.md's full table and the restart picture, rendered from
the results files the benchmark scripts wrote.

Every figure of those is read here from docs/results/**/*.json, never typed: `python
scripts/render_docs.py` writes them (the pages between their markers, docs/results/restart.svg whole),
and tests/test_quoted_figures.py fails when a page or the picture holds anything else. Each row compares
one way of compiling against a full `torch.compile` of the same model, in the same sitting; each column
reads one way (x sooner: higher is better; x its time: lower is better), with the seconds the ratio
comes from beside it. The README shows one row a family of models (`Row.family`); the benchmarks page
shows every row.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from bench_train import median as train_median

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
RESTART_ENCODER_DECODERS = Source(
    "restart-decode/encoder-decoders/decode.json",
    "restart-decode/encoder-decoders/decode.md",
    "encoder-decoder restart",
)
TRAIN = Source("train/train.json", "train/train.md", "training")
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
    RESTART_ENCODER_DECODERS,
    TRAIN,
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
    family: str = ""  # the README's label where this row stands for its family of models; "" where not shown
    restarts: Source | None = None  # where the restarts were measured, where not in `source`'s runs

    def render(self, base: str, label: str = "") -> str:
        """The table's line: `base` is docs/results/ as the page links it, `label` the first cell if set."""
        restarts = runs(self.restarts) if self.restarts else self.items
        measured = [_measured(self.source, base)]
        if self.restarts:
            measured.append(f"restarts: {_measured(self.restarts, base)}")
        cells = [
            label or self.workload,
            span(self.items, self.first, seconds, sooner=True),
            span(restarts, self.restart, seconds, sooner=True),
            span(self.items, self.per_call, self.per_unit, sooner=False),
            "; ".join(measured),
        ]
        return "| " + " | ".join(cells) + " |"


def _measured(source: Source, base: str) -> str:
    """The link to a source's page, with the date and runtime of its run."""
    date, runtime = source.stamp()
    return f"[{source.label}]({base}{source.page}) ({f'{date}, runtime {runtime}' if runtime else date})"


def names(items: list[Run]) -> str:
    """The models a row measured, as the table names them: 'gpt-32, bert-12 and vit-12'."""
    found = list(dict.fromkeys(run["name"] for run in items))
    return found[0] if len(found) == 1 else ", ".join(found[:-1]) + f" and {found[-1]}"


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


def _restart_depths() -> str:
    depths = RESTART.data()["meta"]["depths"]
    return f"{min(depths)} to {max(depths)} blocks" if len(depths) > 1 else f"{depths[0]} blocks"


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


def _train_runs(method: str) -> list[Run]:
    """Each model of the training page: `method`'s first step, restart and time a step against the full
    compile's, medians of one sitting; per step from the steps taking turns where they were timed
    (scripts/bench_train.py)."""

    def both(cells: dict[str, list[Run]], kinds: tuple[str, ...], figure: str) -> dict[str, float | None]:
        return {
            name: train_median(cells, key, kinds, figure)
            for name, key in (("full", "full"), ("regional", method))
        }

    found = []
    for name, cells in TRAIN.data()["cells"].items():
        turns = ("interleaved",) if "interleaved" in cells else ("cold", "hot")
        found.append(
            {
                "name": name,
                "first": both(cells, ("cold",), "first_step_s"),
                "restart": both(cells, ("hot",), "first_step_s"),
                "step": both(cells, turns, "per_step_ms"),
            }
        )
    return found


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
    encoder_decoders, serving = runs(ENCODER_DECODERS), _serving_runs("rewrite_static_cuda_graphs")
    train = _train_runs("regions")
    reduce = "`--mode reduce-overhead`"
    return [
        Row(
            "forward, CPU: the rewrite",
            FORWARD,
            forward,
            *_forward("regional"),
            family=f"forward, CPU ({names(forward)})",
        ),
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
            family=f"generate with a `DynamicCache`, CPU ({names(decoders)}; first token; per token)",
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
            f"restarts, CPU, a ViT-like encoder of {_restart_depths()}: the rewrite, its owners saved (first "
            "call with empty caches; restarted; per call)",
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
            "encoder-decoders, CPU: the rewrite (first generate; per token)",
            ENCODER_DECODERS,
            encoder_decoders,
            pair("first_generate_s", "regional"),
            pair("first_generate_hot_s", "regional"),
            pair("decode_ms_per_token", "regional"),
            family=f"encoder-decoders, CPU ({names(encoder_decoders)}; first generate; per token)",
            restarts=RESTART_ENCODER_DECODERS,
        ),
        Row(
            "training, CPU, forward, backward and AdamW: `compile_regions` (first step; per step)",
            TRAIN,
            train,
            pair("first", "regional"),
            pair("restart", "regional"),
            pair("step", "regional"),
            family=f"training, CPU ({names(train)}; first step; per step)",
        ),
        Row(
            "the same, `block.compile()` each block, as torchtitan compiles for training",
            TRAIN,
            _train_runs("per-block"),
            pair("first", "regional"),
            pair("restart", "regional"),
            pair("step", "regional"),
            default_form=False,
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
                family=family,
            )
            for what, variant, family in (
                (
                    f"the rewrite, static cache, {reduce}",
                    "rewrite_static_cuda_graphs",
                    f"serving, H200 GPU, bf16 ({names(serving)}, 32 tokens, static cache, {reduce}; first "
                    f"generate; per token{_serving_sitting('rewrite_static_cuda_graphs')})",
                ),
                ("transformers' own static-cache path, no rewrite", "transformers_static", ""),
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


def summary(rows: list[Row]) -> str:
    """The claim, worded as the rows show it: the default form's ranges over every row that measures it."""
    rows = [row for row in rows if row.default_form]
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


def headline(base: str) -> str:
    """The example a reader remembers: GPT-32's first call, three ways, in seconds."""
    gpt = next(r for r in runs(FORWARD) if r["name"] == "gpt-32")["compile_s"]
    return (
        f"On a 2-core CPU (torch 2.13, [forward]({base}{FORWARD.page})), GPT-32's first call takes "
        f"{seconds(gpt['full'])} with a full `torch.compile`, {seconds(gpt['full_dedup'])} with torch's "
        f"`use_graph_deduplication` and {seconds(gpt['regional'])} rewritten."
    )


def picture(base: str) -> str:
    """The restart picture's image line, its alt text the figures it draws."""
    return f"![{restart_alt()}]({base}{PICTURE.name})"


def what_to_expect() -> str:
    """The README's block between its markers: one row a family of models, and the restart picture."""
    rows, base = [row for row in table() if row.family], "docs/results/"
    lines = "\n".join(row.render(base, row.family) for row in rows)
    return f"{headline(base)} {summary(rows)}\n\n{HEADER}\n{lines}\n\n{picture(base)}\n"


def benchmarks() -> str:
    """docs/benchmarks.md's block between its markers: every row, the picture, and the torch versions."""
    rows, base = table(), "results/"
    lines = "\n".join(row.render(base) for row in rows)
    versions = (
        f"By torch version ([the table]({base}{VERSIONS.page}); GPT-style and Llama forward, Llama and "
        "Qwen2 generate, 32 layers, CPU; the default rewrite against a full compile):"
    )
    return (
        f"{headline(base)} {summary(rows)}\n\n{HEADER}\n{lines}\n\n{picture(base)}\n\n{versions}\n\n"
        f"{by_torch()}\n"
    )


# -- the picture: seconds to the first call against depth, from restart.json ----------------------------

PICTURE = RESULTS / "restart.svg"
# restart.json's mode, the legend's words, the colour
LINES = (
    ("full", "full torch.compile(model)", "#c0392b"),
    ("saved", "regionalize, saved owners (the default)", "#1f6fb4"),
)
PANELS = (("cold", "empty caches: the first start"), ("hot", "restarted: the caches on disk"))


def _restart_seconds() -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(mode, cold or hot) -> [(depth, seconds from torch's import to the first call's output)], by depth."""
    data = RESTART.data()
    found: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for mode, _, _ in LINES:
        for kind, _ in PANELS:
            points = []
            for depth in sorted(data["meta"]["depths"]):
                value = data["summary"].get(f"{depth} {mode} {kind}", {}).get("first_call_s")
                if value is not None:
                    points.append((depth, value))
            found[mode, kind] = points
    return found


def restart_alt() -> str:
    """The picture in words: each line's seconds at the shallowest and at the deepest model it measured."""
    points = _restart_seconds()

    def ends(mode: str, kind: str) -> str:
        got = [value for _, value in points[mode, kind]]
        if not got:
            return "not measured"
        return seconds(got[0]) if len(got) == 1 else f"{seconds(got[0])} to {seconds(got[-1])}"

    several = len(RESTART.data()["meta"]["depths"]) > 1
    return (
        f"Seconds to the first call of a ViT-like encoder on a CPU, {_restart_depths()}"
        f"{' (shallowest to deepest)' if several else ''}: with empty caches, a full torch.compile takes "
        f"{ends('full', 'cold')} and regionalize {ends('saved', 'cold')}; restarted, {ends('full', 'hot')} "
        f"against {ends('saved', 'hot')}"
    )


def _step(top: float) -> float:
    """A round step that puts four to eight ticks under `top`."""
    for scale in (0.1, 1.0, 10.0, 100.0):
        for step in (1.0, 2.0, 5.0):
            if top / (step * scale) <= 6:
                return step * scale
    return 1000.0


def restart_svg() -> str:
    """docs/results/restart.svg: two panels, empty caches and restarted, each a polyline a mode."""
    meta, points = RESTART.data()["meta"], _restart_seconds()
    depths = sorted(meta["depths"])
    width, height, left, gap, top, bottom = 800, 360, 56, 120, 96, 310
    panel = (width - left - gap - 60) / 2
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f"<title>{escape(restart_alt())}</title>",
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{width / 2:.1f}" y="22" text-anchor="middle" font-size="15">Seconds to the first call by '
        "depth, a ViT-like encoder: a full torch.compile against regionalize</text>",
        f'<text x="{width / 2:.1f}" y="40" text-anchor="middle" fill="#555555">'
        f"{escape(str(meta.get('machine', '')))}, torch {escape(str(meta.get('torch', '?')))}, "
        f"{escape(str(meta.get('date', '')))}, medians of {meta.get('rounds', '?')} rounds</text>",
    ]
    for x, (_, words, colour) in zip((left, left + panel + gap), LINES, strict=True):
        out.append(
            f'<line x1="{x:.1f}" y1="60" x2="{x + 24:.1f}" y2="60" stroke="{colour}" stroke-width="2.5"/>'
        )
        out.append(f'<text x="{x + 30:.1f}" y="64">{escape(words)}</text>')
    for index, (kind, title) in enumerate(PANELS):
        x0 = left + index * (panel + gap)
        values = [value for mode, _, _ in LINES for _, value in points[mode, kind]]
        step = _step(max(values, default=1.0))
        ymax = step * max(1, -(-max(values, default=1.0) // step))

        def at(depth: float, value: float, x0: float = x0, ymax: float = ymax) -> tuple[float, float]:
            return x0 + panel * depth / depths[-1], bottom - (bottom - top) * value / ymax

        out.append(
            f'<text x="{x0 + panel / 2:.1f}" y="{top - 10}" text-anchor="middle">{escape(title)}</text>'
        )
        tick = 0.0
        while tick <= ymax + step / 2:
            y = at(0, tick)[1]
            out.append(
                f'<line x1="{x0:.1f}" y1="{y:.1f}" x2="{x0 + panel:.1f}" y2="{y:.1f}" stroke="#e3e3e3"/>'
            )
            label = f"{tick:g}"
            out.append(f'<text x="{x0 - 6:.1f}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
            tick += step
        out.append(
            f'<polyline points="{x0:.1f},{top} {x0:.1f},{bottom} {x0 + panel:.1f},{bottom}" fill="none" '
            'stroke="#333333"/>'
        )
        for depth in depths:
            xd = at(depth, 0)[0]
            out.append(
                f'<line x1="{xd:.1f}" y1="{bottom}" x2="{xd:.1f}" y2="{bottom + 4}" stroke="#333333"/>'
            )
            out.append(f'<text x="{xd:.1f}" y="{bottom + 17}" text-anchor="middle">{depth}</text>')
        out.append(f'<text x="{x0 + panel / 2:.1f}" y="{bottom + 36}" text-anchor="middle">blocks</text>')
        out.append(
            f'<text transform="translate({x0 - 38:.1f} {(top + bottom) / 2:.1f}) rotate(-90)" '
            'text-anchor="middle">seconds after torch\'s import</text>'
        )
        for mode, _, colour in LINES:
            line = [at(depth, value) for depth, value in points[mode, kind]]
            if not line:
                continue
            coords = " ".join(f"{px:.1f},{py:.1f}" for px, py in line)
            out.append(f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="2.5"/>')
            out += [f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3.5" fill="{colour}"/>' for px, py in line]
            px, py = line[-1]
            value = points[mode, kind][-1][1]
            out.append(f'<text x="{px + 7:.1f}" y="{py + 4:.1f}" fill="{colour}">{seconds(value)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


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
