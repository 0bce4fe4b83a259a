"""What the principal tests share (``test_principal_*.py``): two cluster keys, a
principal, and strategies for names and prefixes.
"""

from __future__ import annotations

from hypothesis import strategies as st

from shuttle.net.principals import Caps, Principal

CLUSTER_KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))

names = st.from_regex(r"[a-z0-9][a-z0-9._@-]{0,20}", fullmatch=True)
prefixes = st.lists(st.sampled_from(["", "data/", "data", "scratch/", "a/b/", "é/"]), max_size=3)

ALICE = Principal(
    "alice", Caps.of(read=["data/"], write=["scratch/"]), bytes(range(16)), 1_700_000_000 * 10**9
)
