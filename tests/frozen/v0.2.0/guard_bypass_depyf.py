# regionalize-test: {guard-bypass = "depyf"}
import regionalize
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.layers = nn.ModuleList([Layer(d) for _ in range(n)])
        for block in self.layers:
            regionalize.compile_direct(block)
        self.extra = nn.ModuleList()
        for _ in range(n):
            block = Layer(d)
            regionalize.compile_direct(block)
            self.extra.append(block)
