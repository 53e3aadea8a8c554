# regionalize-test: {guard-bypass = "depyf"}
"""The bypass on the owner's one frame: the hierarchical form, whose owner has a forward."""
import regionalize
import torch.nn as nn


class Layer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return self.fc(x).relu()


class Model(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.layers = nn.ModuleList([Layer(d) for _ in range(n)])
        regionalize.compile_region(*self.layers, owner=self, guard_bypass="depyf")

    def forward(self, x):
        for layer in self.layers:  # each layer a nested region of this frame
            x = layer(x)
        return x
