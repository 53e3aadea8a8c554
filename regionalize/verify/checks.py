"""The correctness checks: checkpoint compatibility and numerical equivalence (forward and gradients)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from regionalize.bench.loading import VerifyError
from regionalize.bench.session import SEED, Built
from regionalize.bench.trees import clone_inputs
from regionalize.bench.workloads import projected_loss
from regionalize.verify.compare import Difference, compare, compare_leaf

_WRAPPER = "_orig_mod."  # what torch.compile's OptimizedModule adds to every key below it
_LISTED = 5  # keys named in a report before "and N more"


@dataclass
class StateDictCheck:
    compatible: bool
    keys: int
    missing: list[str] = field(default_factory=list)  # in the original checkpoint, unknown to the rewrite
    unexpected: list[str] = field(default_factory=list)  # expected by the rewrite, absent from the checkpoint
    error: str = ""  # what load_state_dict(strict=True) said

    def to_json(self) -> dict[str, object]:
        return {
            "compatible": self.compatible,
            "keys": self.keys,
            "missing": self.missing,
            "unexpected": self.unexpected,
            "error": self.error,
        }


def check_state_dict(original: torch.nn.Module, rewritten: torch.nn.Module) -> StateDictCheck:
    """Does the original's checkpoint load into the rewrite unchanged? Loads it, strictly, as a user would."""
    saved = original.state_dict()
    wanted = rewritten.state_dict()
    missing = sorted(set(saved) - set(wanted))
    unexpected = sorted(set(wanted) - set(saved))
    error = ""
    try:
        rewritten.load_state_dict(saved, strict=True)
    except RuntimeError as exc:
        error = " ".join(str(exc).split())
    ok = not missing and not unexpected and not error
    return StateDictCheck(ok, len(saved), missing, unexpected, error)


def copy_weights(original: torch.nn.Module, rewritten: torch.nn.Module) -> str:
    """Give the rewrite the original's weights even when keys moved under `_orig_mod.`; "" or why not."""
    saved = original.state_dict()
    mapped = {key: saved.get(key.replace(_WRAPPER, "")) for key in rewritten.state_dict()}
    absent = [key for key, value in mapped.items() if value is None]
    if absent or len(mapped) != len(saved):
        return f"the rewrite's parameters do not match the original's ({_some(absent) or 'different counts'})"
    try:
        rewritten.load_state_dict(mapped, strict=True)
    except RuntimeError as exc:  # same names, other shapes
        return " ".join(str(exc).split())
    return ""


def _some(keys: list[str]) -> str:
    shown = ", ".join(keys[:_LISTED])
    return shown + (f" and {len(keys) - _LISTED} more" if len(keys) > _LISTED else "")


@dataclass
class Equivalence:
    forward: list[Difference] = field(default_factory=list)
    gradients: list[Difference] = field(default_factory=list)
    backward_note: str = ""  # why gradients were not compared, when they were not


class RewriteRaised(Exception):
    """The rewritten model raised where the original ran: the rewrite broke it (exit 1, not 2)."""


def check_equivalence(original: Built, rewritten: torch.nn.Module) -> Equivalence:
    """Same inputs through both models in eval mode: outputs without grad, then parameter gradients.

    With a workload, its results (the same workload run on each model, same seed) are compared instead,
    and gradients only where the workload trains and returns them.
    """
    result = Equivalence()
    workload = original.workload
    with torch.set_grad_enabled(workload is not None and workload.grad):
        expected = _run(original.model, original, "run original")
        actual = _run(rewritten, original, "")
    result.forward = compare(expected, actual)
    if workload is not None:
        trains = "compared in the workload's results"
        result.backward_note = trains if workload.grad else "not compared: a workload runs without autograd"
        return result
    want = _run(original.model, original, "run original", _gradients)
    if isinstance(want, str):
        result.backward_note = want
        return result
    got = _run(rewritten, original, "", _gradients)
    if isinstance(got, str):
        got = {}
    result.gradients = [compare_leaf(f"grad:{name}", want[name], got[name]) for name in want if name in got]
    result.gradients += [
        Difference(f"grad:{name}", False, None, "no gradient in the rewrite")
        for name in want
        if name not in got
    ]
    return result


def _run(model: torch.nn.Module, inputs: Built, stage: str, how: Any = None) -> Any:
    """Call the model (or `how(model, inputs)`); an exception is the user's (`stage`) or RewriteRaised."""
    try:
        if how is not None:
            return how(model, inputs)
        if inputs.workload is not None:
            # The same random stream for both models, as their weights were built under the same seed.
            torch.manual_seed(SEED)
            return inputs.workload.run(model)
        return model(*clone_inputs(inputs.args), **clone_inputs(inputs.kwargs))
    except Exception as exc:
        if stage:
            raise VerifyError.from_exception(stage, exc) from exc
        raise RewriteRaised(f"{type(exc).__name__}: {exc}") from exc


def _gradients(model: torch.nn.Module, inputs: Built) -> dict[str, torch.Tensor] | str:
    """Parameter gradients of a fixed random projection of every floating output (or why there are none)."""
    model.zero_grad(set_to_none=True)
    loss = projected_loss(model(*clone_inputs(inputs.args), **clone_inputs(inputs.kwargs)))
    if loss is None:
        return "no floating-point output requires grad, so there is no backward pass to compare"
    loss.backward()
    grads = {name.replace(_WRAPPER, ""): p.grad for name, p in model.named_parameters() if p.grad is not None}
    return grads or "no parameter received a gradient"


def summarize(diffs: list[Difference]) -> dict[str, Any]:
    """Largest difference (and where), and the failing leaves, for the report."""
    numeric = [d for d in diffs if d.max_abs is not None]
    top = max(numeric, key=lambda d: d.max_abs or 0.0, default=None)
    return {
        "ok": all(d.ok for d in diffs),
        "compared": len(diffs),
        "max_abs_diff": top.max_abs if top else None,
        "max_abs_diff_at": top.path if top else None,
        "failures": [
            {"path": d.path, "max_abs_diff": d.max_abs, "detail": d.detail} for d in diffs if not d.ok
        ],
    }
