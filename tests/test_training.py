"""Training through `compile_regions`: what training loops do, each with losses equal to eager's over 8 steps.

Each case trains an eager model and a regionalized copy of it side by side, from the same weights and the
same random seed at every step, and compares the losses step by step. Per-layer drop-path rates in training
are tested in test_constants.py; the gradients of one step in test_hierarchical.py."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch._inductor import config as inductor_config
from torch.utils.checkpoint import checkpoint

import regionalize
from regionalize.bench.accounting import recording

STEPS = 8
Step = Callable[[nn.Module, dict[str, torch.Tensor]], float]


def train(
    model: nn.Module, step: Step, batch: dict[str, torch.Tensor], compiled_step: bool = False
) -> list[float]:
    """Trains `model` with AdamW for STEPS steps of `step`, reseeding before each, and returns the losses."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    update = torch.compile(optimizer.step) if compiled_step else optimizer.step
    losses = []
    for index in range(STEPS):
        torch.manual_seed(index)
        losses.append(step(model, batch))
        update()
        optimizer.zero_grad()
    return losses


def ran_compiled(account: Any, model: nn.Module) -> bool:
    """Whether the steps ran compiled code: frames that Dynamo compiled, or block frames loaded from the
    session's cache (`regionalize.describe`'s `grad_saved`), which compile nothing."""
    loaded = any(report.grad_saved == "loaded" for report in regionalize.describe(model))
    return bool(account.frames or account.graphs or loaded)


def plain(model: nn.Module, batch: dict[str, torch.Tensor]) -> float:
    loss = model(**batch).loss
    loss.backward()
    return loss.item()


def accumulated(model: nn.Module, batch: dict[str, torch.Tensor]) -> float:
    """Accumulates the gradients of two half batches before the optimizer's step."""
    total = 0.0
    for half in (slice(0, 1), slice(1, 2)):
        loss = model(**{k: v[half] for k, v in batch.items()}).loss / 2
        loss.backward()
        total += loss.item()
    return total


def evaluated_between(model: nn.Module, batch: dict[str, torch.Tensor]) -> float:
    """Runs an evaluation in eval mode without autograd, then the training step in train mode."""
    model.eval()
    with torch.no_grad():
        model(**batch)
    model.train()
    return plain(model, batch)


def autocast(model: nn.Module, batch: dict[str, torch.Tensor]) -> float:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return plain(model, batch)


def llama(**config: Any) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    settings = dict(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        use_cache=False,
    )
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**settings, **config})).train()
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids, "labels": ids}


CASES = {
    "plain": (plain, {}, 1e-4),
    "gradient accumulation": (accumulated, {}, 1e-4),
    "evaluation between steps": (evaluated_between, {}, 1e-4),
    # Compiled bf16 rounds at other points than eager's, as a full compile's does.
    "autocast to bf16": (autocast, {}, 2e-2),
    "gradient checkpointing": (plain, {"checkpointing": True}, 1e-4),
    "dropout": (plain, {"attention_dropout": 0.2}, 1e-4),
    "compiled optimizer step": (plain, {"compiled_step": True}, 1e-4),
}


@pytest.mark.parametrize("case", CASES)
def test_training_losses_are_eagers(case: str) -> None:
    step, options, tolerance = CASES[case]
    checkpointing = options.get("checkpointing", False)
    compiled_step = options.get("compiled_step", False)
    config = {k: v for k, v in options.items() if k not in ("checkpointing", "compiled_step")}
    # Inductor draws its own random numbers unless it falls back to eager's, as it does here.
    with inductor_config.patch(fallback_random=True):
        trains_as_eager(step, config, tolerance, checkpointing, compiled_step)


def trains_as_eager(
    step: Step, config: dict[str, Any], tolerance: float, checkpointing: bool, compiled_step: bool
) -> None:
    """Trains the small Llama eagerly and through `compile_regions`, and compares the losses."""
    original, batch = llama(**config)
    if checkpointing:
        original.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = regionalize.compile_regions(copy.deepcopy(original))
    want = train(original, step, batch)
    with recording() as account:
        got = train(model, step, batch, compiled_step)
    torch.testing.assert_close(got, want, atol=tolerance, rtol=0)
    assert ran_compiled(account, model) and not account.fell_back_to_eager


def saved_activation_bytes(model: nn.Module, batch: dict[str, torch.Tensor]) -> int:
    """Returns the bytes of the tensors other than parameters that one step's forward keeps for backward."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(**batch).loss
    loss.backward()
    return sum(kept.values())


def test_transformers_checkpointing_keeps_what_eager_checkpointing_keeps() -> None:
    """A layer whose `forward` is a region still checkpoints: transformers checkpoints a layer only where its
    wrapper is the class's `forward`, so the activations kept would otherwise be all of them."""
    original, batch = llama(hidden_size=64, intermediate_size=256)
    everything = saved_activation_bytes(regionalize.compile_regions(copy.deepcopy(original)), batch)
    original.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = regionalize.compile_regions(copy.deepcopy(original))
    for _ in range(2):  # the first step compiles, the second runs what it compiled
        regional = saved_activation_bytes(model, batch)
    assert regional <= saved_activation_bytes(original, batch) * 1.5 and regional < everything / 3


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.norm(x)).tanh()


class Checkpointed(nn.Module):
    """Runs each block under `torch.utils.checkpoint`, which recomputes it in the backward pass."""

    def __init__(self, depth: int = 4, dim: int = 16) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> Any:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return Loss(x.square().mean())


class Loss:
    def __init__(self, loss: torch.Tensor) -> None:
        self.loss = loss


def test_blocks_under_torch_checkpoint_train_as_eager_does() -> None:
    torch.manual_seed(0)
    original = Checkpointed()
    model = regionalize.compile_regions(copy.deepcopy(original))
    batch = {"x": torch.randn(2, 8, 16)}
    with recording() as account:
        got = train(model, plain, batch)
    torch.testing.assert_close(got, train(original, plain, batch), atol=1e-4, rtol=0)
    assert ran_compiled(account, model) and not account.fell_back_to_eager


def train_distributed(rank: int, port: int, results: str) -> None:
    """One of two gloo processes: trains the small Llama under DDP and under FSDP2, eagerly and through
    `compile_regions` applied before wrapping; rank 0 saves the losses and compiled frames to `results`."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    found: dict[str, Any] = {}
    for wrapper in ("DDP", "FSDP2"):
        for regional in (False, True):
            model, _ = llama()
            if regional:
                regionalize.compile_regions(model)
            if wrapper == "DDP":
                wrapped: nn.Module = DistributedDataParallel(model)
            else:
                for layer in model.model.layers:
                    fully_shard(layer)
                wrapped = fully_shard(model)
            ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(rank))
            with recording() as account:
                losses = train(wrapped, plain, {"input_ids": ids, "labels": ids})
            found[f"{wrapper} {'regional' if regional else 'eager'}"] = losses, ran_compiled(account, model)
    if rank == 0:
        torch.save(found, results)
    dist.destroy_process_group()


def test_ddp_and_fsdp2_on_two_processes_train_as_without_regionalize(tmp_path: Any) -> None:
    """Each block compiled on its own under DDP's gradient hooks and FSDP2's sharded parameters."""
    pytest.importorskip("transformers")
    import socket

    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_gloo_available():
        pytest.skip("this torch has no gloo backend")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    results = str(tmp_path / "losses.pt")
    mp.spawn(train_distributed, args=(port, results), nprocs=2)
    found = torch.load(results)
    for wrapper in ("DDP", "FSDP2"):
        (want, _), (got, compiled) = found[f"{wrapper} eager"], found[f"{wrapper} regional"]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0, msg=wrapper)
        assert compiled, f"{wrapper}: nothing was compiled"
