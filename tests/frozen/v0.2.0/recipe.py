"""The model of PyTorch's regional compilation recipe: a deep stack of identical layers."""

import regionalize
import torch
from torch import nn


class Layer(nn.Module):
    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.linear1 = nn.Linear(dim, dim)
        self.relu1 = nn.ReLU()
        self.linear2 = nn.Linear(dim, dim)
        self.relu2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.linear1(x)
        a = self.relu1(a)
        a = torch.sigmoid(a)
        b = self.linear2(a)
        b = self.relu2(b)
        return b


class Model(nn.Module):
    def __init__(self, depth: int = 64, dim: int = 64) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        self.layers = nn.ModuleList([Layer(dim) for _ in range(depth)])
        regionalize.compile_region(*self.layers, owner=self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear(x)
        for layer in self.layers:
            x = layer(x)
        return x


def build(depth: int = 64, dim: int = 64) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """Factory for `regionalize verify`: the model and an example input."""
    return Model(depth, dim), (torch.randn(8, dim),)
