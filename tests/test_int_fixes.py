"""Per-block integers: the rewrite keeps a decoder's blocks on shared graphs, and says what it did."""

from __future__ import annotations

import ast
import sys
import textwrap
import types

import pytest
from torch_support import needs_reuse

from regionalize.codemod import transform_source
from regionalize.shared.options import Options

# A decoder in miniature: a cache indexed by layer (as transformers' DynamicCache), a branch on the
# index in the block, and a first-layer special case in the attention.
DECODER = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Cache:
        def __init__(self):
            self.layers = []
            self.seen = {}

        def update(self, key, layer_idx):
            if len(self.layers) <= layer_idx:
                self.layers.append(key)
            else:
                self.layers[layer_idx] = torch.cat([self.layers[layer_idx], key], dim=1)
            return self.layers[layer_idx]


    class Attention(nn.Module):
        def __init__(self, dim, layer_idx):
            super().__init__()
            self.layer_idx = layer_idx
            self.proj = nn.Linear(dim, dim)

        def forward(self, x, cache):
            keys = cache.update(self.proj(x), self.layer_idx)
            cache.seen[self.layer_idx, "calls"] = True
            if self.layer_idx == 0:
                keys = keys * 0.5
            return x + keys.mean(dim=1, keepdim=True)


    class Block(nn.Module):
        def __init__(self, dim, layer_idx):
            super().__init__()
            self.attn = Attention(dim, layer_idx=layer_idx)
            self.layer_idx = layer_idx
            self.mlp = nn.Linear(dim, dim)

        def forward(self, x, cache):
            x = self.attn(x, cache)
            if self.layer_idx % 2:
                x = -x
            return self.mlp(x)


    class Decoder(nn.Module):
        def __init__(self, dim=8, depth=6):
            super().__init__()
            self.layers = nn.ModuleList([Block(dim, i) for i in range(depth)])

        def forward(self, x, cache):
            for layer in self.layers:
                x = layer(x, cache)
            return x
    """
)


def load(source: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


def test_rewrite_moves_the_cache_call_and_unspecializes_the_branches() -> None:
    result = transform_source(DECODER, Options())
    codes = [(s.code, s.block) for s in result.sites]
    assert ("RGZ003", "Attention") in codes
    assert ("RGZ004", "Attention") in codes and ("RGZ004", "Block") in codes
    assert not any(code == "RGZ201" for code, _ in codes)
    assert "regionalize.eager(lambda: cache.update(self.proj(x), self.layer_idx))" in result.code
    assert 'regionalize.eager(lambda: cache.seen.__setitem__((self.layer_idx, "calls"), True))' in result.code
    assert result.code.count("    @regionalize.symbolic_ints\n") == 2
    second = transform_source(result.code, Options())
    assert second.code == result.code
    assert not any(s.action == "rewrite" for s in second.sites)


def generate(model, steps: int = 3) -> list:
    torch = pytest.importorskip("torch")
    torch.manual_seed(1)
    x, cache, outputs = torch.randn(1, 4, 8), model.cache_class(), []
    model.last_cache = cache
    with torch.no_grad():
        for _ in range(steps):
            x = model(x, cache)[:, -1:]  # prefill, then one position per step: a shape change
            outputs.append(x)
    return outputs


@pytest.mark.parametrize("fixed", [True, False])
def test_blocks_share_graphs_only_when_fixed(fixed: bool) -> None:
    """Twelve blocks: without the fix each block specializes on its index and past recompile_limit (8)
    the rest run eager; with it, only the shape change and the branches' outcomes recompile (Dynamo
    specializes the values 0 and 1 of a symbolic integer, so blocks 0 and 1 have graphs of their own)."""
    torch = pytest.importorskip("torch")
    from regionalize.bench.accounting import recording

    options = Options(backend="eager")  # Dynamo's decisions are the same; no inductor start-up
    rewritten = transform_source(DECODER, options).code
    if not fixed:  # the containers compiled, the forwards as the user wrote them
        rewritten = DECODER.replace(
            "self.layers = nn.ModuleList([Block(dim, i) for i in range(depth)])",
            "self.layers = nn.ModuleList([Block(dim, i) for i in range(depth)])\n"
            "        for block in self.layers:\n"
            "            block.compile(backend='eager')",
        )
    original_module = load(DECODER, "decoder_original")
    module = load(rewritten, f"decoder_fixed_{fixed}")
    torch.manual_seed(0)
    original = original_module.Decoder(depth=12).eval()
    model = module.Decoder(depth=12).eval()
    model.load_state_dict(original.state_dict())
    original.cache_class, model.cache_class = original_module.Cache, module.Cache
    expected = generate(original)
    with recording() as account:
        actual = generate(model)
    for got, want in zip(actual, expected, strict=True):
        torch.testing.assert_close(got, want)
    assert sorted(model.last_cache.seen) == [(i, "calls") for i in range(12)]
    assert account.fell_back_to_eager is not fixed
    if fixed:  # the same graphs whatever the depth: one per outcome of the branches and per shape
        assert account.graphs <= 10


CONTAINER = """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Layer(i) for i in range(4)])
"""


def parts(source: str) -> tuple[str, list[str]]:
    result = transform_source(textwrap.dedent(source) + CONTAINER, Options())
    ast.parse(result.code)
    return result.code, [s.code for s in result.sites]


def test_what_cannot_take_a_lambda_stays_and_is_warned() -> None:
    code, codes = parts(
        """
        from torch import nn

        class Layer(nn.Module):
            def __init__(self, i):
                super().__init__()
                self.i = i

            def forward(self, x, cache):
                cache.seen[self.i] = x.sum()
                cache.get(n := self.i)
                return x
        """
    )
    assert "regionalize.eager" not in code
    assert "cache.seen[self.i] = x.sum()" in code and "cache.get(n := self.i)" in code
    assert "RGZ201" in codes


def test_reads_that_stay_in_the_graph_are_not_moved() -> None:
    code, codes = parts(
        """
        import torch
        from torch import nn

        class Layer(nn.Module):
            def __init__(self, i):
                super().__init__()
                self.i = i
                self.proj = nn.Linear(4, 4)

            def forward(self, x):
                return torch.roll(self.proj(x), self.i) + self.helper(x)

            def helper(self, x):
                return x * self.i
        """
    )
    assert "regionalize.eager" not in code
    assert codes.count("RGZ004") == 1 and "RGZ201" not in codes


def test_insertions_count_bytes_and_keep_line_endings() -> None:
    source = textwrap.dedent(
        """
        from torch import nn

        class Layer(nn.Module):
            def __init__(self, i):
                super().__init__()
                self.i = i

            def forward(self, x, cache):
                return {"clé": cache.update(x, self.i)}["clé"]
        """
    )
    source = (source + CONTAINER).replace("\n", "\r\n")
    result = transform_source(source, Options())
    assert '{"clé": regionalize.eager(lambda: cache.update(x, self.i))}["clé"]' in result.code
    assert "\n" not in result.code.replace("\r\n", "")


def test_class_attribute_reached_through_a_base_and_keywords() -> None:
    code, codes = parts(
        """
        from torch import nn

        class Base(nn.Module):
            def __init__(self, dim, *, layer_idx):
                super().__init__()
                self.layer_idx = layer_idx

        class Layer(Base):
            def __init__(self, i):
                super().__init__(4, layer_idx=i)

            def forward(self, x, past_key_values):
                return past_key_values[self.layer_idx][0] + x
        """
    )
    assert "regionalize.eager(lambda: past_key_values[self.layer_idx])[0]" in code
    assert codes.count("RGZ003") == 1


def test_symbolic_helper_leaves_forward_alone_on_a_torch_without_the_setting(monkeypatch) -> None:
    """Before torch 2.8 there is no traceable patch_dynamo_config: the rewrite must still import and run."""
    torch = pytest.importorskip("torch")
    with monkeypatch.context() as patched:  # an older torch while the model file is imported
        patched.delattr(torch._dynamo, "patch_dynamo_config")
        module = load(transform_source(DECODER, Options(backend="eager")).code, "decoder_old_torch")
    assert module.Block.forward.__name__ == "forward" and module.Block.forward.__code__.co_name == "forward"
    assert (
        "traced" not in module.Block.forward.__code__.co_varnames + module.Block.forward.__code__.co_freevars
    )
    model = module.Decoder(depth=2).eval()
    model.cache_class = module.Cache
    assert len(generate(model, steps=2)) == 2


@needs_reuse
def test_hierarchical_decoder_updates_its_cache_in_one_frame_without_regions() -> None:
    """The default form: each block updates the cache, so the owner is compiled whole without nested
    regions, with graph deduplication for its own compiles only; the outputs are the original's."""
    torch = pytest.importorskip("torch")
    from regionalize.bench.accounting import recording, served_forms

    rewritten = transform_source(DECODER, Options(backend="aot_eager")).code
    assert "regionalize.compile_region(*self.layers, owner=self, nested=False, " in rewritten
    original_module = load(DECODER, "decoder_original_whole")
    module = load(rewritten, "decoder_hierarchical")
    torch.manual_seed(0)
    original = original_module.Decoder(depth=12).eval()
    model = module.Decoder(depth=12).eval()
    model.load_state_dict(original.state_dict())
    original.cache_class, model.cache_class = original_module.Cache, module.Cache
    expected = generate(original)
    with recording() as account:
        actual = generate(model)
    for got, want in zip(actual, expected, strict=True):
        torch.testing.assert_close(got, want)
    assert served_forms(model) == {"Decoder": "whole"}
    assert account.regions_traced == 0 and not account.fell_back_to_eager
    assert torch._dynamo.config.use_graph_deduplication is False  # set for the owner's calls only
    assert model.last_cache.seen == original.last_cache.seen  # the side effects happened once per layer


def test_fixes_inside_a_rewritten_region_are_compiled_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two statements on a line make the whole file one piece, so the fixes lie inside the rewritten
    piece and its editor writes them with the sites' edits; elsewhere the fixes are pieces of their own,
    beside the regions. Both write the same code and sites, and compile the containers once."""
    from regionalize.codemod import transform

    passes: list[int] = []
    compile_containers = transform._compile_containers
    monkeypatch.setattr(
        transform, "_compile_containers", lambda *a, **k: passes.append(1) or compile_containers(*a, **k)
    )
    apart_imports, joined_imports = (
        "import torch\nfrom torch import nn\n",
        "import torch; from torch import nn\n",
    )
    joined = DECODER.replace(apart_imports, joined_imports)
    assert joined != DECODER
    for options in (Options(), Options()):
        passes.clear()
        apart = transform_source(DECODER, options)
        assert len(passes) == 1  # the fixes beside the regions
        together = transform_source(joined, options)
        assert len(passes) == 2  # the fixes in the regions' piece
        assert together.status == apart.status == "success"
        assert together.code == apart.code.replace(apart_imports, joined_imports)
        below = [(s.line - (s.line > 2), s.col, s.code, s.reason) for s in apart.sites]
        assert [(s.line, s.col, s.code, s.reason) for s in together.sites] == below


def test_a_rewrite_the_compiler_refuses_where_the_user_wrote_that_too_is_written() -> None:
    """The rewrite is checked by compiling it, and what only the compiler refuses (a module-level
    `return`, the user's) is asked of the parser, as the file was when read."""
    result = transform_source(DECODER + "\nreturn\n")
    assert result.status == "success", result.reason
    assert result.code.endswith("\nreturn\n") and "regionalize.compile_region(" in result.code
    broken = transform_source(DECODER + "\nreturn\n", Options())
    assert broken.status == "success"
