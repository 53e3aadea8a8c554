"""What the tests that run compiled code share about the running torch."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from regionalize.runtime.nested import has_region_reuse

# Tests of the owner compiled whole with its blocks nested regions: the default form where torch reuses a
# traced region (2.12 and later). Where it does not, the blocks are compiled one by one
# (tests/test_torch_features.py tests that form on every torch).
needs_reuse = pytest.mark.skipif(
    not has_region_reuse(), reason="this torch does not reuse a traced region: owners run per block"
)


def emulated(run: Any, inputs: list[Any], graphs: Any) -> tuple[Any, Any]:
    """The runtime's CUDA-graph capture (`capture`) where the CPU stands in for the GPU: what
    the call writes is put back (a capture runs nothing); the replay runs the call on the inputs it was
    captured with and writes its results into the outputs it made then."""
    before = [x.clone() if isinstance(x, torch.Tensor) else None for x in inputs]
    outputs = run(*inputs)
    for x, value in zip(inputs, before, strict=True):
        if value is not None:
            x.copy_(value)

    def replay() -> None:
        for out, new in zip(outputs, run(*inputs), strict=True):
            if isinstance(out, torch.Tensor):
                out.copy_(new)

    return replay, outputs


def stand_in_gpu(monkeypatch: pytest.MonkeyPatch, runtime: Any) -> None:
    """The CPU standing in for the GPU for `runtime` (a `runtime_support.RuntimeCopy`):
    tensors report `is_cuda`, are where CUDA graphs run, and captures are `emulated`. Never a real capture
    of the CPU's work, which would replay nothing on a machine that has a GPU."""
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    runtime.patch(monkeypatch, "is_on_graph_device", lambda tensor: True)
    runtime.patch(monkeypatch, "capture", emulated)
