"""Factories of a tiny transformers Llama (random weights, nothing downloaded) from the module given."""

from types import ModuleType

import torch
from transformers import LlamaConfig


def config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )


def make(module: ModuleType) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    return module.LlamaForCausalLM(config()), (torch.randint(0, 64, (1, 5)),)


def make_model_only(module: ModuleType) -> torch.nn.Module:
    return module.LlamaForCausalLM(config())


def make_labelled(module: ModuleType) -> tuple[torch.nn.Module, tuple[torch.Tensor], dict[str, torch.Tensor]]:
    """With labels, so that the model computes its own loss (what `--workload train` then trains on)."""
    ids = torch.randint(0, 64, (2, 6))
    return module.LlamaForCausalLM(config()), (ids,), {"labels": ids}
