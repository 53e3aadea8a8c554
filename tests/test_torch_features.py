"""The form follows what the running torch can do. Where Dynamo does not reuse a traced nested region
(torch 2.11), an owner compiled whole would compile every block, a full compile's start: with Inductor its
graph is compiled in pieces, each distinct block once; with another backend its blocks are compiled one by
one, those whose cache a stand-in serves as one frame each with no graph break. These tests take those
paths on every torch, hiding the reuse where torch has it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from kv_support import load, rewritten  # noqa: E402
from test_kv_regions import READS_THE_LAYER, TWICE, against_twin, pair, sliding  # noqa: E402
from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer  # noqa: E402

from regionalize.bench.accounting import recording, served_forms  # noqa: E402
from regionalize.bench.served import PROMPT  # noqa: E402
from regionalize.codemod import transform_source  # noqa: E402
from regionalize.runtime.nested import has_region_reuse  # noqa: E402
from regionalize.shared.options import Options  # noqa: E402

TESTS = Path(__file__).resolve().parent
PER_BLOCK = "per block, this torch does not reuse a traced region (torch 2.12 and later do)"
PIECES = "whole, in pieces ({}): this torch does not reuse a traced region"
# tests/models/stack.py: 4 blocks compiled once, a head run as traced
STACK_IN_PIECES = PIECES.format("5 a call, 1 compiled in all, 1 run as traced")


def test_region_reuse_is_detected_as_torch_has_it() -> None:
    """Detected by the feature (`max_reuse_entries`), which came with the reuse in torch 2.12."""
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    assert has_region_reuse() == ((major, minor) >= (2, 12))


@pytest.fixture
def without_reuse(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A torch whose nested regions are not reused, as 2.11's: its `nested_compile_region` takes no
    reuse limit."""
    if not has_region_reuse():
        yield
        return
    region = torch.compiler.nested_compile_region

    def unreused(fn: Any = None, is_pure: bool = False) -> Any:
        return region(fn)

    monkeypatch.setattr(torch.compiler, "nested_compile_region", unreused)
    _forget_reuse()
    yield
    _forget_reuse()


def _forget_reuse() -> None:
    """Clear the probe of every runtime loaded (the installed one, which a rewrite in the import form reads,
    and the copies a vendored rewrite imports), which keeps what it found for the process."""
    for name, module in list(sys.modules.items()):
        if name == "regionalize.runtime.internals.tracer" or name.split(".")[-3:] == [
            "_regionalize",
            "internals",
            "tracer",
        ]:
            module.has_region_reuse.cache_clear()


def stack(options: Options | None = None) -> tuple[Any, Any]:
    source = (TESTS / "models" / "stack.py").read_text(encoding="utf-8")
    torch.manual_seed(0)
    model, _ = load(transform_source(source, options or Options()).code).make()
    twin, _ = load(source).make()
    twin.load_state_dict(model.state_dict())
    return model.eval(), twin.eval()


@pytest.mark.usefixtures("without_reuse")
@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_without_reuse_the_owner_is_compiled_in_pieces_or_its_blocks_one_by_one(backend: str) -> None:
    """With Inductor one frame, its graph in five pieces (four blocks, the head), of which two are
    compiled: the four blocks share one. With another backend, one frame a block, every
    block's the same graph. Either way the verdict names the form, with no warning of a fallback."""
    model, twin = stack(Options(backend=backend))
    x = torch.randn(3, 16)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # the form of this torch, not a fallback: no warning
        with recording() as account:
            got = [model(x) for _ in range(3)]
        want = twin(x)
    for out in got:
        torch.testing.assert_close(out, want)
    assert served_forms(model) == {"Stack": STACK_IN_PIECES if backend == "inductor" else PER_BLOCK}
    assert account.graphs == 1 and account.graph_breaks == 0 and not account.fell_back_to_eager


def mixed(depth: int, window: int) -> DynamicCache:
    """A cache whose layers alternate between full attention and a sliding window, as Gemma's and
    Mistral's: their lengths are one until the window fills, and part after."""
    cache = DynamicCache()
    cache.layers = [
        DynamicSlidingWindowLayer(sliding_window=window) if i % 2 else DynamicLayer() for i in range(depth)
    ]
    cache.layer_class_to_replicate = None
    return cache


@pytest.mark.usefixtures("without_reuse")
def test_without_reuse_a_decoder_runs_its_prompt_per_block_and_its_tokens_in_pieces() -> None:
    """The prompt (its cache empty) per block, one frame shared by the blocks; the tokens in one frame
    compiled in pieces, the cache's length marked dynamic from the first: two frames and two graphs in
    all (torch 2.11 counts the second as a recompile, on a guard of the first's code object). Each
    token's call is six pieces, one a layer, of which one is compiled: each layer's length is a symbol of
    its own, and the frame guards them equal."""
    model, twin = pair(options=Options())
    account = against_twin(model, twin, lengths=(5, 1, 1, 1))
    forms = f"whole, in pieces (6 a call, 1 compiled in all); {PROMPT}"
    assert served_forms(model) == {"Decoder": f"{forms}: this torch does not reuse a traced region"}
    assert account.frames == 2 and account.graphs == 2 and not account.fell_back_to_eager


@pytest.mark.usefixtures("without_reuse")
def test_without_reuse_layers_whose_lengths_part_compile_again_not_wrongly() -> None:
    """Full and sliding-window layers hold as many tokens until the window fills, the layers of each kind
    sharing a piece under the frame's guard that their lengths are equal; then the sliding layers stop
    growing. A piece with symbols is not shared with another frame, whose symbols of the same names are
    others (shared, a piece compiled for one length ran on another: an error of Inductor's size checks).
    The original's outputs and cache at every step."""
    model, twin = pair(options=Options())
    account = against_twin(model, twin, lambda: mixed(6, 8), lengths=(5, 1, 1, 1, 1, 1))
    assert served_forms(model)["Decoder"].startswith("whole, in pieces")
    assert not account.fell_back_to_eager


@pytest.mark.usefixtures("without_reuse")
@pytest.mark.parametrize("make", [DynamicCache, lambda: sliding(6, 3)], ids=["dynamic", "sliding"])
def test_without_reuse_a_cache_is_stood_in_for_in_each_blocks_frame(make: Any) -> None:
    """Each block's call is one frame with its layer's keys and values as tensors, its cache written
    outside it: no graph break around the update, one graph for all six layers' prompt and one for all
    their tokens (the cache's length marked dynamic from the first), and the cache holds what the
    original's holds."""
    model, twin = pair()
    account = against_twin(model, twin, make)
    assert served_forms(model) == {"Decoder": PER_BLOCK}
    assert account.graph_breaks == 0 and not account.fell_back_to_eager
    assert account.graphs == 2 and account.recompiles == 1  # by the tokens' shapes, never by the layer


@pytest.mark.usefixtures("without_reuse")
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("body", [TWICE, READS_THE_LAYER], ids=["updates-twice", "reads-cache-layers"])
def test_without_reuse_a_block_the_stand_in_cannot_serve_is_compiled_as_it_is(
    body: str, backend: str
) -> None:
    """Its frame with the stand-in fails to compile before it ran anything; the block is compiled as it
    is from then on, with no warning and the original's results. (As `--form per-block` is: such a block
    indexes the cache by its layer, so its frame is compiled again for each layer, up to Dynamo's limit.)
    With Inductor that is the prompt's call, per block; the tokens', in pieces, trace the block as it is,
    and so does a second generation's prompt, not a frame for each layer again."""
    model, twin = pair(body, options=Options(backend=backend))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        account = against_twin(model, twin, lengths=(5, 1, 1))
        if backend == "inductor":
            with recording() as again:
                against_twin(model, twin, lengths=(4, 1))
            assert again.graphs <= 2 and not again.fell_back_to_eager
    if backend == "aot_eager":
        assert served_forms(model) == {"Decoder": PER_BLOCK}
    else:
        assert served_forms(model)["Decoder"].startswith("whole, in pieces")
        assert not account.fell_back_to_eager
    assert all(layer.__dict__["_regionalize_layer"] is False for layer in model.layers)
    assert account.graph_breaks == 0


@pytest.mark.usefixtures("without_reuse")
def test_without_reuse_transformers_llama_generates_the_originals_tokens_without_graph_breaks() -> None:
    from transformers.models.llama import modeling_llama

    module, _ = rewritten(modeling_llama, Options(backend="aot_eager"))
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = module.LlamaForCausalLM(config).eval()
    twin = modeling_llama.LlamaForCausalLM(config).eval()
    twin.load_state_dict(model.state_dict())
    ids = torch.randint(3, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    settings = {"max_new_tokens": 6, "min_new_tokens": 6, "do_sample": False}
    with torch.no_grad():
        expected = twin.generate(ids, attention_mask=torch.ones_like(ids), **settings)
        with recording() as account:
            actual = model.generate(ids, attention_mask=torch.ones_like(ids), **settings)
    assert actual.tolist() == expected.tolist()
    assert served_forms(model) == {"LlamaModel": PER_BLOCK}
    # The prompt's frame, the first token's and one with the cache's length dynamic: not one per layer.
    assert account.graph_breaks == 0 and account.graphs <= 3 and not account.fell_back_to_eager


def test_torch_warnings_made_errors_do_not_make_the_owner_fall_back() -> None:
    """Under `-W error`, torch's own warnings while it compiles (a deprecation on importing Inductor's
    passes) would be the first call's error, and a full compile raises it: the owner keeps them at
    Python's default and runs in its form, with the original's outputs. In a fresh process, since the
    warning comes once, on the import."""
    script = textwrap.dedent(
        """
        import sys, torch
        sys.path.insert(0, sys.argv[1])
        from kv_support import load
        from regionalize.codemod import transform_source
        from regionalize.shared.options import Options
        from regionalize.bench.accounting import served_forms

        source = open(sys.argv[1] + "/models/stack.py", encoding="utf-8").read()
        torch.manual_seed(0)
        model, (x,) = load(transform_source(source, Options()).code).make()
        twin, _ = load(source).make()
        twin.load_state_dict(model.state_dict())
        with torch.no_grad():
            torch.testing.assert_close(model(x), twin(x))
        print(served_forms(model)["Stack"])
        """
    )
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", script, str(TESTS)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == ("whole" if has_region_reuse() else STACK_IN_PIECES)


@pytest.mark.usefixtures("without_reuse")
def test_verify_names_this_torchs_form_without_warning_of_a_fallback(tmp_path: Path) -> None:
    from test_verify import MODELS, verify

    code, result, table = verify(tmp_path, MODELS / "stack.py", "make", None, options=Options())
    assert code == 0 and result["equivalent"] and not result["fell_back_to_eager"]
    assert result["accounting"]["regional"]["forms"] == {"Stack": STACK_IN_PIECES}
    assert f"regional form: Stack {STACK_IN_PIECES}" in table
    assert table.splitlines()[-1] == "PASS: equivalent and checkpoint-compatible"
