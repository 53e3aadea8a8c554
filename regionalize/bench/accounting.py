"""What Dynamo did during a call: frames, graphs, recompiles (and why), graph breaks, recompile-limit hits.

Read from Dynamo's own bookkeeping rather than from logs: `torch._dynamo.utils.counters` (frames,
unique graphs, graph-break messages) and the per-frame `CompilationMetrics` records, which carry the
recompile reason and the failure of a frame that hit `recompile_limit`. CompileProfiler, which used to
expose this, is gone from recent releases.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch._dynamo import utils as dynamo_utils

from regionalize.bench.served import ALONE, GRAD, PROMPT, STATIC
from regionalize.runtime.describe import OwnerReport, report_of

# Dynamo's graph-break type for a frame that ran out of recompiles; such a frame then runs eagerly
# for every input its cached graphs do not accept.
_LIMIT_HIT = re.compile(r"recompile limit exceeded", re.IGNORECASE)
_LIMIT_KIND = re.compile(r"Limit type: (\w+)")
_METRICS_KEPT = 100_000  # Dynamo keeps only the last 64 records by default; a deep model makes more
_COMPILE_ID = re.compile(r"^\[?\d+/\d+\]?:\s*")
_SOURCE_NOTE = re.compile(r"#\s.*?#\s*(?P<where>\S+:\d+) in (?P<fn>\w+)")
_NUMBER = re.compile(r"\b\d+\b")


@dataclass
class GraphAccount:
    frames: int = 0  # frames Dynamo compiled to a graph
    graphs: int = 0  # graphs handed to the backend
    recompiles: int = 0
    # Recompile reasons grouped with numbers abstracted ("self.layer_idx == N"): example -> count.
    recompile_reasons: dict[str, int] = field(default_factory=dict)
    graph_breaks: int = 0
    graph_break_reasons: dict[str, int] = field(default_factory=dict)
    fell_back_to_eager: bool = False
    fallback: str = ""  # which function hit which limit, and the last recompile reason
    # Nested compile regions (the hierarchical form): traced, or stamped out from a region traced before.
    # None where torch records neither (before its stamp-out: torch 2.11 traces every region, then
    # keeps one graph of those that came out the same).
    regions_traced: int | None = 0
    regions_stamped: int | None = 0
    # Per owner class of the hierarchical form: "whole", or "per-block: <why it fell back>".
    forms: dict[str, str] = field(default_factory=dict)
    # The same owners as records (`regionalize.describe`), for code that tells forms apart.
    owners: list[OwnerReport] = field(default_factory=list)
    # CUDA graphs that torch's CUDA-graph trees (the reduce-overhead mode's) captured, and calls they
    # served by replaying one; None where no CUDA device is.
    cuda_graphs: CudaGraphCount | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "frames": self.frames,
            "graphs": self.graphs,
            "recompiles": self.recompiles,
            "recompile_reasons": self.recompile_reasons,
            "graph_breaks": self.graph_breaks,
            "graph_break_reasons": self.graph_break_reasons,
            "fell_back_to_eager": self.fell_back_to_eager,
            "fallback": self.fallback,
            "regions_traced": self.regions_traced,
            "regions_stamped": self.regions_stamped,
            "forms": self.forms,
            "owners": [dataclasses.asdict(report) for report in self.owners],
            "cuda_graphs_captured": None if self.cuda_graphs is None else self.cuda_graphs.captured,
            "cuda_graphs_replayed": None if self.cuda_graphs is None else self.cuda_graphs.replayed,
        }


@dataclass
class CudaGraphCount:
    captured: int = 0
    replayed: int = 0


@contextlib.contextmanager
def counting_cuda_graphs() -> Iterator[CudaGraphCount | None]:
    """Count, during the body, the CUDA graphs that torch's CUDA-graph trees capture (`record_function`
    of their manager) and the calls they serve by replaying a captured one (`execute_node`): the
    manager's two methods are wrapped for the body, and are torch's own again after it. Those the
    runtime captures itself (an owner compiled in pieces) it counts in Dynamo's counters, under
    "regionalize". None where no CUDA device is: nothing is captured there."""
    if not torch.cuda.is_available():
        yield None
        return
    from torch._inductor import cudagraph_trees

    manager, count = cudagraph_trees.CUDAGraphTreeManager, CudaGraphCount()
    record, execute = manager.record_function, manager.execute_node

    def recorded(self: object, *args: object, **kwargs: object) -> object:
        count.captured += 1
        return record(self, *args, **kwargs)

    def executed(self: object, *args: object, **kwargs: object) -> object:
        count.replayed += 1
        return execute(self, *args, **kwargs)

    manager.record_function, manager.execute_node = recorded, executed
    own = dynamo_utils.counters["regionalize"]
    before = own["cuda_graphs_captured"], own["cuda_graphs_replayed"]
    try:
        yield count
    finally:
        manager.record_function, manager.execute_node = record, execute
        own = dynamo_utils.counters["regionalize"]  # a new one where the body cleared the counters
        count.captured += own["cuda_graphs_captured"] - before[0]
        count.replayed += own["cuda_graphs_replayed"] - before[1]


@contextlib.contextmanager
def recording() -> Iterator[GraphAccount]:
    """Reset Dynamo, run the body, fill in the yielded account from what Dynamo recorded.

    The reset matters both ways: earlier compiles must not count, and cached graphs must not hide the
    recompiles a fresh process would see.
    """
    torch.compiler.reset()
    dynamo_utils.counters.clear()
    dynamo_utils.clear_compilation_metrics()
    dynamo_utils.set_compilation_metrics_limit(_METRICS_KEPT)
    dynamo_utils.compilation_time_metrics.clear()
    account = GraphAccount()
    with counting_cuda_graphs() as graphs:
        yield account
    account.cuda_graphs = graphs
    _fill(account, dynamo_utils.counters, dynamo_utils.get_compilation_metrics())
    timed = dynamo_utils.compilation_time_metrics
    if importlib.util.find_spec("torch._dynamo.variables.invoke_subgraph") is None:
        account.regions_traced = account.regions_stamped = None
    else:
        account.regions_traced = len(timed.get("invoke_subgraph_trace", []))
        account.regions_stamped = len(timed.get("invoke_subgraph_reuse_stamp_out", []))


def owner_reports(model: torch.nn.Module) -> list[OwnerReport]:
    """The runtime's record of each owner of `model` (`regionalize.describe`), including those of a vendored
    copy of the runtime, whose states keep the same fields; none for a copy older than owners' plans."""
    return [
        report_of(module, state)
        for module in model.modules()
        if _has_plan(state := module.__dict__.get("_regionalize_owner"))
    ]


def _has_plan(state: object) -> bool:
    """Whether an owner's state holds a plan: its report's (this runtime's), or its own (before 0.3)."""
    return hasattr(state, "report") or hasattr(state, "plan")


def note_owners(account: GraphAccount, model: torch.nn.Module) -> None:
    """Put in `account` the form each owner of `model` runs in, as records and as text."""
    account.owners = owner_reports(model)
    account.forms = served_forms(model)


def served_forms(model: torch.nn.Module) -> dict[str, str]:
    """Which form each owner runs in, as the text verify prints: compiled whole (with its blocks' caches
    traced layer by layer, and why, where their stand-ins failed to trace); in pieces, and there per block
    where a call hands a StaticCache, `STATIC`, or a prompt's DynamicCache, `PROMPT`, with why it is in
    pieces; its one block compiled on its own (`ALONE`); per block as this torch's form or the backend's
    (`per block, <why>`), or because it could not be compiled whole (`per-block: <why>`)."""
    forms = {report.owner: form_text(report) for report in owner_reports(model)}
    for module in model.modules():  # an older vendored copy's owners, whose states have no plan
        state = module.__dict__.get("_regionalize_owner")
        if state is not None and not _has_plan(state):
            forms[type(module).__name__] = _served_before_plans(state)
    return forms


def saved_owners(model: torch.nn.Module) -> dict[str, str]:
    """Each owner asked to save (`runtime/saved.py`): whether its compiled frame was "loaded", "saved", or
    why not, and what became of its blocks' frames where calls with autograd ran them one by one (a
    training step's owner is not called whole, but its blocks' frames are saved); none where saving was not
    asked for."""
    found = {}
    for report in owner_reports(model):
        if report.saved is not None:
            blocks = "" if report.grad_saved is None else f"; blocks {report.grad_saved}"
            found[report.owner] = report.saved + blocks
    return found


def saved_bytes() -> int | None:
    """The size of the saved owners' files under torch's cache directory; None where there are none."""
    from regionalize.runtime.internals.aot import saving
    from regionalize.runtime.saved import folder

    if saving() is None or not os.path.isdir(folder()):
        return None
    return sum(entry.stat().st_size for entry in os.scandir(folder()) if entry.is_file()) or None


def form_text(report: OwnerReport) -> str:
    """The text verify prints for the form of the owner that `report` describes."""
    if report.form == "per block":
        return f"per-block: {report.reason}" if report.fallback else f"per block, {report.reason}"
    if report.form == "alone":
        return ALONE
    served = _whole(
        report.pieces, report.static_calls, report.prompt_calls, report.reason, report.layer_by_layer
    )
    return f"{served}; {GRAD}" if report.grad_calls else served


def _whole(pieces: str | None, static: bool, prompt: bool, reason: str | None, kv: str | None) -> str:
    """An owner compiled whole: in pieces (how many, and why) and calls served per block, or not."""
    if pieces or static or prompt:
        ways = [f"whole, in pieces ({pieces})"] if pieces else []
        ways += [way for ok, way in ((static, STATIC), (prompt, PROMPT)) if ok]
        return f"{'; '.join(ways)}: {reason}"
    return "whole" if kv is None else f"whole, caches traced layer by layer: {kv}"


def _served_before_plans(state: object) -> str:
    """The form of an owner of an older vendored copy, from the flags it kept (a dict up to runtime 23)."""
    read = state.get if isinstance(state, dict) else lambda name: getattr(state, name, None)
    why, regions = read("why"), read("regions")
    if why is not None:
        return f"per block, {why}" if read("unreused") else f"per-block: {why}"
    if read("alone"):
        return ALONE
    failed = regions and f"its blocks cannot be nested regions ({regions})"
    reason = read("constants") or failed or "this torch does not reuse a traced region"
    return _whole(read("pieces"), read("static"), read("prompt"), reason, read("kv"))


def _fill(account: GraphAccount, counters: dict, metrics: list) -> None:
    # A frame compiled with fullgraph (the hierarchical form's owner) is not in the "frames" counter.
    whole = sum(1 for record in metrics if getattr(record, "graph_op_count", None))
    account.frames = max(counters["frames"]["ok"], whole)
    account.graphs = counters["stats"]["unique_graphs"]
    breaks = Counter({_first_line(msg): n for msg, n in counters["graph_break"].items()})
    account.graph_breaks = sum(breaks.values())
    account.graph_break_reasons = dict(breaks.most_common())
    reasons: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for record in metrics:
        guard, where = describe_reason(record.recompile_reason or "")
        if record.fail_reason and _LIMIT_HIT.search(record.fail_reason):
            account.fell_back_to_eager = True
            kind = _LIMIT_KIND.search(record.fail_reason)
            limit = kind.group(1) if kind else "recompile_limit"
            value = getattr(torch._dynamo.config, limit, "?")
            account.fallback = f"{where or 'a block'} hit {limit} ({value}); last guard that failed: {guard}"
        elif record.recompile_reason:
            # Group "self.layer_idx == 1", "== 2", ... as one reason; keep the first as the example.
            key = _NUMBER.sub("N", guard) + (f" ({where})" if where else "")
            examples.setdefault(key, guard + (f" ({where})" if where else ""))
            reasons[key] += 1
    account.recompiles = sum(reasons.values())
    account.recompile_reasons = {
        (key if reasons[key] > 1 else examples[key]): n for key, n in reasons.most_common()
    }


def describe_reason(raw: str) -> tuple[str, str]:
    """`0/6: self.layer_idx == 6   # return ... # path/model.py:8 in forward (HINT...)`
    -> ("self.layer_idx == 6", "model.py:8 in forward")."""
    line = _COMPILE_ID.sub("", _first_line(raw))
    guard, _, note = line.partition("#")
    where = _SOURCE_NOTE.search("# " + note)
    # Dynamo shortens the path from the left ("ork/main/model.py"); the file name alone is clearer.
    return guard.strip(), f"{os.path.basename(where['where'])} in {where['fn']}" if where else ""


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""
