"""The rewrites of transformers' modeling_llama.py: made where libcst imports (`prepare`), checked against the
transformers installed and loaded where it need not (the GPU machine)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

from .settings import LLAMA_DIR, MODELING, REWRITES, ROOT


def installed_modeling_file() -> Path:
    spec = importlib.util.find_spec(MODELING)
    assert spec is not None and spec.origin, f"cannot find {MODELING}"
    return Path(spec.origin)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def prepare(out: Path, wheel: Path | None) -> dict[str, Any]:
    """Write the rewrites of modeling_llama.py (of `wheel`, or of the installed transformers), in the import
    form users get (`import regionalize`: the runtime of the checkout on the path where they run), and
    manifest.json saying what they were made from."""
    from regionalize.codemod import transform_source
    from regionalize.codemod.runtime_copy import VERSION
    from regionalize.shared.options import Options

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-serving-wheel-") as unpacked:
        if wheel is not None:
            # The file inside its package tree, so that the codemod sees a module of the transformers
            # package (the runtime imported from its top) and reads the package's own modules that the
            # file imports from; the other models are left out.
            with zipfile.ZipFile(wheel) as archive:
                for name in archive.namelist():
                    model = name.startswith("transformers/models/") and name.count("/") > 2
                    if name.startswith("transformers/") and (not model or name.startswith(LLAMA_DIR)):
                        archive.extract(name, unpacked)
            path, version = Path(unpacked) / LLAMA_DIR / "modeling_llama.py", wheel.name.split("-")[1]
        else:
            import importlib.metadata

            path, version = installed_modeling_file(), importlib.metadata.version("transformers")
        source = path.read_text(encoding="utf-8")
        files = {}
        for key, settings in REWRITES.items():
            result = transform_source(source, Options(**settings), str(path))
            assert result.status == "success", f"{key}: {result.status}: {result.reason}"
            assert "\nimport regionalize\n" in result.code, f"{key}: the runtime is not imported"
            name = f"modeling_llama__{key}.py"
            (out / name).write_text(result.code, encoding="utf-8")
            files[key] = {"file": name, "options": settings}
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True
    ).stdout.strip()
    manifest = {
        "transformers": version,
        "source_sha256": sha256(source),
        "runtime": VERSION,
        "regionalize_commit": commit or None,
        "rewrites": files,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def check_prepared(prepared: Path) -> dict[str, Any]:
    """The manifest, once the installed modeling_llama.py is known to be the file it was made from."""
    manifest = json.loads((prepared / "manifest.json").read_text())
    here = installed_modeling_file().read_text(encoding="utf-8")
    if sha256(here) != manifest["source_sha256"]:
        import importlib.metadata

        installed = importlib.metadata.version("transformers")
        sys.exit(
            f"error: {prepared} holds rewrites of transformers {manifest['transformers']}'s "
            f"modeling_llama.py; this machine has transformers {installed}, whose file differs: make them "
            f"again with --prepare and --transformers-wheel (transformers-{installed}-py3-none-any.whl)"
        )
    return manifest


def load_rewritten(prepared: Path, key: str) -> ModuleType:
    """The rewrite `key`, imported as a sibling of transformers' module (relative imports resolve in its
    package), as regionalize verify does."""
    path = (prepared / f"modeling_llama__{key}.py").resolve()
    name = f"{MODELING}__regionalized_{key}"
    spec = importlib.util.spec_from_loader(name, loader=None, origin=str(path))
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__file__ = str(path)  # Dynamo, tracebacks and inspect read the lines back from it
    sys.modules[name] = module  # registered before running, as an import does
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), module.__dict__)
    return module
