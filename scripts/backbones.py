"""Factories for `regionalize verify` on transformers' hierarchical vision backbones (small configs,
random weights, nothing downloaded). Each takes the model module, original or rewritten:

    file=$(python -c "import transformers.models.convnext.modeling_convnext as m; print(m.__file__)")
    regionalize verify "$file" --factory scripts/backbones.py:convnext --quick

Used for the rule on hierarchical stacks in the README (issue 11).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch
import transformers

IMAGE = (2, 3, 128, 128)


def _pixels() -> tuple[torch.Tensor]:
    return (torch.randn(*IMAGE, generator=torch.Generator().manual_seed(0)),)


def convnext(m: ModuleType) -> tuple[Any, tuple[torch.Tensor]]:
    """ConvNeXt-T's shape of stages: depths 3, 3, 9, 3 at widths 24..192."""
    config = transformers.ConvNextConfig(depths=[3, 3, 9, 3], hidden_sizes=[24, 48, 96, 192])
    return m.ConvNextModel(config).eval(), _pixels()


def swin(m: ModuleType) -> tuple[Any, tuple[torch.Tensor]]:
    """Swin-T's shape of stages: depths 2, 2, 6, 2."""
    config = transformers.SwinConfig(
        image_size=128, embed_dim=24, depths=[2, 2, 6, 2], num_heads=[1, 2, 4, 8], window_size=4
    )
    return m.SwinModel(config).eval(), _pixels()


def resnet(m: ModuleType) -> tuple[Any, tuple[torch.Tensor]]:
    """ResNet-50's shape of stages: depths 3, 4, 6, 3 of bottleneck layers."""
    config = transformers.ResNetConfig(
        depths=[3, 4, 6, 3], hidden_sizes=[32, 64, 128, 256], embedding_size=16
    )
    return m.ResNetModel(config).eval(), _pixels()
