"""The decisions every pattern shares before its own: already compiled, skip comment, no block, --style wrap;
and the note of the blocks that receive a per-iteration integer."""

from __future__ import annotations

import libcst as cst
from libcst.metadata import PositionProvider

from regionalize.codemod import int_fixes
from regionalize.codemod.patterns import emit
from regionalize.codemod.patterns.context import Context, SiteMaker
from regionalize.codemod.patterns.ints import indexed_args, int_args
from regionalize.codemod.patterns.model import Element, blocks_of, dotted_name
from regionalize.shared.sites import CODES, Site

_CONSTANT = "RGZ202"  # a per-block value by the loop's index


def triage(
    ctx: Context,
    site: SiteMaker,
    call: cst.Call,
    leaves: list[Element],
    blocks: list[Element],
    pattern: str,
    compiled: bool,
) -> bool:
    """The decisions every pattern shares; True when the site is settled (reported, or wrapped)."""
    if not blocks and any(e.kind in ("holder", "undeclared", "factory") for e in leaves):
        # Before "already compiled", which can be a guess from the attribute's name (`.layers` compiled
        # elsewhere in the file): what the source says decides, the same on every pass.
        site(*_why_not(ctx, leaves))
    elif compiled or any(e.kind == "compiled" for e in leaves):
        site("RGZ002", "skip")
        record_int_args(ctx, leaves, pattern, warn=False)
    elif ctx.skip_comment(call):
        site("RGZ101", "skip")
    elif not blocks:
        site(*_why_not(ctx, leaves))
    else:
        record_int_args(ctx, blocks, pattern, warn=True)
        if ctx.options.style != "wrap":
            return False
        for element in blocks:
            emit.wrap(ctx, element)
        site("RGZ001", "rewrite")
    return True


def record_int_args(ctx: Context, blocks: list[Element], pattern: str, warn: bool) -> None:
    """Note the blocks that receive a per-iteration integer, for int_fixes to follow."""
    for element in blocks:
        if element.kind == "nested" and element.inner is not None:
            record_int_args(ctx, blocks_of(element.inner), pattern, warn)
            continue
        if element.kind == "stage":  # not a region: its blocks are, whatever integers it takes
            continue
        call = element.call
        if call is not None and element.kind == "compiled" and call.args:
            call = call.args[0].value  # torch.compile(Block(..))
        if not isinstance(call, cst.Call):
            continue
        int_vars = ctx.loop_int_vars() | element.int_vars
        positions, keywords, names = int_args(call, int_vars)
        if warn and (rates := indexed_args(call, int_vars, ctx.loop_rate_vars() | element.rate_vars)):
            values = ", ".join(f"`{ctx.module.code_for_node(arg.value)}`" for arg in rates)
            position = ctx.get_metadata(PositionProvider, rates[0]).start
            block = dotted_name(call.func) or element.label
            reason = f"{CODES[_CONSTANT]}; {values} reach{'es' * (len(rates) == 1)} {block}(...)"
            ctx.sites.append(Site(*ctx.where(position), _CONSTANT, pattern, block, "warn", reason))
        if names:
            position = ctx.get_metadata(PositionProvider, call).start
            block = dotted_name(call.func) or element.label
            ctx.int_args.append(
                int_fixes.IntArgs(block, positions, keywords, names, *ctx.where(position), pattern, warn)
            )


def _why_not(ctx: Context, elements: list[Element]) -> tuple[str, str, str]:
    kinds = {e.kind for e in elements}
    if "holder" in kinds:
        return ("RGZ108", "skip", "")
    if "excluded" in kinds:
        return ("RGZ105", "skip", "")
    if undeclared := next((e for e in elements if e.kind == "undeclared"), None):
        name = (undeclared.returns[0] if undeclared.returns else undeclared.label).rsplit(".", 1)[-1]
        declared = ctx.facts.package_declarations
        if undeclared.declared in declared and undeclared.declared not in ctx.facts.declarations:
            where = f"the package's `_repeated_blocks` on {len(declared)} model classes, e.g. `{declared[0]}`"
        else:
            where = f"`{undeclared.declared}`"
        return ("RGZ111", "skip", f"{where}; `--always {name}` compiles it")
    if factory := next((e for e in elements if e.kind == "factory"), None):
        classes = [r.rsplit(".", 1)[-1] for r in factory.returns]
        shown = ", ".join(classes[:3]) + (", ..." if len(classes) > 3 else "")
        return ("RGZ112", "skip", f"`{factory.label}` returns one of {len(classes)} classes ({shown})")
    if "leaf" in kinds:
        return ("RGZ102", "skip", "")
    if "parts" in kinds:
        return ("RGZ110", "skip", "")
    return ("RGZ103", "skip", "")
