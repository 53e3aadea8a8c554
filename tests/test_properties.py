"""Property: whatever model source the codemod is given, its output parses and a second pass is a no-op."""

from __future__ import annotations

import libcst as cst
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from regionalize.codemod import transform_source
from regionalize.shared.options import Options

IMPORTS = [
    ("import torch.nn as nn", "nn."),
    ("from torch import nn", "nn."),
    ("import torch", "torch.nn."),
    ("from torch.nn import ModuleList, Sequential, ModuleDict, Linear, Identity", ""),
]
ELEMENTS = [
    "Block(d)",
    "Block(d, i)",
    "{p}Linear(d, d)",
    "None",
    "make(d)",
    "Block(d) if i else {p}Identity()",
    "copy.deepcopy(layer)",
    "torch.compile(Block(d))",
    "Layer(cfg, layer_idx=i)",
    "{p}ModuleList([Block(d), {p}Linear(d, d)])",
    "{p}Sequential({p}Linear(d, d), Block(d))",
]
COMMENTS = ["", "  # note", "  # regionalize: skip"]


@st.composite
def statements(draw: st.DrawFn, prefix: str) -> str:
    element = draw(st.sampled_from(ELEMENTS)).format(p=prefix)
    comment = draw(st.sampled_from(COMMENTS))
    target = draw(st.sampled_from(["self.layers", "layers", "self.blocks", "out"]))
    loop = draw(st.sampled_from(["for i in range(n)", "for i, c in enumerate(cfgs)", "for c in cfgs"]))
    kind = draw(st.integers(0, 7))
    ml, seq, md = f"{prefix}ModuleList", f"{prefix}Sequential", f"{prefix}ModuleDict"
    if kind == 0:
        return f"{target} = {ml}([{element} {loop}]){comment}"
    if kind == 1:
        return f"{target} = {seq}(*[{element} {loop}]){comment}"
    if kind == 2:
        return f"{target} = {ml}({element} {loop}){comment}"
    if kind == 3:
        return f"{target} = {ml}()\n{loop}:\n    {target}.append({element}){comment}"
    if kind == 4:
        return f"xs = []\n{loop}:\n    xs.append({element}){comment}\n{target} = {seq}(*xs)"
    if kind == 5:
        return f"{target} = {md}({{str(i): {element} {loop}}}){comment}"
    if kind == 6:
        return f"{loop}:\n    self.add_module(f'l{{i}}', {element}){comment}"
    return f"{target} = {ml}([{ml}([{element} {loop}]) for _ in range(2)]){comment}"


@st.composite
def sources(draw: st.DrawFn) -> str:
    header, prefix = draw(st.sampled_from(IMPORTS))
    body = draw(st.lists(statements(prefix), min_size=1, max_size=5))
    where = draw(st.sampled_from(["method", "function", "module"]))
    if where == "module":
        return header + "\n\n" + "\n".join(body) + "\n"
    indent = "        " if where == "method" else "    "
    lines = "\n".join(indent + line for stmt in body for line in stmt.splitlines())
    if where == "method":
        return f"{header}\n\n\nclass M:\n    def __init__(self, d, n, cfgs):\n{lines}\n"
    return f"{header}\n\n\ndef build(self, d, n, cfgs):\n{lines}\n    return self\n"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    source=sources(),
    style=st.sampled_from(["inplace", "wrap"]),
    bypass=st.sampled_from(["none", "filter", "depyf"]),
)
def test_output_parses_and_second_pass_is_empty(source: str, style: str, bypass: str) -> None:
    cst.parse_module(source)  # the generator itself must produce valid Python
    assume(not (style == "wrap" and bypass == "depyf"))  # refused by Options, tested in test_cli
    options = Options(style=style, guard_bypass=bypass)
    first = transform_source(source, options)
    assert first.status in ("success", "skip"), first.reason
    cst.parse_module(first.code)
    second = transform_source(first.code, options)
    assert second.code == first.code
    assert not [s for s in second.sites if s.action == "rewrite"]
    assert len([s for s in first.sites if s.action != "warn"]) == len(
        [s for s in second.sites if s.action != "warn"]
    )
