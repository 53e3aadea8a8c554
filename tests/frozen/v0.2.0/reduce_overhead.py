# regionalize-test: {mode = "reduce-overhead"}
import regionalize
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(x)


class Model(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.blocks = nn.ModuleList([Block(d) for _ in range(n)])  # the CUDA graph goes around Model
        regionalize.compile_region(*self.blocks, owner=self, mode="reduce-overhead")

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def make_blocks(d, n):
    # No owner known here: compiled regionally, without CUDA graphs.
    blocks = nn.Sequential(*[Block(d) for _ in range(n)])
    for block in blocks:
        block.compile()
    return blocks
