import regionalize
from torch import nn


class Attention(nn.Module):
    def __init__(self, config, layer_idx=None):
        super().__init__()
        self.layer_idx = layer_idx
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)

    def forward(self, hidden_states, layer_past=None):
        query, key, value = self.qkv(hidden_states).chunk(3, dim=-1)
        if layer_past is not None:
            key, value = regionalize.eager(lambda: layer_past.update(key, value, self.layer_idx))
        return query + key + value


class FlashAttention(Attention):
    # Builds as its base does: the arguments, the layer index among them, pass through.
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.top_left_mask = False

    def forward(self, hidden_states, layer_past=None):
        query, key, value = self.qkv(hidden_states).chunk(3, dim=-1)
        if layer_past is not None:
            key, value = regionalize.eager(lambda: layer_past.update(key, value, self.layer_idx))
        return (query * key).sum(-1, keepdim=True) * value


# The attention a layer builds is looked up by name: each class of the table may be the one.
ATTENTION_CLASSES = {
    "eager": Attention,
    "sdpa": Attention,
    "flash_attention_2": FlashAttention,
}


class DecoderLayer(nn.Module):
    def __init__(self, config, layer_idx=None):
        super().__init__()
        self.self_attention = ATTENTION_CLASSES[config._attn_implementation](config, layer_idx)
        self.mlp = nn.Linear(config.hidden_size, config.hidden_size)

    @regionalize.symbolic_ints
    def forward(self, hidden_states, layer_past=None):
        return self.mlp(self.self_attention(hidden_states, layer_past=layer_past))


class Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.h = nn.ModuleList([DecoderLayer(config, layer_idx=i) for i in range(config.num_hidden_layers)])
        regionalize.compile_region(*self.h, owner=self, cache_index="layer_idx")

    def forward(self, hidden_states, past_key_values=None):
        for block in self.h:
            hidden_states = block(hidden_states, layer_past=past_key_values)
        return hidden_states
