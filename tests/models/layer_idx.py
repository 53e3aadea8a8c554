"""Blocks that keep their index as an int attribute: Dynamo guards on it, so each block recompiles."""

import torch
import torch.nn as nn

WIDTH = 8


class IndexedLayer(nn.Module):
    def __init__(self, width: int, layer_idx: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.layer_idx = layer_idx

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Reading the int makes it part of the graph, as a KV-cache update keyed by layer would.
        return torch.relu(self.linear(x)) * (1.0 + self.layer_idx / 100)


class Indexed(nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([IndexedLayer(WIDTH, i) for i in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def make_shallow():
    return Indexed(4), (torch.randn(2, WIDTH),)


def make_deep():
    return Indexed(10), (torch.randn(2, WIDTH),)
