"""The whole store against a dict model, with crashes (close without checkpoint) and
reopens mixed into any sequence of operations."""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from shuttle.errors import NotFoundError
from shuttle.store import ObjectStore, StoreConfig, chunk_buffer, object_hash

KEYS = st.sampled_from(["a", "d/b", "d/e/c"])
# Up to ~300 KB, so objects span several 16-256 KiB chunks; small block cache.
CONFIG = StoreConfig(
    cache_capacity_bytes=64 * 1024, cache_block_size_bytes=4096, journal_records_max=12
)


class StoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="store-model-")
        self.store = ObjectStore(self.dir, CONFIG)
        self.model: dict[str, bytes] = {}
        self.versions: dict[str, int] = {}

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(key=KEYS, size=st.sampled_from([0, 1, 5000, 100_000, 300_000]), seed=st.integers(0, 255))
    def put(self, key: str, size: int, seed: int) -> None:
        data = bytes([seed]) * size
        self.versions[key] = self.store.put(key, data).version
        self.model[key] = data

    @rule(key=KEYS, offset=st.integers(0, 320_000), data=st.binary(max_size=70_000))
    def write(self, key: str, offset: int, data: bytes) -> None:
        self.versions[key] = self.store.write(key, offset, data, create=True).version
        buf = bytearray(self.model.get(key, b""))
        if data and offset > len(buf):
            buf.extend(bytes(offset - len(buf)))
        buf[offset : offset + len(data)] = data
        self.model[key] = bytes(buf)

    @rule(key=KEYS, size=st.integers(0, 320_000))
    def truncate(self, key: str, size: int) -> None:
        if key not in self.model:
            try:
                self.store.truncate(key, size)
            except NotFoundError:
                return
            raise AssertionError("truncate of a missing object succeeded")
        self.versions[key] = self.store.truncate(key, size).version
        buf = self.model[key]
        self.model[key] = buf[:size] + bytes(max(0, size - len(buf)))

    @rule(key=KEYS)
    def remove(self, key: str) -> None:
        if key in self.model:
            self.store.remove(key)
            del self.model[key]
        else:
            assert self.store.remove_many([key]) == [False]

    @rule(key=KEYS, pieces=st.lists(st.binary(min_size=1, max_size=50_000), max_size=4))
    def upload(self, key: str, pieces: list[bytes]) -> None:
        up = self.store.begin_upload(key)
        offset = 0
        for p in pieces:
            self.store.upload_write(up, offset, p)
            offset += len(p)
        self.versions[key] = self.store.commit_upload(up).version
        self.model[key] = b"".join(pieces)

    @rule(key=KEYS, offset=st.integers(0, 320_000), length=st.integers(0, 70_000))
    def read(self, key: str, offset: int, length: int) -> None:
        if key not in self.model:
            return
        assert self.store.read(key, offset, length) == self.model[key][offset : offset + length]

    @precondition(lambda self: True)
    @rule(checkpoint=st.booleans())
    def reopen(self, checkpoint: bool) -> None:
        self.store.close(checkpoint=checkpoint)  # without a checkpoint: as after a crash
        self.store = ObjectStore(self.dir, CONFIG)

    @invariant()
    def matches_model(self) -> None:
        assert set(self.store.list().keys) == set(self.model)
        for key, content in self.model.items():
            attrs = self.store.stat(key)
            assert attrs.version == self.versions[key]
            assert attrs.size == len(content)
            assert attrs.hash == object_hash(content)
            assert list(attrs.chunks) == chunk_buffer(content)
            assert self.store.read(key) == content


TestStoreAgainstModel = StoreModel.TestCase
TestStoreAgainstModel.settings = settings(max_examples=40, stateful_step_count=15, deadline=None)
