"""The admission test of a RADOS gateway's misses (shuttle.store.rados_admission): whole
blocks while the cache has room or the block missed within the cache's reach, only the
bytes asked for otherwise."""

from __future__ import annotations

from shuttle.store.rados_admission import GHOST_BLOCKS_MAX, MissAdmission


def test_a_cache_with_room_reads_every_miss_whole() -> None:
    a = MissAdmission(4)
    assert all(a.whole("k", i, i, room=True) for i in range(10))
    assert a.stats() == {"whole_reads": 10, "partial_reads": 0, "ghost_hits": 0}


def test_a_full_cache_reads_a_first_miss_partially_and_a_second_within_reach_whole() -> None:
    a = MissAdmission(4)
    assert not a.whole("k", 7, 7, room=False)
    assert a.whole("k", 7, 7, room=False)  # missed again at once: it would have stayed
    assert a.stats() == {"whole_reads": 1, "partial_reads": 1, "ghost_hits": 1}


def test_a_block_missed_again_beyond_the_reach_is_read_partially() -> None:
    a = MissAdmission(4)
    assert not a.whole("k", 0, 0, room=False)
    for i in range(1, 5):  # four other blocks: block 0 has left the reach
        assert not a.whole("k", i, i, room=False)
    assert not a.whole("k", 0, 0, room=False)
    assert a.stats()["ghost_hits"] == 0
    # Three others since: still within the reach of four.
    for i in range(5, 8):
        a.whole("k", i, i, room=False)
    assert a.whole("k", 0, 0, room=False)


def test_a_range_over_several_blocks_is_whole_if_any_of_them_missed_recently() -> None:
    a = MissAdmission(8)
    assert not a.whole("k", 3, 3, room=False)
    assert a.whole("k", 2, 4, room=False)
    assert a.whole("k", 4, 4, room=False)  # remembered as part of the range


def test_keys_are_told_apart() -> None:
    a = MissAdmission(8)
    assert not a.whole("a", 0, 0, room=False)
    assert not a.whole("b", 0, 0, room=False)
    assert a.whole("a", 0, 0, room=False)


def test_the_reach_is_the_cache_s_blocks_and_bounded() -> None:
    assert MissAdmission(0).reach_blocks == 0
    assert MissAdmission(16).reach_blocks == 16
    assert MissAdmission(10 * GHOST_BLOCKS_MAX).reach_blocks == GHOST_BLOCKS_MAX
    a = MissAdmission(0)  # a cache of no blocks: nothing is ever worth a whole block
    assert not a.whole("k", 0, 0, room=False)
    assert not a.whole("k", 0, 0, room=False)


def test_would_keep_says_what_whole_would_and_remembers_nothing() -> None:
    a = MissAdmission(4)
    assert a.would_keep("k", 3, 3, room=True)
    assert not a.would_keep("k", 3, 3, room=False)
    assert not a.would_keep("k", 3, 3, room=False)  # asking twice is not a second miss
    assert a.stats() == {"whole_reads": 0, "partial_reads": 0, "ghost_hits": 0}
    assert not a.whole("k", 3, 3, room=False)  # a client's direct read names it
    assert a.would_keep("k", 2, 3, room=False)  # any block of the range missed within reach
    assert not a.would_keep("j", 3, 3, room=False)
