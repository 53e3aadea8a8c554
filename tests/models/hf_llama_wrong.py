"""A wrong "rewrite" of transformers' modeling_llama.py: negated logits, so greedy picks other tokens."""

from transformers.models.llama import modeling_llama


class LlamaForCausalLM(modeling_llama.LlamaForCausalLM):
    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits = -out.logits
        return out
