"""Side by side on CPU: the regionalize rewrite of a library's own source against full `torch.compile` and
against the library's own regional helper (diffusers' `compile_repeated_blocks()`, accelerate's
`compile_regions()`), and regionalize's run-time entry point, `regionalize.compile_regions(model)`, on
the same built models. Small configs, random weights, nothing downloaded.

    python -m pip install "torch==2.13.0" -e ".[verify,bench]"
    python scripts/bench_libraries.py [--models gpt unet flux llama resnet convnext swin] [--threads 1]
        [--repeats 3]

The rewrite is the real user flow: the installed diffusers and transformers packages are copied into
.downloads/rewritten/ (git-ignored) and `regionalize --apply` runs over the model folders of the copy;
the rewritten variant imports the library from there. Every variant runs in a fresh process: an
unrelated warm-up compile first, then the model built with a fixed seed, the compile and the first call
(timed together: the rewrite compiles on its first call), and the median of 7 rounds of 10 calls;
`--repeats` fresh processes per cell, the table giving the medians. The eager run saves its output;
every other run is compared with it. Reports first call, per call, the graphs Dynamo made, and the
largest difference from the eager output. Writes docs/results/libraries.md and .json
with the date, machine and versions. Never time while anything else runs on the machine.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from regionalize.codemod.runtime_copy import VERSION

ROOT = Path(__file__).resolve().parent.parent
COPIES = ROOT / ".downloads" / "rewritten"
DOCS = ROOT / "docs" / "results"

# model -> (library, the folders of the copy the codemod rewrites, the library's own helper)
MODELS: dict[str, tuple[str, list[str], str | None]] = {
    # No library source to rewrite: the built model only, against accelerate's helper.
    "gpt": ("", [], "compile_regions"),
    "unet": ("diffusers", ["models"], "compile_repeated_blocks"),
    "flux": ("diffusers", ["models"], "compile_repeated_blocks"),
    "llama": ("transformers", ["models/llama"], "compile_regions"),
    "resnet": ("transformers", ["models/resnet"], None),
    "convnext": ("transformers", ["models/convnext"], None),
    "swin": ("transformers", ["models/swin"], None),
}
# The rewrite's variants: the default form, and the per-block form (the fastest start).
FORMS = {"regionalize": "hierarchical", "regionalize per-block": "per-block"}
TITLES = {
    "gpt": "GPT-style stack, 32 blocks (docs/results/forward/gpt.py)",
    "unet": "diffusers UNet2DConditionModel, 2 levels (32/64), 2 layers per block, 16x16",
    "flux": "diffusers FluxTransformer2DModel, 4 + 8 blocks",
    "llama": "transformers Llama, 32 layers, forward",
    "resnet": "transformers ResNet, depths 3/4/6/3",
    "convnext": "transformers ConvNeXt, depths 3/3/9/3",
    "swin": "transformers Swin, depths 2/2/6/2",
}

# One variant of one model, run as `python -c CHILD model variant threads [copy]`.
CHILD = r"""
import json, statistics, sys, time
model_name, variant, threads, reference = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if len(sys.argv) > 5:
    sys.path.insert(0, sys.argv[5])  # the rewritten copy of the library
import torch
from torch._dynamo import utils as dynamo_utils
torch.set_num_threads(threads)
torch.set_grad_enabled(False)
torch.compile(lambda x: x.sin() + 1)(torch.randn(3))  # the compiler's own start-up, not the model's
dynamo_utils.clear_compilation_metrics()
sys.path.insert(0, SCRIPTS)
from bench_libraries import build
torch.manual_seed(0)
model, args, kwargs = build(model_name)
# No call before the timer: the rewrite compiles on its first call. The eager run's output, saved, is
# what the others are compared with (the same seed builds the same weights).
start = time.perf_counter()
if variant == "full":
    model.compile()
elif variant == "helper" and model_name in ("unet", "flux"):
    model.compile_repeated_blocks()
elif variant == "helper":
    from accelerate.utils import compile_regions
    model = compile_regions(model)
elif variant == "compile_regions":
    import regionalize
    model = regionalize.compile_regions(model)
out = model(*args, **kwargs)
first = time.perf_counter() - start
graphs = sum(1 for r in dynamo_utils.get_compilation_metrics() if getattr(r, "graph_op_count", None))
for _ in range(3):
    model(*args, **kwargs)
rounds = []
for _ in range(7):
    start = time.perf_counter()
    for _ in range(10):
        model(*args, **kwargs)
    rounds.append((time.perf_counter() - start) / 10)
def tensor(x):
    if isinstance(x, tuple):
        return x[0]
    named = [getattr(x, k, None) for k in ("logits", "last_hidden_state")]
    return next((t for t in named if t is not None), x)
if variant == "eager":
    torch.save(tensor(out), reference)
diff = (tensor(out) - torch.load(reference)).abs().max().item()
print(json.dumps({"first_s": None if variant == "eager" else first,
                  "per_call_ms": statistics.median(rounds) * 1e3, "graphs": graphs, "max_diff": diff}))
"""


def build(name: str) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """The model at a small config, its positional and keyword inputs (imported late: the child process
    picks the original or the rewritten library by its path first)."""
    import torch

    g = torch.Generator().manual_seed(1)
    if name == "gpt":
        sys.path.insert(0, str(DOCS / "forward"))
        from gpt import build as gpt

        model, args = gpt()
        return model.eval(), args, {}
    if name == "unet":
        from diffusers import UNet2DConditionModel

        model = UNet2DConditionModel(
            block_out_channels=(32, 64),
            layers_per_block=2,
            sample_size=16,
            in_channels=4,
            out_channels=4,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=32,
            attention_head_dim=8,
            norm_num_groups=16,
        )
        inputs = {
            "sample": torch.randn(1, 4, 16, 16, generator=g),
            "timestep": torch.tensor([10]),
            "encoder_hidden_states": torch.randn(1, 6, 32, generator=g),
            "return_dict": False,
        }
        return model.eval(), (), inputs
    if name == "flux":
        from diffusers import FluxTransformer2DModel

        model = FluxTransformer2DModel(
            patch_size=1,
            in_channels=16,
            num_layers=4,
            num_single_layers=8,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            pooled_projection_dim=32,
            axes_dims_rope=(4, 6, 6),
        )
        tokens, text = 64, 8
        inputs = {
            "hidden_states": torch.randn(1, tokens, 16, generator=g),
            "encoder_hidden_states": torch.randn(1, text, 32, generator=g),
            "pooled_projections": torch.randn(1, 32, generator=g),
            "timestep": torch.tensor([0.5]),
            "img_ids": torch.zeros(tokens, 3),
            "txt_ids": torch.zeros(text, 3),
            "return_dict": False,
        }
        return model.eval(), (), inputs
    import transformers

    pixels = (torch.randn(2, 3, 128, 128, generator=g),)
    if name == "llama":
        config = transformers.LlamaConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=32,
        )
        ids = torch.randint(0, 256, (1, 16), generator=g)
        return transformers.LlamaForCausalLM(config).eval(), (ids,), {"use_cache": False}
    if name == "resnet":
        config = transformers.ResNetConfig(
            depths=[3, 4, 6, 3], hidden_sizes=[32, 64, 128, 256], embedding_size=16
        )
        return transformers.ResNetModel(config).eval(), pixels, {}
    if name == "convnext":
        config = transformers.ConvNextConfig(depths=[3, 3, 9, 3], hidden_sizes=[24, 48, 96, 192])
        return transformers.ConvNextModel(config).eval(), pixels, {}
    if name == "swin":
        config = transformers.SwinConfig(
            image_size=128, embed_dim=24, depths=[2, 2, 6, 2], num_heads=[1, 2, 4, 8], window_size=4
        )
        return transformers.SwinModel(config).eval(), pixels, {}
    raise ValueError(f"unknown model {name!r}")


def rewritten_copy(library: str, folders: list[str], form: str) -> Path:
    """A copy of the installed library with the codemod (`--form form`) applied to `folders`; returns the
    sys.path entry."""
    import importlib.util

    spec = importlib.util.find_spec(library)
    assert spec is not None and spec.origin is not None, (
        f"{library} is not installed: pip install -e .[bench]"
    )
    source = Path(spec.origin).parent
    version = importlib.metadata.version(library)
    root = COPIES / f"{library}-{version}-{form}"
    target = root / library
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    command = [sys.executable, "-m", "regionalize", "--apply", "-q", "--form", form]
    command += [str(target / f) for f in folders]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode not in (0, 1):
        raise SystemExit(f"regionalize failed on the {library} copy:\n{done.stderr}")
    return root


def cell(
    model: str, name: str, threads: int, reference: Path, timeout_s: float, repeats: int, copy: Path | None
) -> dict[str, Any]:
    """`repeats` fresh processes of one variant: the medians of their first calls and per calls, the largest
    difference from eager, each run kept. A run that fails makes the cell that error: a variant that fails
    once is not reported from the runs that passed, and is not run again."""
    runs = []
    for _ in range(repeats):
        run = variant(model, name, threads, reference, timeout_s, copy)
        if "error" in run:
            return run
        runs.append(run)
    first = [r["first_s"] for r in runs if r["first_s"] is not None]
    return {
        "first_s": statistics.median(first) if first else None,
        "per_call_ms": statistics.median(r["per_call_ms"] for r in runs),
        "graphs": runs[0]["graphs"],
        "max_diff": max(r["max_diff"] for r in runs),
        "runs": runs,
    }


def variant(
    model: str, name: str, threads: int, reference: Path, timeout_s: float, copy: Path | None = None
) -> dict[str, Any]:
    """One run of a variant in a fresh process; "eager" must run first: it writes the `reference` output."""
    code = CHILD.replace("SCRIPTS", repr(str(ROOT / "scripts")))
    command = [sys.executable, "-c", code, model, name, str(threads), str(reference)]
    command += [str(copy)] if copy else []
    env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1", "OMP_NUM_THREADS": str(threads)}
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"no first call within {timeout_s:.0f} s"}
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=DOCS / "libraries.json")
    parser.add_argument("--timeout", type=float, default=600, help="Seconds per cell before it is an error.")
    parser.add_argument(
        "--repeats", type=int, default=3, help="Fresh processes per cell; the table gives their medians."
    )
    parser.add_argument("--render", action="store_true", help="Only write the table again from --json.")
    parser.add_argument(
        "--update",
        action="store_true",
        help="Measure the models given and keep the other models' rows of --json, each naming its date.",
    )
    args = parser.parse_args()
    if args.render:
        recorded = json.loads(args.json.read_text())
        args.json.with_suffix(".md").write_text(markdown(recorded["meta"], recorded["results"]))
        return
    COPIES.mkdir(parents=True, exist_ok=True)  # where the eager outputs are kept
    copies: dict[tuple[str, str], Path] = {}
    for model in args.models:
        library = MODELS[model][0]
        wanted = sorted({f for m in args.models if MODELS[m][0] == library for f in MODELS[m][1]})
        for name, form in FORMS.items():
            if library and (library, name) not in copies:
                copies[library, name] = rewritten_copy(library, wanted, form)
    results = []
    for model in args.models:
        library, _, helper = MODELS[model]
        row: dict[str, Any] = {"model": model, "title": TITLES[model]}
        rewrites = list(FORMS) if library else []
        for name in ["eager", "full", *(["helper"] if helper else []), "compile_regions", *rewrites]:
            copy = copies.get((library, name))
            reference = COPIES / f"{model}-eager-output.pt"
            kind = "rewritten" if copy else name
            row[name] = cell(model, kind, args.threads, reference, args.timeout, args.repeats, copy)
            print(model, name, row[name], flush=True)
        row["measured"] = {"date": datetime.date.today().isoformat(), "runtime": VERSION}
        results.append(row)
    if args.update and args.json.exists():
        before = json.loads(args.json.read_text())
        kept = {r["model"]: r for r in before["results"]}
        for row in kept.values():  # a row from before --update named no date: the table's
            row.setdefault("measured", {"date": before["meta"]["date"], "runtime": before["meta"]["runtime"]})
        kept.update({r["model"]: r for r in results})
        results = [kept[m] for m in MODELS if m in kept]
    meta = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {args.threads} thread(s) per run",
        "repeats": args.repeats,
        "python": platform.python_version(),
        "versions": {
            lib: importlib.metadata.version(lib)
            for lib in ("torch", "diffusers", "accelerate", "transformers", "regionalize")
        },
        "runtime": VERSION,
    }
    args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    args.json.with_suffix(".md").write_text(markdown(meta, results))
    print(f"wrote {args.json} and {args.json.with_suffix('.md')}")


def markdown(meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
    lines = [
        "# regionalize against full compile and the libraries' own helpers",
        "",
        f"Measured by `python scripts/bench_libraries.py` on {meta['date']}: {meta['machine']}, Python "
        f"{meta['python']}, {versions} (runtime {meta['runtime']}). {_runs(meta)}; first call includes "
        "the compile (inductor caches off); per call is the median of 7 rounds of 10 calls. `regionalize` "
        "is the library's own source after `regionalize --apply` with default settings (the hierarchical "
        "form), and with `--form per-block`."
        + (
            " A row naming a date and runtime was measured in that earlier sitting (kept by `--update`), "
            "with the versions its table named then (docs/results/README.md)."
            if any(_dated(row, meta) != row["title"] for row in results)
            else ""
        ),
        "",
        "| model | eager per call | full: first / per call | library helper: first / per call | "
        "regionalize (default): first / per call | regionalize `--form per-block` | default's first call "
        "vs full | default against the helper: first / per call | graphs (full / helper / default / "
        "per-block) | max diff from eager |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results:
        if "regionalize" not in row:
            continue  # no source rewritten: the run-time table's alone
        row = {**row, "title": _dated(row, meta)}
        full, helper = row["full"], row.get("helper")
        ours, per_block = row["regionalize"], row["regionalize per-block"]
        cells = (full, helper, ours, per_block)
        name = MODELS[row["model"]][2]
        helper_cell = f"`{name}()`: {_pair(helper)}" if name else "-"
        graphs = " / ".join(str(v.get("graphs", "-")) if v else "-" for v in cells)
        diff = max((v.get("max_diff", 0.0) for v in cells if v and "error" not in v), default=0.0)
        lines.append(
            f"| {row['title']} | {_ms(row['eager'].get('per_call_ms'))} | {_pair(full)} | {helper_cell} | "
            f"{_pair(ours)} | {_pair(per_block)} | {_ratio(full, ours)} | {_against(ours, helper)} | "
            f"{graphs} | {diff:.1e} |"
        )
    lines += [
        "",
        "A rewrite with 0 graphs compiled nothing: every site was skipped (ResNet's declaration, "
        "`_no_split_modules`, names parts of its layers, not the layers), so it runs as written.",
    ]
    lines += _run_time_table(results, meta)
    swin = next((r for r in results if r["model"] == "swin"), None)
    if swin and "error" in (swin["regionalize per-block"] or {}):
        lines += [
            "",
            "Swin's `--form per-block` is the recipe, `block.compile()`, and its compiled frame is one code "
            "object (transformers' `forward_with_checkpointing`) for the blocks of all four stages, each "
            "stage at its own width. Dynamo "
            "compiles the second width again with dynamic shapes, and Inductor's CPU code generation for "
            "the shifted windows then runs in sympy's simplification for minutes (still running after 8 "
            "minutes when let run, torch 2.13). The default form compiles each stage as a function of its "
            "own, static, and where it falls back to compiling block by block it compiles those blocks "
            "with `dynamic=False` ([compile forms]"
            "(../form-hierarchical.md#owners-of-one-class-at-several-widths)).",
        ]
    return "\n".join(lines) + "\n"


def _dated(row: dict[str, Any], meta: dict[str, Any]) -> str:
    """A row's title, with its date and runtime where they are not the table's (kept by --update)."""
    measured = row.get("measured")
    if not measured or (measured["date"], measured["runtime"]) == (meta["date"], meta["runtime"]):
        return row["title"]
    return f"{row['title']} ({measured['date']}, runtime {measured['runtime']})"


def _run_time_table(results: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    """The calls on a built model, its source unchanged: the library's helper and regionalize's."""
    rows = [row for row in results if row.get("compile_regions")]
    if not rows:
        return []
    lines = [
        "",
        "## At run time, the source unchanged",
        "",
        "The same built models handed to a function: the library's own helper, and "
        "`regionalize.compile_regions(model)` (the runtime a rewrite calls, finding the repeated blocks "
        "of the built model).",
        "",
        "| model | full: first / per call | library helper: first / per call | "
        "`regionalize.compile_regions`: first / per call | its first call vs full | against the helper: "
        "first / per call | graphs (full / helper / compile_regions) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        row = {**row, "title": _dated(row, meta)}
        full, helper, ours = row["full"], row.get("helper"), row["compile_regions"]
        name = MODELS[row["model"]][2]
        helper_cell = f"`{name}()`: {_pair(helper)}" if name else "-"
        graphs = " / ".join(str(v.get("graphs", "-")) if v else "-" for v in (full, helper, ours))
        lines.append(
            f"| {row['title']} | {_pair(full)} | {helper_cell} | {_pair(ours)} | {_ratio(full, ours)} | "
            f"{_against(ours, helper)} | {graphs} |"
        )
    return lines


def _runs(meta: dict[str, Any]) -> str:
    repeats = meta.get("repeats", 1)
    if repeats == 1:
        return "One fresh process per cell, one run each"
    return f"{repeats} fresh processes per cell, the median of each figure"


def _against(ours: dict[str, Any], helper: dict[str, Any] | None) -> str:
    """The default form's first call and per call as multiples of the helper's (below 1: better)."""
    if not helper or "error" in helper or "error" in ours:
        return "-"
    return f"{ours['first_s'] / helper['first_s']:.2f}x / {ours['per_call_ms'] / helper['per_call_ms']:.2f}x"


def _pair(cell: dict[str, Any] | None) -> str:
    if not cell:
        return "-"
    if "error" in cell:
        return f"error: {cell['error'][:80]}"
    return f"{cell['first_s']:.1f} s / {_ms(cell['per_call_ms'])}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _ratio(full: dict[str, Any], ours: dict[str, Any]) -> str:
    if "error" in full or "error" in ours:
        return "-"
    if not ours["graphs"]:
        return "nothing compiled"
    return f"{full['first_s'] / ours['first_s']:.2f}x faster" if ours["first_s"] else "-"


if __name__ == "__main__":
    main()
