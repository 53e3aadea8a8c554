"""Models the project never saw, loaded every way Python loads code, compiled by the rewrite and by
`compile_regions`: does any raise what the original does not, and does each compute what it does?

    pip install einops && python scripts/module_loading.py [--json docs/results/module-loading.json]

Downloads (never commits) vit-pytorch's wheel into .downloads/ and reads single-file models from it (each
imports torch and einops alone, so it can be loaded as a lone file). For each model and each way of loading
it (registered by import, `spec_from_file_location` and `SourceFileLoader` unregistered, `runpy.run_path`,
`exec` under a name and as `__main__`), and each route (the rewrite of its file, `compile_regions` on the
model): a first call without autograd (the owner compiled whole) and one with it (blocks one by one), each
against the original loaded by import, in this process. Writes docs/results/module-loading.md (and the
JSON): per case `ok`, `crash` (the error) or `wrong` (the largest difference), and the runtime's warnings.
Outcomes, not timings: the figures of how soon each starts are the forward benchmark's.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.machinery
import importlib.util
import itertools
import json
import runpy
import subprocess
import sys
import types
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

import regionalize
from regionalize.bench.machine import machine
from regionalize.codemod import runtime_copy, transform_source
from regionalize.shared.options import Options

ROOT = Path(__file__).resolve().parent.parent
DOWNLOADS = ROOT / ".downloads"
DOCS = ROOT / "docs" / "results"
PACKAGE = "vit-pytorch==1.26.11"
SMALL = {
    "image_size": 32,
    "patch_size": 8,
    "num_classes": 10,
    "dim": 64,
    "depth": 4,
    "heads": 4,
    "mlp_dim": 128,
}
# file in vit_pytorch/, class, its arguments beyond SMALL
MODELS = (
    ("vit.py", "ViT", {}),
    ("simple_vit.py", "SimpleViT", {}),
    ("deepvit.py", "DeepViT", {}),
    ("cait.py", "CaiT", {"cls_depth": 2, "layer_dropout": 0.0}),
    ("vit_for_small_dataset.py", "ViT", {}),
    ("simple_vit_with_register_tokens.py", "SimpleViT", {}),
)
_names = itertools.count()


def fetch() -> Path:
    folder = DOWNLOADS / PACKAGE.replace("==", "-")
    if not folder.exists():
        wheels = DOWNLOADS / "wheels"
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", wheels, PACKAGE], check=True
        )
        name = PACKAGE.replace("-", "_").replace("==", "-")
        zipfile.ZipFile(next(wheels.glob(f"{name}-*.whl"))).extractall(folder)
    return folder / "vit_pytorch"


def _spec(path: Path, name: str) -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return vars(module)


def _loader(path: Path, name: str) -> dict[str, Any]:
    module = types.ModuleType(name)
    module.__file__ = str(path)
    importlib.machinery.SourceFileLoader(name, str(path)).exec_module(module)
    return vars(module)


def _registered(path: Path, name: str) -> dict[str, Any]:
    sys.path.insert(0, str(path.parent))
    try:
        return vars(importlib.import_module(name))
    finally:
        sys.path.remove(str(path.parent))


def _exec(path: Path, name: str, as_name: str | None = None) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": as_name or name}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace


WAYS = {
    "import": _registered,
    "spec": _spec,
    "SourceFileLoader": _loader,
    "run_path": lambda path, name: runpy.run_path(str(path)),
    "exec": _exec,
    "exec as __main__": lambda path, name: _exec(path, name, "__main__"),
}


def case(
    source: str, cls: str, kwargs: dict[str, Any], way: str, route: str, scratch: Path
) -> dict[str, Any]:
    """One model loaded one way, compiled by one route, against the original; never raises."""
    text = transform_source(source, Options()).code if route == "rewrite" else source
    name = f"loaded_{next(_names)}"
    path = scratch / f"{name}.py"
    path.write_text(text)
    twin_path = scratch / f"{name}_original.py"
    twin_path.write_text(source)
    result: dict[str, Any] = {"way": way, "route": route}
    try:
        torch.manual_seed(0)
        model = WAYS[way](path, name)[cls](**SMALL, **kwargs).eval()
        twin = _registered(twin_path, twin_path.stem)[cls](**SMALL, **kwargs).eval()
        twin.load_state_dict(model.state_dict())
        if route == "compile_regions":
            regionalize.compile_regions(model)
        x = torch.randn(2, 3, 32, 32)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            worst = 0.0
            for grad in (False, True):
                with torch.set_grad_enabled(grad):
                    out, expected = model(x), twin(x)
                worst = max(worst, (out - expected).abs().max().item())
        result["warnings"] = [str(w.message) for w in caught if str(w.message).startswith("regionalize:")]
        result["max_difference"] = worst
        result["outcome"] = "ok" if worst <= 1e-4 else "wrong"
    except Exception as error:  # what the run is for: a crash is a finding, recorded
        result["outcome"] = "crash"
        result["error"] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:200]}"
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    folder = fetch()
    scratch = DOWNLOADS / "module-loading"
    scratch.mkdir(parents=True, exist_ok=True)
    rows = []
    for file, cls, kwargs in MODELS:
        source = (folder / file).read_text()
        for route, way in itertools.product(("rewrite", "compile_regions"), WAYS):
            row = {"model": f"{file}:{cls}", **case(source, cls, kwargs, way, route, scratch)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    report = {
        "date": str(datetime.date.today()),
        "machine": machine(),
        "torch": torch.__version__,
        "regionalize": f"{regionalize.__version__} (runtime {runtime_copy.VERSION})",
        "package": PACKAGE,
        "rows": rows,
    }
    (DOCS / "module-loading.md").write_text(_markdown(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


def _markdown(report: dict[str, Any]) -> str:
    rows = report["rows"]
    crashes = sum(row["outcome"] == "crash" for row in rows)
    wrong = sum(row["outcome"] == "wrong" for row in rows)
    lines = [
        "# Models loaded every way Python loads code",
        "",
        f"Measured by `python scripts/module_loading.py` on {report['date']}: {report['package']}'s "
        f"single-file models (depth 4, width 64), torch {report['torch']}, "
        f"regionalize {report['regionalize']}, {report['machine']}. Each loaded one way, compiled by "
        "the rewrite of its file or by `compile_regions`, then called without and with autograd against the "
        "original loaded by import.",
        "",
        f"{len(rows)} cases: {crashes} crashed, {wrong} computed otherwise than the original.",
        "",
        "| model | route | loaded by | outcome | warnings |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        outcome = row["outcome"] if row["outcome"] != "crash" else f"crash: {row['error']}"
        warned = "; ".join(w.removeprefix("regionalize: ") for w in row.get("warnings", [])) or "-"
        lines.append(f"| {row['model']} | {row['route']} | {row['way']} | {outcome} | {warned} |")
    return "\n".join([*lines, ""])


if __name__ == "__main__":
    main()
