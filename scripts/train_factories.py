"""Factories for `regionalize verify --workload train` on models of real sizes, built from config.

`llama_8b` is Llama-3-8B's layer shape (hidden 4096, 32 heads, 8 KV heads, MLP 14336) in bf16 with
labels, so that the model computes its own loss. `REGIONALIZE_TRAIN_LAYERS` (default 4) and
`REGIONALIZE_TRAIN_TOKENS` (default 512) size it to the memory at hand: verify keeps every variant's model,
gradients and optimizer state at once. scripts/gpu_checks.sh's `train` part runs it on CUDA.
"""

from __future__ import annotations

import os
from types import ModuleType

import torch


def llama_8b(module: ModuleType) -> tuple[torch.nn.Module, tuple[torch.Tensor], dict[str, torch.Tensor]]:
    """Returns a Llama of Llama-3-8B's layer shape from `module` (modeling_llama, original or rewritten),
    one sequence of random tokens, and those tokens as its labels."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=32000,  # Llama-3's 128256 would hold more memory in two matrices than the layers do
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=int(os.environ.get("REGIONALIZE_TRAIN_LAYERS", "4")),
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        rope_theta=500000.0,
    )
    tokens = int(os.environ.get("REGIONALIZE_TRAIN_TOKENS", "512"))
    model = module.LlamaForCausalLM(config).to(torch.bfloat16)
    ids = torch.randint(0, config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0))
    return model, (ids,), {"labels": ids}
