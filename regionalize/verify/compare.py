"""Compare two model outputs (or gradient sets) leaf by leaf, with tolerances chosen by dtype."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from regionalize.bench.trees import SCALARS, leaves

# (rtol, atol). Compiled code fuses and reorders floating-point work, so bitwise equality is not expected;
# these are a few ulps of accumulated error per layer, far below what a changed block produces.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (5e-2, 1e-2),
    torch.complex128: (1e-7, 1e-7),
    torch.complex64: (1e-4, 1e-5),
}
_FLOAT8_TOLERANCE = (0.25, 0.1)


@dataclass(frozen=True)
class Difference:
    """One compared leaf. `max_abs` is None when the leaves cannot be compared numerically."""

    path: str
    ok: bool
    max_abs: float | None
    detail: str = ""


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    if dtype in TOLERANCES:
        return TOLERANCES[dtype]
    if dtype.is_floating_point and dtype.itemsize == 1:
        return _FLOAT8_TOLERANCE
    return (0.0, 0.0)  # integers and bools must match exactly


def compare(expected: Any, actual: Any, path: str = "output") -> list[Difference]:
    """Every leaf of `expected` against the same path in `actual`, plus leaves only one side has."""
    want = dict(leaves(expected, path))
    got = dict(leaves(actual, path))
    diffs = [compare_leaf(key, want[key], got[key]) for key in want if key in got]
    diffs += [Difference(k, False, None, "missing from the rewrite's result") for k in want if k not in got]
    diffs += [Difference(k, False, None, "only in the rewrite's result") for k in got if k not in want]
    return diffs


def compare_leaf(path: str, expected: Any, actual: Any) -> Difference:
    if isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor):
        return _compare_tensors(path, expected, actual)
    if isinstance(expected, float) and isinstance(actual, float):
        # A Python float from the model (a `.item()` loss, say) was computed in float32.
        return _compare_tensors(path, torch.tensor(expected, dtype=torch.float32), torch.tensor(actual))
    if type(expected) is not type(actual):
        return Difference(path, False, None, f"{type(expected).__name__} vs {type(actual).__name__}")
    if isinstance(expected, SCALARS):
        same = expected == actual
        return Difference(path, same, None, "" if same else f"{expected!r} vs {actual!r}")
    # An opaque object with no comparable state: its type matching is all that can be said.
    return Difference(path, True, None, f"{type(expected).__name__}, not compared")


def _compare_tensors(path: str, expected: torch.Tensor, actual: torch.Tensor) -> Difference:
    if expected.shape != actual.shape:
        return Difference(path, False, None, f"shape {tuple(expected.shape)} vs {tuple(actual.shape)}")
    if expected.dtype != actual.dtype:
        return Difference(path, False, None, f"dtype {expected.dtype} vs {actual.dtype}")
    rtol, atol = tolerance(expected.dtype)
    want = expected.detach().to("cpu", torch.complex128 if expected.is_complex() else torch.float64)
    got = actual.detach().to("cpu", want.dtype)
    if want.numel() == 0:
        return Difference(path, True, 0.0, str(expected.dtype))
    both_nan = want.isnan() & got.isnan()
    same_inf = want.isinf() & (want == got)
    error = (want - got).abs().masked_fill(both_nan | same_inf, 0.0)
    # atol scales with the tensor's own magnitude (but never below atol itself): the error of reordered
    # arithmetic grows with the values involved, and activations of a deep model can be large.
    finite = want.abs().masked_fill(~want.isfinite(), 0.0)
    scale = max(1.0, float(finite.max()))
    allowed = atol * scale + rtol * finite
    ok = bool((error <= allowed).all())
    max_abs = float(error.max())
    detail = f"{expected.dtype}, rtol {rtol:g}, atol {atol:g}" + ("" if scale == 1.0 else f" x {scale:.3g}")
    return Difference(path, ok, max_abs if math.isfinite(max_abs) else math.inf, detail)
