"""Factories of `train.toml`: transformers models built from config in training shape (random weights,
nothing downloaded), with labels, so that each model computes its own loss."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

LAYERS, WIDTH, BATCH, TOKENS, VOCAB = 16, 256, 2, 64, 1000


def _inputs() -> tuple[tuple[torch.Tensor], dict[str, torch.Tensor]]:
    ids = torch.randint(0, VOCAB, (BATCH, TOKENS), generator=torch.Generator().manual_seed(1))
    return (ids,), {"labels": ids}


def qwen3(module: ModuleType, layers: int = LAYERS) -> tuple[Any, ...]:
    from transformers import Qwen3Config

    config = Qwen3Config(
        hidden_size=WIDTH, intermediate_size=688, num_hidden_layers=layers, num_attention_heads=8,
        num_key_value_heads=4, head_dim=32, vocab_size=VOCAB, use_cache=False,
    )  # fmt: skip
    return module.Qwen3ForCausalLM(config), *_inputs()


def qwen3_32(module: ModuleType) -> tuple[Any, ...]:
    """`qwen3` at 32 layers."""
    return qwen3(module, 32)


def qwen3_checkpointed(module: ModuleType) -> tuple[Any, ...]:
    """`qwen3` with transformers' activation checkpointing on each layer (its older name where it has no
    newer one)."""
    model, args, kwargs = qwen3(module)
    settings = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=settings)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=settings)
    return model, args, kwargs


def vit(module: ModuleType) -> tuple[Any, ...]:
    from transformers import ViTConfig

    config = ViTConfig(
        hidden_size=WIDTH, intermediate_size=4 * WIDTH, num_hidden_layers=LAYERS, num_attention_heads=8,
        image_size=64, patch_size=8, num_labels=10,
    )  # fmt: skip
    generator = torch.Generator().manual_seed(1)
    pixels = torch.randn(BATCH, 3, 64, 64, generator=generator)
    labels = torch.randint(0, 10, (BATCH,), generator=generator)
    return module.ViTForImageClassification(config), (pixels,), {"labels": labels}
