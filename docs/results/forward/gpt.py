"""A GPT-style decoder stack for the forward benchmark (`forward.toml`): 32 pre-norm blocks, width 128.

The codemod rewrites this file like any model file; `build` is the factory verify calls.
"""

from __future__ import annotations

import torch
from torch import nn

DEPTH = 32
WIDTH = 128
VOCAB = 256


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.ln2 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, depth: int = DEPTH, width: int = WIDTH) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build() -> tuple[nn.Module, tuple[torch.Tensor]]:
    ids = torch.randint(0, VOCAB, (1, 32), generator=torch.Generator().manual_seed(0))
    return GPT().eval(), (ids,)
