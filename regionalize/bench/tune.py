"""`regionalize tune`: measure which compiled sites share a graph between their blocks, and which do not.

The codemod cannot see widths or strides. A block class built at a different width per stage (a UNet's
`ResnetBlock2D`, ResNet's layers) compiles one graph per width: its regional compile shares nothing and
costs more start time than a full compile. Here the model is built from its rewrite with every block
compiled on its own (`--form per-block`, each compile one entry of the class's `forward`), run once,
and Dynamo's records say how many graphs each class needed for how many compiled blocks:

- a class with at least as many graphs as blocks shares none: `never`;
- a class the model's declaration left out (RGZ111) whose blocks do share a graph: `always`.

Settings change the sites (a stage whose layers are no longer compiled becomes a site itself), so the
probe runs again with them until nothing changes. Then the rewrite before and after is timed: first call
in fresh processes, per call in this one.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch._dynamo import utils as dynamo_utils

from regionalize.bench.accounting import recording
from regionalize.bench.loading import Target, VerifyError, import_paths
from regionalize.bench.progress import QUIET, Progress
from regionalize.bench.session import BY_NAME, Subject, Variant, compile_cache, resolve_device
from regionalize.bench.timing import WorkerJob, call, options_to_json, run_worker, steady_us
from regionalize.codemod.transform import transform_source
from regionalize.runtime.per_block import static_options
from regionalize.shared.options import Options

_ROUNDS = 3  # a setting can make an outer level a site; nesting is a few levels deep
_WORKER_TIMEOUT_S = 1800
# What an RGZ111 site line says to pass to compile it anyway: the class name as the codemod matches it.
_ALWAYS_HINT = re.compile(r"`--always (\w+)`")


@dataclass
class ClassGraphs:
    blocks: int = 0  # modules of the class compiled on their own
    graphs: int = 0  # graphs Dynamo made for the class's forward

    @property
    def shared(self) -> bool:
        return self.graphs < self.blocks


@dataclass
class Tuning:
    options: Options  # the user's settings with the tuned `never` and `always`
    never: list[str] = field(default_factory=list)  # added by the measurement
    always: list[str] = field(default_factory=list)
    classes: dict[str, ClassGraphs] = field(default_factory=dict)  # the last probe's
    # "full", "before", "after" -> {"first_s": .., "per_call_us": .., "compiled": False when no site was}
    timings: dict[str, dict[str, Any]] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)  # `always` found, then measured slower than full

    def settings(self) -> str:
        """The `[tool.regionalize]` lines that reproduce the tuned rewrite."""
        lines = ["[tool.regionalize]"]
        for key in ("never", "always"):
            values = sorted(getattr(self.options, key))
            if values:
                lines.append(f"{key} = [{', '.join(repr(v).replace(chr(39), chr(34)) for v in values)}]")
        return "\n".join(lines) + "\n"


def tune(
    target: Target,
    factory: str,
    options: Options,
    device: str = "auto",
    time_it: bool = True,
    progress: Progress = QUIET,
) -> Tuning:
    """The settings that leave uncompiled every class whose blocks share no graph, timed before and after."""
    device = resolve_device(device)
    candidates = _left_out(target.model_path, options)
    tuning = Tuning(options)
    with (
        tempfile.TemporaryDirectory(prefix="regionalize-tune-") as workdir,
        import_paths(target),
        compile_cache(workdir),
    ):
        subject = Subject(target, options, device, Path(workdir))
        never: set[str] = set()
        for number in range(_ROUNDS):
            progress(f"probing which blocks share a graph (round {number + 1})")
            probe = dataclasses.replace(
                options, never=options.never | never, always=options.always | (candidates - never)
            )
            classes = _probe(subject, probe)
            # Accumulated: a class set to `never` is no longer compiled, so a later probe cannot see it.
            found = {name for name, c in classes.items() if not c.shared and name not in options.always}
            tuning.classes = {**tuning.classes, **classes}
            if found <= never:
                break
            never |= found
        always = _kept(subject, options, never, candidates, classes, progress)
        tuning.options = dataclasses.replace(
            options, never=options.never | never, always=options.always | always
        )
        tuning.never = sorted(never)
        tuning.always = sorted(always)
        if time_it:
            _measure(tuning, subject, factory, options, progress)
    progress("done")
    return tuning


def _kept(
    subject: Subject,
    options: Options,
    never: set[str],
    candidates: frozenset[str],
    classes: dict[str, ClassGraphs],
    progress: Progress,
) -> set[str]:
    """The candidates for `always` whose blocks share a graph. A candidate may name the variable or
    factory that builds the blocks (`layer(..)` in ResNet) rather than their class: those are kept when
    every class that only they compile shares its graphs, as a probe without any candidate shows."""
    kept = {name for name in candidates - never if name in classes and classes[name].shared}
    unnamed = candidates - never - classes.keys()
    if not unnamed:
        return kept
    progress("probing without the left-out classes")
    baseline = _probe(subject, dataclasses.replace(options, never=options.never | never))
    theirs = [c for name, c in classes.items() if name not in baseline and name not in candidates]
    if theirs and all(c.shared for c in theirs):
        kept |= unnamed
    return kept


def _left_out(model: Path, options: Options) -> frozenset[str]:
    """The classes the model's declaration of repeated blocks left out (RGZ111): candidates for `always`."""
    result = transform_source(model.read_text(encoding="utf-8"), options, str(model))
    hints = (_ALWAYS_HINT.search(site.reason) for site in result.sites if site.code == "RGZ111")
    return frozenset(match[1] for match in hints if match)


# Room for a graph per block in the probe: torch's limit of 8 would run the ninth block of a class eagerly
# and count 8 graphs for 12 blocks as shared.
_PROBE_DYNAMO = (("recompile_limit", 1024), ("accumulated_recompile_limit", 1024))


def _probe(subject: Subject, options: Options) -> dict[str, ClassGraphs]:
    """Build the per-block rewrite with `options`, call it once, count graphs per compiled block class.

    Blocks of a class held at other widths in the model compile with static shapes, as the runtime's
    per-block fallback compiles them (`static_options`): `block.compile()` alone compiled Swin's
    second width again with dynamic shapes, and Inductor's CPU code generation stayed in sympy for over 15
    minutes, so tune never finished."""
    changes = {"form": "per-block", "never": options.never, "always": options.always}
    try:
        built = subject.build(Variant("probe", changes, dynamo=_PROBE_DYNAMO))
    except VerifyError as exc:
        if "unchanged" in exc.message:
            return {}  # nothing left to compile
        raise
    given = options.compile_kwargs()
    attribution = _ByCall()
    for module in built.model.modules():
        if getattr(module, "_compiled_call_impl", None) is not None:
            static = static_options(module, given, built.model)
            if static is not given:
                module.compile(**static)
            attribution.watch(module)
    with recording():
        try:
            call(built, first=True)
        except Exception as exc:
            raise VerifyError.from_exception("probe", exc) from exc
        attribution.flush()
    # A class none of whose compiles made a graph is not judged.
    return {name: c for name, c in attribution.classes().items() if c.graphs}


class _ByCall:
    """Graphs per class, each graph given to the compiled block that was running when Dynamo made it.

    Dynamo's records name the code it compiled, not the module, and a decorator many classes share gives
    their compiles one code: transformers' gradient-checkpointing wrapper on every decoder layer,
    `deprecate_kwarg` on many forwards. A class's count is that of the code it compiled most often, so
    the resume functions of a graph break count once, not once more per block."""

    def __init__(self) -> None:
        self._blocks: Counter[str] = Counter()
        self._codes: dict[str, Counter[tuple[str, int, str]]] = {}
        self._running: list[str] = []
        self._seen = 0

    def watch(self, module: torch.nn.Module) -> None:
        """Wrap the block's compiled call, which Dynamo never traces (it inlines `_call_impl` when an
        outer compile calls the block), so the wrapper runs only where the block is called eagerly."""
        name = type(module).__name__
        self._blocks[name] += 1
        self._codes.setdefault(name, Counter())
        compiled = module._compiled_call_impl
        assert compiled is not None

        def running(*args: Any, **kwargs: Any) -> Any:
            self.flush()
            self._running.append(name)
            try:
                return compiled(*args, **kwargs)
            finally:
                self.flush()
                self._running.pop()

        module._compiled_call_impl = running

    def flush(self) -> None:
        """Give the graphs made since the last flush to the innermost block running."""
        records = dynamo_utils.get_compilation_metrics()
        new, self._seen = records[self._seen :], len(records)
        if not self._running:
            return
        codes = self._codes[self._running[-1]]
        codes.update((r.co_filename, r.co_firstlineno, r.co_name) for r in new if r.graph_op_count)

    def classes(self) -> dict[str, ClassGraphs]:
        return {
            name: ClassGraphs(blocks, max(self._codes[name].values(), default=0))
            for name, blocks in self._blocks.items()
        }


def _measure(tuning: Tuning, subject: Subject, factory: str, options: Options, progress: Progress) -> None:
    """Full compile, and the rewrite before and after the settings. `always` is kept only if it does not
    start slower than full compile, or than the settings without it: sharing a graph is not enough when
    the shared graphs are many (ResNet's layers: 8 graphs for 16 blocks, slower to start than full)."""
    timings = tuning.timings

    def time_rewrite(name: str, settings: Options) -> dict[str, Any]:
        changes = {"never": settings.never, "always": settings.always}
        return _time(name, subject, factory, settings, Variant("rewrite", changes), progress)

    timings["full"] = _time("full", subject, factory, options, BY_NAME["full"], progress)
    timings["before"] = time_rewrite("before", options)
    timings["after"] = time_rewrite("after", tuning.options)
    if tuning.always and timings["after"]["first_s"] > timings["full"]["first_s"]:
        without = dataclasses.replace(tuning.options, always=options.always)
        timings["after, without always"] = time_rewrite("after, without always", without)
        if timings["after, without always"]["first_s"] < timings["after"]["first_s"]:
            tuning.options, tuning.dropped, tuning.always = without, tuning.always, []


def _time(
    name: str, subject: Subject, factory: str, options: Options, variant: Variant, progress: Progress
) -> dict[str, Any]:
    """First call (fresh process, empty caches, after a warm-up compile) and per call (this process)."""
    progress(f"timing {name}")
    compiled = True
    try:
        path = subject.source_file(variant) if variant.rewrite is not None else None
    except VerifyError as exc:
        if "unchanged" not in exc.message:
            raise
        variant, path, compiled = BY_NAME["eager"], None, False  # no site left: the model runs as written
    job = WorkerJob(
        model_path=str(subject.target.model_path),
        factory=factory,
        variant="regional" if path else variant.name,
        sources={"rewritten": str(path)} if path else {},
        options=options_to_json(options),
        device=subject.device,
        warm=True,
        sys_path=[p for p in sys.path if p],
    )
    first = run_worker(job, _WORKER_TIMEOUT_S)["first_call_s"]
    built = subject.build(variant)
    torch.compiler.reset()
    return {"first_s": first, "per_call_us": steady_us(built, subject.device), "compiled": compiled}


def render(tuning: Tuning) -> str:
    """The measurement, the settings, and the timings, as the terminal shows them."""
    lines = ["class                                    blocks  graphs  verdict"]
    for name, c in sorted(tuning.classes.items()):
        verdict = "shared" if c.shared else "none shared: never"
        if name in tuning.always:
            verdict = "shared: always (left out by the declaration)"
        lines.append(f"{name:<40} {c.blocks:>6}  {c.graphs:>6}  {verdict}")
    if tuning.timings:
        lines += ["", "variant                  first call   per call"]
        for name, t in tuning.timings.items():
            note = "" if t["compiled"] else "  (no site compiled: the model as written)"
            lines.append(f"{name:<23}  {_s(t['first_s']):>10}   {_us(t['per_call_us']):>8}{note}")
    if tuning.dropped:
        lines.append(f"always = {tuning.dropped} left out: measured slower to start than a full compile")
    changed = tuning.never or tuning.always
    if changed:
        lines += ["", "settings:"]
    elif tuning.classes:
        lines += ["", "nothing to change: every compiled class shares its graphs"]
    else:
        # Every compiled block ran without Dynamo making a graph (all of them graph breaks, or no ops).
        lines += [
            "",
            "nothing to change: no compiled class could be judged (none made a graph)",
        ]
    if changed:
        lines.append(tuning.settings().rstrip("\n"))
    return "\n".join(lines) + "\n"


def to_json(tuning: Tuning) -> dict[str, Any]:
    return {
        "never": tuning.never,
        "always": tuning.always,
        "settings": {"never": sorted(tuning.options.never), "always": sorted(tuning.options.always)},
        "classes": {name: dataclasses.asdict(c) for name, c in tuning.classes.items()},
        "timings": tuning.timings,
        "dropped": tuning.dropped,
    }


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value / 1000:.2f} ms"
