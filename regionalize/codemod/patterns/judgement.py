"""Block or leaf: what one element of a container is, judged by its name, its import and where it is built."""

from __future__ import annotations

import re
from collections.abc import Callable

import libcst as cst

from regionalize.codemod.patterns.context import Context
from regionalize.codemod.patterns.model import Container, Element, blocks_of

# torch.nn classes that are themselves repeated blocks; every other torch.nn class is a leaf layer.
TORCH_COMPOSITES = {
    "Transformer",
    "TransformerEncoder",
    "TransformerDecoder",
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
}
# Class names from other libraries (timm's DropPath, Llama's RMSNorm, ...) that name single layers.
LEAF_NAME = re.compile(
    r"(Linear|Conv[123]d|Conv|ConvTranspose[123]d|Norm|Norm[123]d|Dropout|Dropout[123]d|DropPath|Identity"
    r"|Embedding|ReLU|GELU|SiLU|Sigmoid|Tanh|Softmax|Activation|Pool|Pool[123]d|Upsample|Flatten)$"
)
# Lower-case callables: parameters holding a class, and factory functions, judged by their names.
LEAF_PARAMETER = re.compile(r"norm|act|drop|pool|conv|linear|embed|proj|zero", re.IGNORECASE)
BLOCK_FACTORY = re.compile(r"block|layer|stage", re.IGNORECASE)

# An element may itself be a container; reading one is the container patterns' job, passed in from above:
# (call, kind, int_vars) -> its elements, None when nothing is repeated; (call, int_vars) -> a written-out
# ModuleList's elements, each counted as repeated.
ReadContainer = Callable[[cst.Call, str, set[str]], Container | None]
ReadLiteral = Callable[[cst.Call, set[str]], Container]


class Judge:
    """Classifies the expression that builds an element: "block", "leaf", "compiled", "nested", ..."""

    def __init__(self, ctx: Context, container: ReadContainer, literal: ReadLiteral) -> None:
        self.ctx = ctx
        self.container = container
        self.literal = literal

    def classify(self, expr: cst.BaseExpression, int_vars: set[str]) -> list[Element]:
        if isinstance(expr, cst.IfExp):
            return self.classify(expr.body, int_vars) + self.classify(expr.orelse, int_vars)
        if isinstance(expr, cst.Subscript) and isinstance(expr.value, cst.Call):
            # `build_norm_layer(cfg, c)[1]`: a part of what a leaf factory returns is a leaf too.
            parts = self.classify(expr.value, int_vars)
            kind = "leaf" if all(e.kind == "leaf" for e in parts) else "other"
            return [Element(kind, self.ctx.code(expr))]
        if not isinstance(expr, cst.Call):
            return [Element("other", self.ctx.code(expr))]
        label = self.ctx.code(expr.func)
        element = self._classify_call(expr, label, int_vars)
        element.int_vars = frozenset(int_vars)
        element.func = expr.func
        return [element]

    def _classify_call(self, expr: cst.Call, label: str, int_vars: set[str]) -> Element:
        ctx = self.ctx
        if ctx.is_torch_compile(expr):
            inner = expr.args[0].value if expr.args else None
            return Element("compiled", ctx.code(inner.func) if isinstance(inner, cst.Call) else label, expr)
        if ctx.facts.builds_itself(ctx.dotted(expr.func) or label):
            # `ResLayer(block, n)`, a Sequential of the package that builds its blocks: one block.
            return Element("block", label, expr)
        if (kind := ctx.container_kind(expr)) is not None:
            return self._container_call(expr, kind, label, int_vars)
        dotted = ctx.dotted(expr.func) or label
        last = written = dotted.rsplit(".", 1)[-1]
        if written in ctx.options.never:  # the name a site line shows: a factory, or a class handed in
            return Element("excluded", label, expr)
        if isinstance(expr.func, cst.Name) and last in ctx.scopes[-1].params:
            # `block(..)`, `block_fn(..)`, `layer_cls(..)`: a class handed in, as in ResNet's _make_layer.
            return Element("leaf" if LEAF_PARAMETER.search(last) else "block", label, expr)
        if dotted == "copy.deepcopy":  # `_get_clones(module, N)` in torch.nn.Transformer and its copies
            return Element("block", label, expr)
        returns = None if last.lstrip("_")[:1].isupper() else ctx.facts.factory(dotted)
        if returns:
            # A factory of the file or its package: what it returns decides, not its name.
            if len(returns) > 1:
                return Element("factory", label, expr, returns=returns)
            dotted, last = returns[0], returns[0].rsplit(".", 1)[-1]
        element = self._by_class(expr, label, dotted, last)
        element.returns = (dotted,) if returns else ()
        named = last in ctx.options.always or written in ctx.options.always or ctx.facts.declaring(last)
        if element.kind == "block" and not named and (declared := ctx.declaration()):
            return Element("undeclared", label, expr, declared=declared, returns=element.returns)
        return element

    def _by_class(self, expr: cst.Call, label: str, dotted: str, last: str) -> Element:
        ctx = self.ctx
        if last in ctx.options.never:
            return Element("excluded", label, expr)
        if last in ctx.options.always:
            return Element("block", label, expr)
        if last in ctx.facts.holders:
            return Element(self._holder(last in ctx.facts.regional), label, expr)
        if ctx.facts.declaring(last):
            return Element("block", label, expr)  # the model says so, whatever the class is named
        if (holds := ctx.facts.holds(dotted)) is not None:
            # Defined in this file or its package: what it builds decides, not its name (`MBConv` is a
            # block, a norm with only parameters is a leaf, whatever it is called).
            if holds and ctx.facts.holds_compiled(dotted):  # a stage of another module, its blocks compiled
                return Element(self._holder(ctx.facts.owns_regions(dotted)), label, expr)
            return Element("block" if holds else "leaf", label, expr)
        if dotted.startswith("torch.nn."):
            return Element("block" if last in TORCH_COMPOSITES else "leaf", label, expr)
        if dotted.startswith("torch."):
            return Element("other", label, expr)
        if not last.lstrip("_")[:1].isupper():
            # A factory named for what it builds: a block (`get_down_block`, `make_layer`), a leaf
            # (`build_norm_layer`, `conv3x3`, `get_activation`); other functions cannot be judged.
            if LEAF_PARAMETER.search(last):
                return Element("leaf", label, expr)
            return Element("block" if BLOCK_FACTORY.search(last) else "other", label, expr)
        return Element("leaf" if LEAF_NAME.search(last.lstrip("_")) else "block", label, expr)

    def _holder(self, regional: bool) -> str:
        """A class holding compiled blocks: a "stage" where they are nested regions of it and the site
        has an owner, which takes them (RGZ006); otherwise a "holder", an outer level left as it is."""
        return "stage" if regional and self.ctx.owned() else "holder"

    def _container_call(self, expr: cst.Call, kind: str, label: str, int_vars: set[str]) -> Element:
        inner = self.container(expr, kind, int_vars)
        if inner is not None:
            return Element("nested", label, expr, inner)
        # `nn.Sequential(conv, norm, act)` built per iteration is a composite block; a ModuleList
        # or ModuleDict is never called, so compiling it would compile nothing.
        layers = [a.value for a in expr.args if a.keyword is None and not a.star]
        if kind == "ModuleList":
            literal = self.literal(expr, int_vars)
            if blocks_of(literal):
                return Element("nested", label, expr, literal)
            leaves = literal.repeated
            if leaves and all(e.kind == "leaf" for e in leaves):
                return Element("leaf", label, expr)
            return Element("other" if leaves else "parts", label, expr)
        if kind == "Sequential" and len(layers) == 1:
            return (
                self._classify_call(layers[0], label, int_vars)
                if isinstance(layers[0], cst.Call)
                else Element("other", label, expr)
            )
        if kind == "Sequential" and layers:
            parts = [e for layer in layers for e in self.classify(layer, int_vars)]
            return Element("leaf" if all(e.kind == "leaf" for e in parts) else "block", label, expr)
        # Empty, or handed a list or dict made elsewhere (`nn.Sequential(*stage)`, `nn.ModuleList()`
        # filled later): what it holds is judged where that is built, a site of its own.
        return Element("parts", label, expr)
