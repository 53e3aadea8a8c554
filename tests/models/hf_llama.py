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
