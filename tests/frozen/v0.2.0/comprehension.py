import regionalize
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        return self.proj(x).relu()


class Encoder(nn.Module):
    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        self.embed = nn.Linear(dim, dim)
        # one block per layer
        self.layers = nn.ModuleList([Block(dim) for _ in range(depth)])
        regionalize.compile_region(*self.layers, owner=self)
        self.head = nn.Linear(dim, dim)

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)
