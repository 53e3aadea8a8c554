"""Figures the guides quote inside their prose, each computed from the results file that holds it.

A page's sentence that gives a measured figure (a ratio, seconds, milliseconds, a share) either sits in
a block that scripts/render_docs.py writes, or is one of the quotes below: the words as the page says
them, with the figures formatted from docs/results. tests/test_guide_quotes.py fails when a page no
longer says a quote (the file was measured again, or the page was edited), and when a page's prose holds
a figure that is neither rendered nor quoted (`unchecked`): a figure typed by hand has no source, so it
belongs in a results file, or the sentence says what it means without it and links where it was
measured. `python scripts/render_docs.py --check` reports the same.

The pages checked (`pages`) are the guides, the site codes' pages (regionalize/codes/, which `regionalize
rule` prints), the results index, and the pages in docs/results' sub-folders that no run wrote. A page a
script wrote (`measured`: its header dates the run) holds that run's figures, as a results file does: it
is a source the quotes read, not prose.

Where a script writes its page only as markdown (the profiles), the quote reads the table that script
wrote (`table`), which is that page's latest run by construction.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The scripts whose results are quoted, and this checkout's package, which they import.
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT)]
DOCS = ROOT / "docs"
RESULTS = DOCS / "results"
CODES = ROOT / "regionalize" / "codes"


@dataclass(frozen=True)
class Quote:
    page: str  # relative to docs/ (a site code's page: `code_page`)
    name: str  # what the figures are
    text: str  # the words the page says, figures formatted from `source`
    source: str  # relative to docs/results (a setting's: the package's file that sets it)

    @property
    def path(self) -> Path:
        return (DOCS / self.page).resolve()


def code_page(code: str) -> str:
    """A site code's page, as a quote names its page."""
    return os.path.relpath(CODES / f"{code}.md", DOCS)


def results(name: str) -> Any:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def table(page: str) -> dict[str, dict[str, str]]:
    """The first markdown table of a results page a script wrote: {first cell: {column: cell}}."""
    lines = (RESULTS / page).read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    head = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(head, cells, strict=True))
    return rows


def header(page: str) -> tuple[str, str]:
    """The date and runtime a results page's header (written by its script) names; '' where none."""
    head = (RESULTS / page).read_text(encoding="utf-8").split("\n|", 1)[0]
    date, runtime = re.search(r"\d{4}-\d\d-\d\d", head), re.search(r"runtime (\d+)", head)
    return (date[0] if date else ""), (runtime[1] if runtime else "")


def manifest(name: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """A verify manifest's run, and its results by model name."""
    data = results(name)
    return data, {m["name"]: m["result"] for m in data["models"]}


def x(value: float, decimals: int = 2) -> str:
    return f"{value:.{decimals}f}x"


def sooner(result: dict[str, Any], key: str, form: str = "regional") -> float:
    """How many times sooner `form` started than the full compile (a verify result's seconds)."""
    return result[key]["full"] / result[key][form]


def per_call(result: dict[str, Any], form: str = "regional") -> float:
    """`form`'s time a call over the full compile's (a verify result's steady state)."""
    return result["steady_us"][form] / result["steady_us"]["full"]


def stamps(data: Any) -> tuple[set[str], set[int]]:
    """Every date and runtime a results file records (its run's, or each row's where it joins runs)."""
    dates: set[str] = set()
    runtimes: set[int] = set()
    if isinstance(data, dict):
        for key, value in data.items():
            if key in ("date", "measured") and isinstance(value, str) and re.match(r"\d{4}-\d\d-\d\d", value):
                dates.add(value[:10])
            elif key == "runtime" and isinstance(value, int):
                runtimes.add(value)
            else:
                more = stamps(value)
                dates |= more[0]
                runtimes |= more[1]
    elif isinstance(data, list):
        for value in data:
            more = stamps(value)
            dates |= more[0]
            runtimes |= more[1]
    return dates, runtimes


# -- what counts as a figure, and where a page's prose is ----------------------------------------------

UNITS = r"x|%|s|ms|µs|us|ns|min|minutes?|seconds?|hours?|KB|KiB|MB|MiB|GB|GiB|bytes"
FIGURE = re.compile(
    rf"(?<![\w.])(?:\d+(?:\.\d+)?e[-+]?\d+(?![\w.])"  # a difference: 2e-4
    rf"|\d+(?:,\d{{3}})*(?:\.\d+)?(?:\s?(?:{UNITS})(?![\w])|x(?=\d)))"
)

# Not prose: fenced code, rendered blocks and other HTML comments. Links are read as their words.
_BLOCKS = re.compile(
    r"^```.*?^```[ \t]*$|<!-- (?P<name>[\w-]+): begin.*?<!-- (?P=name): end -->|<!--.*?-->",
    re.MULTILINE | re.DOTALL,
)
_LINK = re.compile(r"!?\[([^\]\n]*)\]\([^)\n]*\)")
_CODE = re.compile(r"`[^`]*`")
QUOTED = "\u27e8quoted\u27e9"


def prose(text: str) -> str:
    """A page's prose on one line: code blocks and rendered blocks left out, links read as their words."""
    text = _BLOCKS.sub("\n\n", text)
    return re.sub(r"\s+", " ", _LINK.sub(r"\1", text))


def unchecked(text: str, quotes: list[str]) -> list[str]:
    """The figures of a page's prose that are neither rendered nor in one of its quotes (inline code,
    such as a progress line's format, is not prose)."""
    body = prose(text)
    for quote in quotes:
        body = body.replace(quote, QUOTED)
    body = _CODE.sub(" ", body)
    return [f"...{body[max(0, m.start() - 50) : m.end() + 10]}..." for m in FIGURE.finditer(body)]


# -- the quotes, page by page ---------------------------------------------------------------------------


def _cuda_gpt() -> dict[str, dict[str, Any]]:
    rows = results("cuda.json")["results"]
    return {r["variant"]: r for r in rows if r["model"] == "gpt" and r["batch"] == 1}


def _library(model: str) -> dict[str, Any]:
    return next(r for r in results("libraries.json")["results"] if r["model"] == model)


def cuda_quotes() -> list[Quote]:
    rows = _cuda_gpt()
    ours, full = rows["hierarchical_cuda_graphs"], rows["full_reduce_overhead"]
    ms, full_ms = ours["ms_per_call"]["median"], full["ms_per_call"]["median"]
    first, full_first = ours["first_call_s"], full["first_call_s"]
    per_call = f"{ms:.2f} ms per call against {full_ms:.2f} ms"

    def call(variant: str) -> str:
        return f"{rows[variant]['ms_per_call']['median']:.2f} ms"

    return [
        Quote("cuda-graphs.md", "per call", f"{per_call} ({ms / full_ms:.2f}x)", "cuda.json"),
        Quote(
            "cuda-graphs.md",
            "first call",
            f"{first:.1f} s against {full_first:.1f} s, {full_first / first:.1f}x sooner",
            "cuda.json",
        ),
        Quote(
            "cuda-graphs.md",
            "the problem",
            f"GPT-style, 32 blocks, batch 1 (cuda.md): a full compile took {call('full')} per call, full "
            f"`reduce-overhead` {call('full_reduce_overhead')}, the blocks compiled one by one "
            f"{call('per_block')} and the owner compiled whole without CUDA graphs {call('hierarchical')}. "
            f"One by one, the first call came in {rows['per_block']['first_call_s']:.1f} s against a full "
            f"compile's {rows['full']['first_call_s']:.1f} s, but the serving loop ran "
            f"{x(rows['per_block']['ms_per_call']['median'] / full_ms, 1)} slower than full "
            "`reduce-overhead`.",
            "cuda.json",
        ),
        Quote(
            "cuda-graphs.md",
            "outputs overwritten",
            "overwritten by later ones without an error (a max difference of "
            f"{full['max_abs_diff']:.1f} from eager,",
            "cuda.json",
        ),
        Quote("form-cuda-graphs.md", "per call", per_call, "cuda.json"),
        Quote(
            "compile-forms.md",
            "per call",
            f"{ms / full_ms:.2f}x full `reduce-overhead` per call",
            "cuda.json",
        ),
    ]


def library_quotes() -> list[Quote]:
    unet, swin = _library("unet"), _library("swin")
    regions = unet["full"]["first_s"] / unet["compile_regions"]["first_s"]
    first = swin["full"]["first_s"] / swin["regionalize"]["first_s"]
    per_call = swin["regionalize"]["per_call_ms"] / swin["full"]["per_call_ms"]
    return [
        Quote("api.md", "UNet", f"with the declaration read, {regions:.1f}x sooner", "libraries.json"),
        Quote(
            "patterns.md",
            "Swin",
            f"starts {first:.2f}x sooner than a full compile and takes {per_call:.2f}x its time per call",
            "libraries.json",
        ),
    ]


CALL_PROFILE = "forward/call-profile.md"


def against_full(page: str) -> dict[str, str]:
    """A profile's time a call of each form against the full compile's, as its table gives it."""
    return {form: row["against full"] for form, row in table(page).items()}


def hierarchical_quotes() -> list[Quote]:
    page, stochastic = "form-hierarchical.md", "forward/stochastic-depth.json"
    run, by_model = manifest(stochastic)
    beit, swin, convnext = by_model["beit-24"], by_model["swin"], by_model["convnext"]

    def starts(r: dict[str, Any]) -> str:
        return ", ".join(x(sooner(r, key)) for key in ("compile_s", "compile_cold_s", "compile_hot_s"))

    call = against_full(CALL_PROFILE)
    call_date, call_runtime = header(CALL_PROFILE)
    restarts = table("forward/restart-profile.md")
    cold = {form: restarts[form]["cold"] for form in restarts}
    hot = {form: restarts[form]["hot (median)"] for form in restarts}
    against = {form: restarts[form]["hot against full"] for form in restarts}

    def compiled(model: str) -> str:
        """How many pieces the run's verify report says the model's owner compiled in all."""
        report = (RESULTS / "forward" / "stochastic-depth-reports" / f"{model}.txt").read_text("utf-8")
        found = re.search(r"in pieces \(\d+ a call, (\d+) compiled in all", report)
        assert found is not None, f"{model}'s report names no pieces"
        return found[1]

    restarts_in_pieces = "restart-stochastic-depth.json"
    in_pieces = results(restarts_in_pieces)
    saved_hot, full_hot = (in_pieces["summary"][f"24 {m} hot"]["first_call_s"] for m in ("saved", "full"))
    unet = _library("unet")
    ours, helper, measured = unet["regionalize"], unet["helper"], unet["measured"]
    return [
        Quote(
            page,
            "BEiT with stochastic depth",
            f"runtime {run['runtime']}, {run['date']}: first call {x(sooner(beit, 'compile_s'))} sooner than "
            f"a full compile after a warm-up, {x(sooner(beit, 'compile_cold_s'))} cold, "
            f"{x(sooner(beit, 'compile_hot_s'))} on a hot restart, per call {x(per_call(beit))} its time; "
            f"the per-block form starts {x(sooner(beit, 'compile_s', 'per_block'), 1)} sooner but takes "
            f"{x(per_call(beit, 'per_block'))} a full compile's time per call.",
            stochastic,
        ),
        Quote(
            page,
            "a restart in pieces, loaded",
            f"a hot restart took {saved_hot:.2f} s after torch's imports, {x(full_hot / saved_hot)} sooner "
            f"than a full compile's ({in_pieces['meta']['date'][:10]}, torch {in_pieces['meta']['torch']})",
            restarts_in_pieces,
        ),
        Quote(
            page,
            "Swin and ConvNeXt with stochastic depth",
            f"Swin (`models.py:swin`: stages of 2, 2, 6 and 2 layers, a rate a layer): "
            f"{x(sooner(swin, 'compile_s'))} sooner warm, {x(sooner(swin, 'compile_cold_s'))} cold, "
            f"{x(sooner(swin, 'compile_hot_s'))} hot, and a call takes {x(per_call(swin))} a full compile's "
            f"time; ConvNeXt (`models.py:convnext`: 3, 3, 9 and 3 blocks): {starts(convnext)}, and "
            f"{x(per_call(convnext))} a call (runtime {run['runtime']}, {run['date']}",
            stochastic,
        ),
        Quote(
            page,
            "pieces compiled",
            f"Swin's twelve layers compile into {compiled('swin')} pieces, ConvNeXt's eighteen blocks into "
            f"{compiled('convnext')}",
            "forward/stochastic-depth-reports/swin.txt",
        ),
        Quote(
            page,
            "a frame a stage",
            "with each stage the owner of its layers (runtime 26's default) a call took "
            f"{call['stage-owners']} a full compile's time, each stage compiled whole without regions "
            f"{call['stages']}, the encoder compiled whole {call['encoder']} ({call_date}, runtime "
            f"{call_runtime})",
            CALL_PROFILE,
        ),
        Quote(
            page,
            "the default a call",
            f"and a call is one frame, its graph in pieces: {call['default']}",
            CALL_PROFILE,
        ),
        Quote(
            page,
            "stretches compiled",
            f"compiled, a call takes {call['stretches']}",
            CALL_PROFILE,
        ),
        Quote(
            page,
            "the fresh chunk",
            f"costs nothing measurable there ({call['unchunked']} without it, {call['default']} with it)",
            CALL_PROFILE,
        ),
        Quote(
            page,
            "restarts of BEiT",
            f"Cold, a region a block took {cold['regions']}, pieces {cold['pieces']}, a full compile "
            f"{cold['full']}; restarted hot, {hot['regions']}, {hot['pieces']} and {hot['full']} (pieces "
            f"{against['pieces']} sooner than a full compile, a region a block {against['regions']})",
            "forward/restart-profile.md",
        ),
        Quote(
            page,
            "the fake run",
            f"a hot restart took {hot['pieces']}, against {hot['fake-run']} with the fake run",
            "forward/restart-profile.md",
        ),
        Quote(
            page,
            "the CPU check",
            f"the pieces took {hot['pieces']} with it and {hot['unchecked']} without (the same sitting; a "
            f"full compile {hot['full']})",
            "forward/restart-profile.md",
        ),
        Quote(
            page,
            "UNet against diffusers' helper",
            f"in libraries.md's run ({measured['date']}, runtime {measured['runtime']}) the UNet rewrite "
            f"started in {x(ours['first_s'] / helper['first_s'])} the time of diffusers' "
            f"`compile_repeated_blocks()` and took {x(ours['per_call_ms'] / helper['per_call_ms'])} its "
            "time per call",
            "libraries.json",
        ),
    ]


def _by_torch(version: str) -> dict[str, Any]:
    """versions.json's run on a torch version ("2.11"), as bench_torch_versions.py wrote it."""
    return next(run for run in results(VERSIONS) if run["versions"]["torch"].startswith(version + "."))


def _ms(run: dict[str, Any], model: str, form: str) -> str:
    """A form's time a call or token over the full compile's, in one torch's run."""
    rows = run["models"][model]
    return x(rows[form]["ms"] / rows["full"]["ms"])


def _first(run: dict[str, Any], model: str, form: str) -> str:
    rows = run["models"][model]
    return x(rows["full"]["first_s"] / rows[form]["first_s"])


VERSIONS = "torch-versions/versions.json"
STACK_DEPTHS = "torch-versions/stack-depths.json"
LLAMA, QWEN2, GPT = "llama-32 generate", "qwen2-32 generate", "gpt-32"


def torch_versions_quotes() -> list[Quote]:
    import stack_depths  # the script that scanned the depths: which fault count is one a block

    page, old = "form-torch-versions.md", _by_torch("2.11")
    scan = results(STACK_DEPTHS)
    ratios: dict[tuple[str, str], list[float]] = {}
    faulting = 0
    for run in scan["runs"]:
        torch = run["versions"]["torch"].rsplit(".", 1)[0]
        ratios[torch, run["model"]] = [row["regional"]["ms"] / row["full"]["ms"] for row in run["rows"]]
        extra = stack_depths._faults(run["model"])
        faulting += sum(row["regional"]["faults"] - row["full"]["faults"] >= extra for row in run["rows"])

    def medians(torch: str) -> str:
        values = [x(statistics.median(ratios[torch, model])) for model in (GPT, LLAMA, QWEN2)]
        return f"{values[0]}, {values[1]} and {values[2]}"

    worst = max(max(ratios[key]) for key in ratios if key[1] != GPT)
    new, later = _by_torch("2.13"), _by_torch("2.14")
    faults = "no depth" if faulting == 0 else f"{faulting} depths in all"
    return [
        Quote(
            page,
            "decode in pieces on 2.11",
            f"the default now decodes Llama and Qwen2 at {_ms(old, LLAMA, 'regional')} and "
            f"{_ms(old, QWEN2, 'regional')} a full compile's time per token (runtime {old['runtime']}, "
            f"{old['date']})",
            VERSIONS,
        ),
        Quote(
            page,
            "per-block decode on 2.11",
            f"`--form per-block` keeps a per-block start, decoding at {_ms(old, LLAMA, 'per_block')} and "
            f"{_ms(old, QWEN2, 'per_block')}",
            VERSIONS,
        ),
        Quote(
            page,
            "first token on 2.11",
            f"In the table the first token now comes {_first(old, LLAMA, 'regional')} and "
            f"{_first(old, QWEN2, 'regional')} sooner than a full compile's for Llama and Qwen2",
            VERSIONS,
        ),
        Quote(
            page,
            "the stack scan",
            f"Scanned again (runtime {scan['runtime']}, {scan['measured']}, the same command): {faults} took "
            "a fault a block more than a full compile. The default's time over every depth was a median of "
            f"{medians('2.13')} a full compile's (GPT-style, Llama's decode, Qwen2's decode) on torch 2.13, "
            f"and {medians('2.14')} on 2.14.1; the decodes' worst depth took {x(worst)}.",
            STACK_DEPTHS,
        ),
        Quote(
            page,
            "regions inlined",
            f"GPT-style 32 blocks reached the first call {_first(new, GPT, 'regional_inlined')} and "
            f"{_first(later, GPT, 'regional_inlined')} as soon as a full compile on 2.13 and 2.14.1, and "
            f"Llama's first token {_first(new, LLAMA, 'regional_inlined')} and "
            f"{_first(later, LLAMA, 'regional_inlined')}, against {_first(new, GPT, 'regional')}, "
            f"{_first(later, GPT, 'regional')}, {_first(new, LLAMA, 'regional')} and "
            f"{_first(later, LLAMA, 'regional')} for the default; a call took "
            f"{_ms(new, GPT, 'regional_inlined')} and {_ms(later, GPT, 'regional_inlined')} a full "
            f"compile's time, and Llama decoded at {_ms(new, LLAMA, 'regional_inlined')} and "
            f"{_ms(later, LLAMA, 'regional_inlined')}, where the default took {_ms(new, GPT, 'regional')}, "
            f"{_ms(later, GPT, 'regional')}, {_ms(new, LLAMA, 'regional')} and "
            f"{_ms(later, LLAMA, 'regional')} (runtime {new['runtime']}, the table's sitting of "
            f"{new['date']})",
            VERSIONS,
        ),
    ]


def _decode(name: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """bench_decode.py's run: its header, and its results by family."""
    data = results(name)
    return data["meta"], {r["family"]: r for r in data["results"]}


def _static(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    meta, rows = _decode(name)
    return meta, rows["llama"]


def caches_quotes() -> list[Quote]:
    page = "form-caches.md"
    meta, static = _static("decode-static.json")
    meta_214, static_214 = _static("torch-versions/static-2.14.1/decode-static.json")

    def first(r: dict[str, Any], key: str = "first_generate_s") -> str:
        return x(sooner(r, key))

    def token(r: dict[str, Any], form: str = "regional", decimals: int = 2) -> str:
        return x(r["decode_ms_per_token"][form] / r["decode_ms_per_token"]["full"], decimals)

    def pair(r: dict[str, Any], key: str, unit: str, decimals: int) -> str:
        return f"{r[key]['regional']:.{decimals}f} against {r[key]['full']:.{decimals}f}{unit}"

    zoo, by_model = manifest("zoo/zoo.json")
    enc, families = _decode("encoder-decoders/decode.json")
    bart, marian, t5 = families["bart"], families["marian"], families["t5"]
    return [
        Quote(
            page,
            "StaticCache on torch 2.13",
            f"the first generate came {first(static)} sooner than a full compile's "
            f"({pair(static, 'first_generate_s', ' s', 1)}) and a token took {token(static)} its time "
            f"({pair(static, 'decode_ms_per_token', ' ms', 2)}), with runtime {meta['runtime']} in the "
            f"import form on {meta['date']}; a restart's first generate (the compile caches on disk) came "
            f"{first(static, 'first_generate_hot_s')} sooner than a full compile's restart.",
            "decode-static.json",
        ),
        Quote(
            page,
            "StaticCache on torch 2.14.1",
            f"On torch 2.14.1 (its CUDA build on the same CPU, runtime {meta_214['runtime']}, "
            f"{meta_214['date']}, the table) a token took {token(static_214)} a full compile's time "
            f"({pair(static_214, 'decode_ms_per_token', ' ms', 2)}), the first generate came "
            f"{first(static_214)} sooner ({pair(static_214, 'first_generate_s', ' s', 1)}) and a "
            f"restart's {first(static_214, 'first_generate_hot_s')} sooner "
            f"({pair(static_214, 'first_generate_hot_s', ' s', 1)}).",
            "torch-versions/static-2.14.1/decode-static.json",
        ),
        Quote(
            page,
            "BART and T5 in the zoo",
            f"since, they started {x(sooner(by_model['bart'], 'compile_s'))} and "
            f"{x(sooner(by_model['t5'], 'compile_s'))} sooner in its runtime-{zoo['runtime']} run",
            "zoo/zoo.json",
        ),
        Quote(
            page,
            "encoder-decoders' first generate and tokens",
            f"The first generate came {first(bart)} (BART), {first(marian)} (Marian) and {first(t5)} (T5) "
            f"sooner than with a full compile, and the tokens took {token(bart)}, {token(marian)} and "
            f"{token(t5)} a full compile's time each (runtime {enc['runtime']}, {enc['date']}).",
            "encoder-decoders/decode.json",
        ),
        Quote(
            page,
            "encoder-decoders' first token",
            f"The first token alone came {first(bart, 'ttft_s')}, {first(marian, 'ttft_s')} and "
            f"{first(t5, 'ttft_s')} as soon as a full compile's",
            "encoder-decoders/decode.json",
        ),
    ]


def _by_code(cell: str) -> dict[str, int]:
    """A cell of real_world.py's table that counts sites by code: 'RGZ102 271, RGZ103 3' (or '-')."""
    return {code: int(n) for code, n in re.findall(r"(RGZ\d{3}) (\d+)", cell)}


def saved_owners_quotes() -> list[Quote]:
    name = "restart-decode/decode.json"
    meta, rows = _decode(name)
    llama = rows["llama"]
    hot = llama["first_generate_hot_s"]
    return [
        Quote(
            "saved-owners.md",
            "a restarted generate",
            f"first generate came {x(sooner(llama, 'first_generate_hot_s'))} sooner than a full "
            f"compile's restart ({hot['regional']:.1f} s against {hot['full']:.1f} s; {meta['date']}, "
            f"runtime {meta['runtime']})",
            name,
        )
    ]


def libraries_page_quotes() -> list[Quote]:
    page, source = "real-libraries.md", "real-world-run.md"
    run = {name.split("==")[0]: row for name, row in table(source).items()}
    mmdet = run["mmdet"]
    date, _ = header(source)
    skipped = {name: _by_code(row["skipped by code"]) for name, row in run.items()}
    fixes = _by_code(run["transformers"]["per-block integer fixes"])
    return [
        Quote(
            page,
            "diffusers' holders",
            f"In the latest run {skipped['diffusers']['RGZ108']} RGZ108 remain in diffusers",
            source,
        ),
        Quote(
            page,
            "diffusers' declared blocks",
            f"In the latest run diffusers has {skipped['diffusers']['RGZ111']} RGZ111 sites and "
            f"{skipped['diffusers']['RGZ112']} RGZ112, and {run['diffusers']['share']} of its sites are "
            "rewritten",
            source,
        ),
        Quote(
            page,
            "transformers' declared blocks",
            f"In the latest run it has {skipped['transformers']['RGZ111']} RGZ111 sites",
            source,
        ),
        Quote(
            page,
            "containers of parts",
            f"In the latest run: timm {skipped['timm']['RGZ110']}, mmdet {skipped['mmdet']['RGZ110']}",
            source,
        ),
        Quote(
            page,
            "transformers' per-block integer fixes",
            f"In transformers' latest run, {fixes['RGZ003']} cache calls and indexed assignments taking "
            f"`self.layer_idx` leave the compiled region (RGZ003) and {fixes['RGZ004']} forwards are "
            "traced with symbolic integers (RGZ004)",
            source,
        ),
        Quote(
            page,
            "mmdet's share",
            f"In the latest run ({date}) mmdet is at {mmdet['share']} of its sites, short of the share "
            f"issue 11 asked for, and its coverage is {mmdet['coverage']} ({mmdet['rewritten']} rewritten)",
            source,
        ),
    ]


def guard_bypass_quotes() -> list[Quote]:
    rows = table("guard-bypass.md")
    seed, recipe = (next(row for name, row in rows.items() if name.startswith(m)) for m in ("seed", "recipe"))

    def against_full(row: dict[str, str], form: str) -> str:
        return x(float(row[form]) / float(row["full"]))

    return [
        Quote(
            "form-guard-bypass.md",
            "the seed model",
            f"the hierarchical form with `depyf` took {against_full(seed, 'hierarchical + depyf')} a full "
            "compile's time per call",
            "guard-bypass.md",
        ),
        Quote(
            "form-guard-bypass.md",
            "the recipe's 64 layers",
            f"the hierarchical form with `depyf` took {against_full(recipe, 'hierarchical + depyf')} a full "
            f"compile's time (without the bypass, {against_full(recipe, 'hierarchical')})",
            "guard-bypass.md",
        ),
    ]


def serving_quotes() -> list[Quote]:
    """The serving folder's account of its latest runs (run 10 and the rows it kept), from serving.json."""
    page, source = "results/serving/README.md", "serving/serving.json"
    data = results(source)
    rows = data["results"]
    full, theirs = rows["full"], rows["transformers_static"]
    static, graphs = rows["rewrite_static"], rows["rewrite_static_cuda_graphs"]

    def first(row: dict[str, Any]) -> str:
        return f"{row['first_generate_s']:.1f} s"

    def token(row: dict[str, Any]) -> str:
        return f"{row['decode_ms_per_token']:.2f} ms"

    def sooner_both(key: str) -> str:
        """How many times sooner than the full compile both static-cache rewrites came: '7.8x to 8.0x'."""
        low, high = sorted(full[key] / row[key] for row in (static, graphs))
        return f"{x(low, 1)} to {x(high, 1)}"

    return [
        Quote(
            page,
            "run 10's static-cache rewrites",
            f"In run 10 `rewrite_static` took {first(static)} to its first generate and {token(static)} a "
            f"token, `rewrite_static_cuda_graphs` {first(graphs)} and {token(graphs)}",
            source,
        ),
        Quote(page, "run 10's full compile", f"its full compile took {token(full)} a token", source),
        Quote(
            page,
            "the copy bandwidth",
            f"run 10's {data['meta']['bandwidth']['bandwidth_gb_s']:.0f} GB/s in serving.md's header",
            source,
        ),
        Quote(
            page,
            "sooner within run 10",
            f"Within run 10 both static-cache rewrites reached their first generate "
            f"{sooner_both('first_generate_s')} sooner than a full compile, and restarted "
            f"{sooner_both('restart_first_generate_s')} sooner than it.",
            source,
        ),
        Quote(page, "rewrite", f"the first generate stayed at {first(rows['rewrite'])}", source),
        Quote(
            page,
            "rewrite_static",
            f"it starts in {first(static)}, sooner than in pieces, but `generate`'s own compile graphs the "
            f"stretches between the blocks' frames, {static['dynamo']['cuda_graphs_per_token']:.0f} CUDA "
            f"graphs a token: {token(static)} a token, "
            f"{x(static['decode_ms_per_token'] / theirs['decode_ms_per_token'])} transformers' own.",
            source,
        ),
        Quote(
            page,
            "rewrite_static_cuda_graphs",
            f"{token(graphs)} a token against transformers' {token(theirs)} (measured {theirs['date']}",
            source,
        ),
    ]


def codes_quotes() -> list[Quote]:
    """The site codes' pages, which `regionalize rule` prints."""
    call = against_full(CALL_PROFILE)
    return [
        Quote(
            code_page("RGZ006"),
            "a frame a stage",
            f"a frame a stage took {call['stage-owners']} a full compile's time a call, one frame for all "
            f"twelve layers {call['default']}",
            CALL_PROFILE,
        )
    ]


def settings_quotes() -> list[Quote]:
    """Limits the package sets, quoted from where it sets them."""
    from regionalize.runtime import outer
    from regionalize.shared import source_files

    mib = source_files.MAX_BYTES / (1024 * 1024)
    largest = "../../regionalize/shared/source_files.py"
    return [
        Quote("getting-started.md", "the largest source file read", f"is over {mib:g} MiB", largest),
        Quote(code_page("RGZ900"), "the largest source file read", f"is larger than {mib:g} MiB", largest),
        Quote(
            code_page("RGZ006"),
            "work of the module's own",
            f"{1 - outer.SHARE:.0%} of its parameters or more",
            "../../regionalize/runtime/outer.py",
        ),
    ]


def quotes() -> list[Quote]:
    return [
        *cuda_quotes(),
        *library_quotes(),
        *hierarchical_quotes(),
        *torch_versions_quotes(),
        *caches_quotes(),
        *saved_owners_quotes(),
        *libraries_page_quotes(),
        *guard_bypass_quotes(),
        *serving_quotes(),
        *codes_quotes(),
        *settings_quotes(),
    ]


def measured(page: Path) -> bool:
    """Whether a results page is a run's: the paragraph under its title dates the run, as every script's
    header does (`Measured by ... on 2026-12-02`, a verify manifest's `...; 2026-12-05.`)."""
    opening = page.read_text(encoding="utf-8").split("\n\n", 2)[1]
    return re.search(r"\d{4}-\d\d-\d\d", opening) is not None


def pages() -> list[Path]:
    """The pages whose prose is checked: the guides, the site codes' pages, the results index and the
    pages of the results' sub-folders that no run wrote. (The README's figures are its rendered section,
    which tests/test_quoted_figures.py checks.)"""
    written = [page for page in sorted(RESULTS.glob("*/**/*.md")) if not measured(page)]
    return [*sorted(DOCS.glob("*.md")), *sorted(CODES.glob("*.md")), RESULTS / "README.md", *written]


def problems() -> list[str]:
    """Every quote a page no longer says, and every figure a page's prose holds unchecked."""
    found = []
    by_page: dict[Path, list[str]] = {}
    for quote in quotes():
        by_page.setdefault(quote.path, []).append(quote.text)
    for page in pages():
        name = page.relative_to(ROOT).as_posix()
        text = page.read_text(encoding="utf-8")
        said = by_page.get(page, [])
        found += [f"{name} should say {q!r} (from its results file)" for q in said if q not in prose(text)]
        found += [f"{name}: a figure with no source: {f}" for f in unchecked(text, said)]
    return found
