"""Workloads: what verify runs on a model when one forward is not the whole story (caches, generation,
training).

A factory returning `(model, run)` gives a `Custom` workload; `--workload generate` builds a `Generate`
one from `(model, args)` or a bare model, and `--workload train` a `Train` one from `(model, args)`.
Either way the workload's result is what is compared between the original and the rewrite, what
Dynamo's accounting covers, and what the steady-state timing times.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from regionalize.bench.loading import VerifyError
from regionalize.bench.trees import clone_inputs, leaves

GENERATE = "generate"
TRAIN = "train"
CACHES = ("dynamic", "static")  # transformers' default cache; its fixed-size one, the way it serves compiled


@dataclass(frozen=True)
class GenerateSpec:
    """`--workload generate`: greedy decoding of `tokens` new tokens after a prompt of `prompt_len` tokens,
    with a cache of the kind `cache` names (`CACHES`).

    `prompt_len` only sizes the prompt made from the model's config when the factory gives none.
    """

    tokens: int = 16
    prompt_len: int = 8
    cache: str = "dynamic"
    first: str = "token"  # what the first-call timing times: the first token, or the whole "generate"
    kind = GENERATE

    def to_json(self) -> dict[str, Any]:
        return {"kind": GENERATE, "tokens": self.tokens, "prompt_len": self.prompt_len, "cache": self.cache}


@dataclass(frozen=True)
class TrainSpec:
    """`--workload train`: `steps` training steps of forward, backward and an AdamW step at rate `lr`."""

    steps: int = 8
    lr: float = 1e-4
    kind = TRAIN

    def to_json(self) -> dict[str, Any]:
        return {"kind": TRAIN, "steps": self.steps, "lr": self.lr}


Spec = GenerateSpec | TrainSpec  # a built-in workload, as the command line names it


def spec_fields(spec: Spec) -> dict[str, Any]:
    """Returns all of `spec` as JSON, for a worker process to rebuild it with `spec_from_fields`."""
    return {"kind": spec.kind, **dataclasses.asdict(spec)}


def spec_from_fields(data: dict[str, Any]) -> Spec:
    """Returns the spec that `spec_fields` wrote."""
    fields = {key: value for key, value in data.items() if key != "kind"}
    return TrainSpec(**fields) if data["kind"] == TRAIN else GenerateSpec(**fields)


class Workload:
    kind = "run"
    grad = False  # whether it runs with autograd on; inference workloads run without

    def run(self, model: torch.nn.Module) -> Any:
        """The whole workload: compared, accounted and timed."""
        raise NotImplementedError

    def first(self, model: torch.nn.Module) -> Any:
        """What the fresh-process first-call timing times: the whole run unless a workload says otherwise."""
        return self.run(model)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind}


@dataclass
class Custom(Workload):
    """The `run` of a `(model, run)` factory: any callable taking the model, returning what to compare."""

    fn: Callable[[torch.nn.Module], Any]

    def run(self, model: torch.nn.Module) -> Any:
        return self.fn(model)


@dataclass
class Generate(Workload):
    """Greedy `model.generate` with a fresh cache (`cache_kwargs`): compares the new tokens and their raw
    logits."""

    input_ids: torch.Tensor
    tokens: int
    kwargs: dict[str, Any] = field(default_factory=dict)  # the factory's kwargs, passed on to generate
    cache: str = "dynamic"
    first_whole: bool = False  # the first-call timing times the whole generate, not its first token
    kind = GENERATE

    def run(self, model: torch.nn.Module, tokens: int | None = None) -> dict[str, torch.Tensor]:
        new = tokens or self.tokens
        kwargs = {
            "attention_mask": torch.ones_like(self.input_ids),
            **cache_kwargs(model, self.cache),
            **self.kwargs,
        }
        with torch.no_grad():
            out = model.generate(  # type: ignore[operator]
                self.input_ids,
                max_new_tokens=new,
                min_new_tokens=new,  # no early stop on a random model's EOS: every run has the same length
                do_sample=False,
                output_logits=True,  # raw logits, before the processors (min_new_tokens masks EOS)
                return_dict_in_generate=True,
                **kwargs,
            )
        return {
            "tokens": out.sequences[:, self.input_ids.shape[-1] :],
            "logits": torch.stack(out.logits, dim=1),
        }

    def first(self, model: torch.nn.Module) -> Any:
        # Time to first token: the prefill and the choice of one token, no decode step; or the whole
        # first generate, every compile of its tokens included.
        return self.run(model) if self.first_whole else self.run(model, tokens=1)

    def to_json(self) -> dict[str, Any]:
        prompt = int(self.input_ids.shape[-1])
        return {"kind": GENERATE, "tokens": self.tokens, "prompt_len": prompt, "cache": self.cache}


@dataclass
class Train(Workload):
    """Training steps on the factory's inputs: forward, a loss, backward, and an AdamW step.

    The loss is the output's `loss` where it has one (a transformers model given labels), else a fixed
    random projection of its floating outputs. A run makes its own optimizer and compares the loss of
    every step and the gradients of the first, which no optimizer step has touched yet."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    spec: TrainSpec
    kind = TRAIN
    grad = True

    def run(self, model: torch.nn.Module) -> dict[str, Any]:
        optimizer = torch.optim.AdamW(model.parameters(), lr=self.spec.lr)
        losses, grads = [], {}
        for number in range(self.spec.steps):
            losses.append(self.step(model, optimizer))
            if number == 0:
                grads = {
                    name.replace("_orig_mod.", ""): p.grad.clone()
                    for name, p in model.named_parameters()
                    if p.grad is not None
                }
            optimizer.step()
        return {"loss": torch.stack(losses), "grad": grads}

    def first(self, model: torch.nn.Module) -> Any:
        # The first training step: its forward and backward compile, then the optimizer steps eagerly.
        optimizer = torch.optim.AdamW(model.parameters(), lr=self.spec.lr)
        loss = self.step(model, optimizer)
        optimizer.step()
        return loss

    def step(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.Tensor:
        """Runs one forward and backward in training mode; returns the loss, detached."""
        model.train()
        optimizer.zero_grad(set_to_none=True)
        loss = training_loss(model(*clone_inputs(self.args), **clone_inputs(self.kwargs)))
        loss.backward()
        return loss.detach()

    def to_json(self) -> dict[str, Any]:
        return self.spec.to_json()


def training_loss(output: Any) -> torch.Tensor:
    """Returns the output's own loss where it has one, else `projected_loss`'s; raises VerifyError where
    no output requires grad."""
    own = getattr(output, "loss", None) if not isinstance(output, dict) else output.get("loss")
    loss = own if isinstance(own, torch.Tensor) and own.requires_grad else projected_loss(output)
    if loss is None:
        raise VerifyError("workload", "--workload train: no floating-point output requires grad")
    return loss.float()


def make_workload(
    spec: Spec, model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], seed: int
) -> Workload:
    """Returns the workload `spec` names for a built model and the factory's inputs."""
    if isinstance(spec, GenerateSpec):
        return make_generate(spec, model, args, kwargs, seed)
    if not any(p.requires_grad for p in model.parameters()):
        raise VerifyError("workload", f"--workload train: {type(model).__name__} has no trainable parameters")
    return Train(args, kwargs, spec)


def cache_kwargs(model: torch.nn.Module, cache: str) -> dict[str, Any]:
    """What generate takes to make a fresh cache of the kind `cache` names. A static one the way transformers
    documents, `cache_implementation="static"`, with its own compile of the forward (on CUDA) turned off:
    each variant runs as it says, the eager one eagerly."""
    if cache == "static":
        return {"cache_implementation": "static", "disable_compile": True}
    return {"past_key_values": new_cache(model)}


def new_cache(model: torch.nn.Module) -> Any:
    """transformers' default cache for these models, made explicitly: a `DynamicCache`, or for an
    encoder-decoder an `EncoderDecoderCache` of two, as generate makes them.

    Left to itself, generate may pick a static cache for some models (Gemma2 in older releases) and then
    compile the forward on its own on CUDA, which would blur eager, full and regional.
    """
    from transformers import DynamicCache

    def dynamic() -> Any:
        try:
            return DynamicCache(config=model.config)  # per-layer kinds (sliding windows) from the config
        except TypeError:  # releases whose DynamicCache takes no config
            return DynamicCache()

    if getattr(model.config, "is_encoder_decoder", False):
        from transformers import EncoderDecoderCache

        return EncoderDecoderCache(dynamic(), dynamic())
    return dynamic()


def make_generate(
    spec: GenerateSpec, model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], seed: int
) -> Generate:
    """The generate workload for a built model; args[0] is the prompt, or one is made from the config."""
    if not callable(getattr(model, "generate", None)):
        raise VerifyError(
            "workload",
            f"--workload generate needs a model with .generate (a transformers causal LM), "
            f"not a {type(model).__name__}",
        )
    whole = spec.first == "generate"
    if args:
        ids = args[0]
        if not isinstance(ids, torch.Tensor) or ids.is_floating_point():
            raise VerifyError("workload", "--workload generate takes the factory's args[0] as input_ids")
        ids = ids if ids.dim() == 2 else ids.unsqueeze(0)
        return Generate(ids, spec.tokens, kwargs, spec.cache, whole)
    vocab = getattr(model.config, "vocab_size", None)  # type: ignore[union-attr]
    if not isinstance(vocab, int):
        raise VerifyError("workload", "no input_ids from the factory and no vocab_size in the model's config")
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (1, spec.prompt_len), generator=generator)
    device = next(model.parameters()).device
    return Generate(ids.to(device), spec.tokens, kwargs, spec.cache, whole)


def projected_loss(output: Any) -> torch.Tensor | None:
    """Returns a fixed random projection of every floating leaf of `output` that requires grad, summed, or
    None where no leaf does.

    A projection rather than a plain sum, because the sum of a softmax, say, is constant and has no
    gradient. Each leaf's weights are seeded by its path, so two models' losses weigh their leaves alike."""
    terms = [
        _projection(path, leaf)
        for path, leaf in leaves(output)
        if isinstance(leaf, torch.Tensor) and leaf.requires_grad and leaf.is_floating_point()
    ]
    return torch.stack(terms).sum() if terms else None


def _projection(path: str, leaf: torch.Tensor) -> torch.Tensor:
    generator = torch.Generator().manual_seed(zlib.crc32(path.encode()))
    weights = torch.randn(leaf.shape, generator=generator, dtype=torch.float32).to(leaf.device, leaf.dtype)
    return (leaf * weights).sum().float()
