"""Factories for the forward benchmark (`forward.toml`): transformers models at small configs, random
weights, nothing downloaded. Each takes the model's module (original or rewritten) and builds from it."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch
import transformers

_TEXT = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4}


def bert(m: ModuleType) -> Any:
    ids = torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(0))
    return m.BertModel(transformers.BertConfig(**_TEXT, num_hidden_layers=12)).eval(), (ids,)


def _vit(m: ModuleType, layers: int) -> Any:
    config = transformers.ViTConfig(**_TEXT, num_hidden_layers=layers, image_size=64, patch_size=8)
    pixels = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    return m.ViTModel(config).eval(), (pixels,)


def vit(m: ModuleType) -> Any:
    return _vit(m, 12)


def vit_24(m: ModuleType) -> Any:
    return _vit(m, 24)


def llama(m: ModuleType) -> Any:
    config = transformers.LlamaConfig(**_TEXT, num_hidden_layers=32, num_key_value_heads=2)
    ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    return m.LlamaForCausalLM(config).eval(), (ids,), {"use_cache": False}
