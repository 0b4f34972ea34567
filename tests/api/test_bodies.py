"""The nesting check on JSON text agrees with the depth of the decoded value."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pingo.untrusted import depth_exceeds

_TRICKY = st.sampled_from(["[{", "}]", '"', "\\", '\\"', "\\\\", "é中", "{output}"])
_SCALARS = st.none() | st.booleans() | st.integers() | st.text(max_size=5) | _TRICKY
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=3) | _TRICKY, inner, max_size=3)
    ),
    max_leaves=30,
)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(_VALUES, st.booleans())
def test_depth_check_matches_the_decoded_depth(value: Any, ascii_only: bool) -> None:
    raw = json.dumps(value, ensure_ascii=ascii_only)
    depth = _depth(value)
    for limit in range(depth + 2):
        assert depth_exceeds(raw, limit) == (depth > limit)
