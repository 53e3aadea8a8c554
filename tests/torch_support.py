"""What the tests that run compiled code share about the running torch."""

from __future__ import annotations

import pytest
import torch  # noqa: F401  (the runtime reads torch.compiler)

from regionalize.runtime.nested import _regionalize_reuses

# Tests of the owner compiled whole with its blocks nested regions: the default form where torch reuses a
# traced region (2.12 and later). Where it does not, the blocks are compiled one by one
# (tests/test_torch_features.py tests that form on every torch).
needs_reuse = pytest.mark.skipif(
    not _regionalize_reuses(), reason="this torch does not reuse a traced region: owners run per block"
)
