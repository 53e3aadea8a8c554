"""The codemod's finder, in layers: each module imports only from the ones listed before it.

`model` (the shared data) and `ints` (integer loop variables) -> `context` (the walk's state, names, sites)
-> `judgement` (block or leaf) and `emit` (the code written) -> `triage` (the decisions every pattern
shares) -> one module per pattern family: `containers`, `loops`, `extend`. `regionalize.codemod.transform`
runs them; nothing else in the codemod imports them (tests/test_layout.py).
"""
