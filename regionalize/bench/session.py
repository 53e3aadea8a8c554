"""The models under test: the original and its rewrite(s), built the same way in this process or a worker."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch._inductor.utils import fresh_cache

from regionalize.bench.loading import (
    REWRITTEN_SUFFIX,
    Target,
    Unchanged,
    VerifyError,
    import_original,
    import_rewritten,
    load_factory,
)
from regionalize.bench.trees import to_device
from regionalize.bench.workloads import Custom, GenerateSpec, Spec, Workload, make_workload
from regionalize.shared.options import Options

SEED = 0


@contextlib.contextmanager
def compile_cache(workdir: str) -> Iterator[None]:
    """A fresh inductor cache inside `workdir`: compiles neither read nor fill the user's, and it goes with
    `workdir` even after an error, where torch keeps its own folder and logs where; that line, naming a
    folder about to be removed, is left out."""
    log = logging.getLogger("torch._inductor.utils")

    def kept(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("on error, temporary cache dir kept")

    log.addFilter(kept)
    try:
        with fresh_cache(dir=workdir):
            yield
    finally:
        log.removeFilter(kept)


@dataclass(frozen=True)
class Variant:
    """One way of running the model that gets timed.

    `rewrite` None runs the original source; a dict runs the codemod's output for the verified options
    updated with it ({} is the rewrite being verified).
    """

    name: str
    rewrite: dict[str, object] | None
    compile_whole: bool = False
    time_compile: bool = True  # the bypass changes calls, not compilation: one fresh-process timing is enough
    dynamo: tuple[tuple[str, object], ...] = ()  # torch._dynamo.config settings for its compiles and calls

    @property
    def compiled(self) -> bool:
        return self.compile_whole or self.rewrite is not None


# Adding a variant is one entry here: it is timed, accounted and reported like "regional", in
# steady_us, compile_s, graphs and the table. The bypass variant is the rewrite with the dispatcher (on the
# owner's one frame where the owner is known), which compiles in place.
VARIANTS = (
    Variant("eager", None),
    Variant("full", None, compile_whole=True),
    # The one-line setting anyone can use: Dynamo finds the repeated layers of the full graph itself.
    Variant("full_dedup", None, compile_whole=True, dynamo=(("use_graph_deduplication", True),)),
    Variant("regional", {}),
    # The hierarchical rewrite's alternative: the fastest start, a frame per block call.
    Variant("per_block", {"form": "per-block"}),
    Variant(
        "regional_bypass",
        {"guard_bypass": "depyf", "style": "inplace"},
        time_compile=False,
    ),
)
BY_NAME = {v.name: v for v in VARIANTS}


@dataclass
class Built:
    model: torch.nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    workload: Workload | None = None  # run instead of one forward with args and kwargs
    dynamo: dict[str, Any] = field(default_factory=dict)  # the variant's Dynamo settings, for every call


class VariantUnavailable(Exception):
    """A variant that needs a rewrite with other options, when the rewrite was given as a file."""


class Subject:
    """Loads each source once and builds models from it.

    `sources` maps a rewrite key (see `key`) to a file holding that source; with `transform`, a missing
    rewrite is produced by the codemod, otherwise (a --rewritten file, or a worker) it is unavailable.
    """

    def __init__(
        self,
        target: Target,
        options: Options,
        device: str,
        workdir: Path,
        sources: dict[str, str] | None = None,
        transform: bool = True,
        spec: Spec | None = None,
    ) -> None:
        self.target = target
        self.options = options
        self.device = device
        self.workdir = workdir
        self.sources = {key: Path(path) for key, path in (sources or {}).items()}
        self.transform = transform
        self.spec = spec  # the built-in workload that --workload names, or None
        self._modules: dict[str, ModuleType] = {}
        self._build = load_factory(target)

    @staticmethod
    def key(variant: Variant) -> str:
        """ "original", "rewritten", or "rewritten,guard_bypass=filter" for a rewrite with other options."""
        if variant.rewrite is None:
            return "original"
        return ",".join(["rewritten", *(f"{k}={_word(v)}" for k, v in sorted(variant.rewrite.items()))])

    def source_file(self, variant: Variant) -> Path:
        key = self.key(variant)
        if key == "original":
            return self.target.model_path
        if key not in self.sources:
            if not self.transform:
                raise VariantUnavailable(f"{variant.name} needs the codemod's output with {variant.rewrite}")
            assert variant.rewrite is not None
            self.sources[key] = self._transform(key, dataclasses.replace(self.options, **variant.rewrite))
        return self.sources[key]

    def _transform(self, key: str, options: Options) -> Path:
        from regionalize.codemod.transform import transform_source

        source = self.target.model_path.read_text(encoding="utf-8")
        result = transform_source(source, options, str(self.target.model_path))
        if result.status == "failure":
            raise VerifyError("rewrite", result.reason)
        if not result.changed:
            name = self.target.model_path.name
            raise Unchanged("rewrite", f"the codemod leaves {name} unchanged: {result.reason}")
        suffix = key.replace("rewritten", "").replace(",", "_").replace("=", "-")
        path = self.workdir / f"{self.target.model_path.stem}{REWRITTEN_SUFFIX}{suffix}.py"
        path.write_text(result.code, encoding="utf-8")
        return path

    def module(self, variant: Variant) -> ModuleType:
        key = self.key(variant)
        if key not in self._modules:
            if key == "original":
                self._modules[key] = import_original(self.target)
            else:
                path = self.source_file(variant)
                self._modules[key] = import_rewritten(self.target, path.read_text(encoding="utf-8"), path)
        return self._modules[key]

    def build(self, variant: Variant) -> Built:
        """Call the factory with a fixed seed, move everything to the device, wrap for a full compile."""
        module = self.module(variant)
        torch.manual_seed(SEED)
        random.seed(SEED)
        try:
            made = self._build(module)
        except VerifyError:
            raise
        except BaseException as exc:
            raise VerifyError.from_exception("factory", exc) from exc
        bare_model = isinstance(self.spec, GenerateSpec)  # generate makes a prompt from the config
        built = _unpack(made, self.target.factory_name, bare_model)
        built.dynamo = dict(variant.dynamo)
        built.model.to(self.device).eval()
        built.args = to_device(built.args, self.device)
        built.kwargs = to_device(built.kwargs, self.device)
        if self.spec is not None:
            if built.workload is not None:
                raise VerifyError("workload", f"--workload {self.spec.kind} needs (model, args), not a run")
            built.workload = make_workload(self.spec, built.model, built.args, built.kwargs, SEED)
        if variant.compile_whole and built.workload is not None:
            # In place: a workload calls the model it is given, often through methods (`generate`) that
            # an OptimizedModule wrapper would hand to the uncompiled original; `Module.compile` makes
            # every `model(...)` inside them, transformers' `self.__call__` included, run compiled.
            built.model.compile(**self.options.compile_kwargs())
        elif variant.compile_whole:
            built.model = torch.compile(built.model, **self.options.compile_kwargs())
        return built


def _word(value: object) -> str:
    """A setting in a rewrite's key, which also names its file: class names joined, not a set's repr."""
    return "+".join(sorted(value)) if isinstance(value, frozenset) else str(value)


def _unpack(made: Any, name: str, bare_model: bool = False) -> Built:
    if bare_model and isinstance(made, torch.nn.Module):
        return Built(made, (), {})  # --workload generate makes a prompt from the config
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise VerifyError(
            "factory",
            f"{name}() must return (model, args), (model, args, kwargs) or (model, run), "
            f"not {type(made).__name__}",
        )
    model, args, *rest = made
    if callable(args) and not isinstance(args, tuple) and not rest:
        # (model, run): a workload. A tuple of args is never callable; a lone tensor argument is not either.
        if not isinstance(model, torch.nn.Module):
            raise VerifyError("factory", f"{name}() returned a {type(model).__name__}, not an nn.Module")
        return Built(model, (), {}, Custom(args))
    kwargs = rest[0] if rest else {}
    if not isinstance(model, torch.nn.Module):
        raise VerifyError("factory", f"{name}() returned a {type(model).__name__}, not an nn.Module")
    if not isinstance(kwargs, dict):
        raise VerifyError("factory", f"{name}()'s example kwargs must be a dict, not {type(kwargs).__name__}")
    # A lone tensor is the one positional argument, as people tend to write it.
    return Built(model, tuple(args) if isinstance(args, (tuple, list)) else (args,), kwargs)


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise VerifyError("device", f"--device cuda, but torch {torch.__version__} sees no CUDA device")
    if device not in ("cpu", "cuda"):
        raise VerifyError("device", f"unknown device {device!r}: use auto, cpu or cuda")
    return device
