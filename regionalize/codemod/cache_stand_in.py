"""May the runtime stand in for a block's layer of a transformers cache (`_regionalize_blocks(block, self,
cache_index="layer_idx")`)? Judged per read of the block's integer in a call that int_fixes moves out
of the graph: the attribute the call indexes its cache by, and whether the method asks its cache's type in
a way the stand-in would answer otherwise. The stand-ins (runtime/kv.py) answer for the block's own layer
whatever index they are handed (`update(k, v, i)`, `is_updated.get(i)`, `cross_attention_cache.layers[i]`),
so every index must be the one attribute; what they cannot answer alike they fail on, while the block is
traced: a `DynamicCache`'s stand-in has only `update`, `keys` and `values`.
"""

from __future__ import annotations

import ast

from regionalize.codemod import class_graph
from regionalize.codemod.nodes import walk

# The parameters through which the runtime hands a block its stand-in for a transformers cache layer.
_CACHE_PARAMETERS = ("past_key_values", "past_key_value")
# What the runtime's stand-in for a cache layer has: any other attribute of a cache raises when the block is
# traced with the stand-in, and the runtime then traces that cache layer by layer instead.
_STAND_IN = frozenset({"update", "keys", "values", "updates"})
# transformers' caches that a `DynamicCache` is not an instance of: the stand-in, not one either, answers
# `isinstance` as the cache it stands in for does.
_OTHER_CACHES = frozenset(
    {
        "EncoderDecoderCache",
        "StaticCache",
        "SlidingWindowCache",
        "HybridCache",
        "HybridChunkedCache",
        "OffloadedStaticCache",
        "QuantizedCache",
    }
)


def index_of(
    read: ast.Attribute, parents: dict[ast.AST, ast.AST], carrier: ast.expr | None, asked: set[str]
) -> str | None:
    """The attribute of `self.<attr>` when it is itself an argument of the call moved out (`carrier`, or
    the body of an earlier pass's lambda), else None. Also None when the method asks the type of the
    object called or of a cache parameter (`isinstance(past_key_values, DynamicCache)`): the runtime's
    stand-in for a cache layer would answer differently."""
    parent = parents.get(read)
    if indexes_another(read, parent):
        return read.attr
    if isinstance(parent, ast.keyword):
        parent = parents.get(parent)
    if not isinstance(parent, ast.Call) or parent.func is read:
        return None
    if parent is not carrier and not isinstance(parents.get(parent), ast.Lambda):
        return None
    receiver = class_graph.root_name(parent.func)
    return None if {receiver, *_CACHE_PARAMETERS} & asked else read.attr


def indexes_another(read: ast.Attribute, parent: ast.AST | None) -> bool:
    """`self.<attr>` indexing an attribute of another object that a `DynamicCache`'s stand-in lacks
    (`cache.cross_attention_cache.layers[self.layer_idx]`, `cache.is_updated[self.layer_idx] = True`): an
    index like any other, which an encoder-decoder cache's stand-in answers for the block's own layer."""
    if not isinstance(parent, ast.Subscript) or parent.slice is not read:
        return False
    node = parent.value
    while isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
        node = node.value
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id != "self"
        and node.attr not in _STAND_IN
    )


def type_checked(method: ast.AST) -> set[str]:
    """The names whose type `method` asks in a way the stand-in for a cache could answer otherwise:
    `type(name)`, `hasattr(name, ..)`, `getattr(name, .., default)`, and `isinstance(name, ..)` unless
    against transformers' other caches only (`isinstance(past_key_values, EncoderDecoderCache)`)."""
    asked = set()
    for node in walk(method):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args):
            continue
        if not isinstance(node.args[0], ast.Name):
            continue
        kind = node.func.id
        if kind == "isinstance" and len(node.args) == 2:
            against = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            if all(isinstance(c, ast.Name) and c.id in _OTHER_CACHES for c in against):
                continue
        if kind in ("isinstance", "type", "hasattr") or (kind == "getattr" and len(node.args) == 3):
            asked.add(node.args[0].id)
    return asked
