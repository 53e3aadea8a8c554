"""How an account names the forms that served its calls, and its counts as text. Torch-free: read by
verify's report, the zoo's table and the benchmark scripts."""

from __future__ import annotations

from typing import Any

# The form of an owner that holds one block, which the runtime compiles on its own: nothing to stamp out.
ALONE = "one block, compiled on its own"
# Where torch reuses no traced region, the calls served per block: those that hand a StaticCache, and
# those that hand a DynamicCache holding nothing yet.
STATIC = "per block with a StaticCache"
PROMPT = "per block for a prompt"
GRAD = "per block with autograd"


def regions_text(account: dict[str, Any]) -> str:
    """An account's nested regions for a table: traced / reused, or that this torch does not count them."""
    if account.get("regions_traced", "-") is None:
        return "not counted by this torch"
    return f"{account.get('regions_traced', '-')} / {account.get('regions_stamped', '-')}"


def cuda_graphs_text(account: dict[str, Any]) -> str:
    """An account's CUDA graphs: captured / calls served by replaying one."""
    captured = account.get("cuda_graphs_captured")
    return "-" if captured is None else f"{captured} / {account.get('cuda_graphs_replayed')}"
