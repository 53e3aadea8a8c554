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


def beit_24(m: ModuleType) -> Any:
    """A ViT with stochastic depth: each layer's drop-path rate spaced over depth, as BEiT trains."""
    config = transformers.BeitConfig(
        **_TEXT, num_hidden_layers=24, image_size=64, patch_size=8, drop_path_rate=0.1, use_mask_token=False
    )
    pixels = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    return m.BeitModel(config, add_pooling_layer=False).eval(), (pixels,)


def swin(m: ModuleType) -> Any:
    """Swin's stages (2, 2, 6, 2 layers): shifted windows every other layer, a drop-path rate each."""
    config = transformers.SwinConfig(
        image_size=64,
        patch_size=4,
        embed_dim=32,
        depths=[2, 2, 6, 2],
        num_heads=[2, 4, 8, 8],
        window_size=4,
        drop_path_rate=0.1,
    )
    pixels = torch.randn(1, 3, 128, 128, generator=torch.Generator().manual_seed(0))
    return m.SwinModel(config, add_pooling_layer=False).eval(), (pixels,)


def convnext(m: ModuleType) -> Any:
    """ConvNeXt's stages (3, 3, 9, 3 blocks), a drop-path rate a block: convolutions, no attention
    (stochastic-depth.toml; docs/form-hierarchical.md, Inductor's CPU check)."""
    config = transformers.ConvNextConfig(
        hidden_sizes=[32, 64, 128, 256], depths=[3, 3, 9, 3], drop_path_rate=0.1, image_size=64
    )
    pixels = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    return m.ConvNextModel(config).eval(), (pixels,)
