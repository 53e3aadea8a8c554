"""A wrong rewrite of stack.py: its blocks end in GELU instead of ReLU, so outputs must differ."""

import torch
import torch.nn as nn

DEPTH = 4
WIDTH = 16


class Layer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(width, width)
        self.relu1 = nn.ReLU()
        self.linear2 = nn.Linear(width, width)
        self.relu2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.linear2(self.relu1(self.linear1(x))))


class Stack(nn.Module):
    def __init__(self, depth: int, width: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Layer(width) for _ in range(depth)])
        for block in self.layers:
            block.compile(backend="eager")
        self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        for layer in self.layers:
            x = layer(x)
        return {"hidden": x, "logits": self.head(x)}


def make():
    return Stack(DEPTH, WIDTH), (torch.randn(3, WIDTH),)


def make_raising():
    raise ValueError("the factory cannot build this model")


def make_not_a_model():
    return "model", (torch.randn(3, WIDTH),)
