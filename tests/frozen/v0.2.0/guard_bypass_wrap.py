# regionalize-test: {guard-bypass = "filter", style = "wrap"}
import regionalize
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.layers = nn.ModuleList([torch.compile(Layer(d), options={"guard_filter_fn": regionalize.guard_filter}) for _ in range(n)])
