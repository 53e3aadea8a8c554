"""Blocks reading a Python-side cache: the workload calls the stack twice, the second time with it full."""

import torch
import torch.nn as nn

DEPTH = 3
WIDTH = 8


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, past: torch.Tensor | None) -> torch.Tensor:
        h = self.linear(x)
        if past is not None:
            h = h + past.mean(0)
        return h.tanh()


class Cached(nn.Module):
    def __init__(self, depth: int, width: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor, cache: dict[int, torch.Tensor]) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, cache.get(i))
            cache[i] = x
        return self.head(x)


def make():
    first, second = torch.randn(2, WIDTH), torch.randn(2, WIDTH)

    def run(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        device = next(model.parameters()).device
        cache: dict[int, torch.Tensor] = {}  # filled by the first call, read by the second
        return model(first.to(device), cache), model(second.to(device), cache)

    return Cached(DEPTH, WIDTH), run
