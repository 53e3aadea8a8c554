"""Per-block float constants: blocks of one class whose modules hold a float attribute that differs between
them (a stochastic-depth rate spaced over depth, `drop_path1.drop_prob`), read in forward."""


def differing_constants(blocks, most=2):
    """Why `blocks` are not regions of their owner, or None: more than `most` sets of values of their float
    attributes. Dynamo takes a module's float as a constant and guards on its value, so a traced region
    serves only blocks holding the same values, and the owner would trace a region for each set. Its
    graph is compiled in pieces instead (`pieces_backend`): traced whole, pieces alike compiled once,
    a block whose float only picks a branch being alike. With another backend the blocks are compiled one
    by one, where Dynamo's automatic dynamic makes the float symbolic at its second value. Torch 2.11 to
    2.15 fail to pass a symbolic float into a nested region. Integers are not counted: they are layer
    indexes, which the cache stand-ins and the codemod's fixes serve."""
    for cls in dict.fromkeys(map(type, blocks)):  # each class of blocks, in their order
        sets, differing = set(), {}
        for block in [block for block in blocks if type(block) is cls]:
            floats = tuple(
                (f"{name}.{attribute}".lstrip("."), value)
                for name, module in block.named_modules()
                for attribute, value in vars(module).items()
                if type(value) is float
            )
            sets.add(floats)
            for key, value in floats:
                differing.setdefault(key, set()).add(value)
        if len(sets) > most:
            names = [key for key, values in differing.items() if len(values) > 1]
            if names:
                shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
                return (
                    f"its blocks differ in float attributes ({shown}; {len(sets)} sets of values), which "
                    "Dynamo would trace a region for each of"
                )
    return None
