"""core.hashing: the same digests as hashlib, small inputs fed below the size at which hashlib lets go of the GIL."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from fleetscope.core import hashing
from fleetscope.store import content_hash


@pytest.mark.parametrize("n", [0, 1, 2046, 2047, 2048, 4095, 50_000, hashing.HELD_MAX_BYTES, hashing.HELD_MAX_BYTES + 1, 3 << 20])
def test_digests_equal_hashlib_whole_and_in_parts(n: int) -> None:
    data = os.urandom(n)
    want = hashlib.sha256(data).hexdigest()
    assert hashing.sha256(data).hexdigest() == want
    assert content_hash(data[: n // 3], data[n // 3:]) == want
    assert hashing.fed(hashlib.sha1(), data).hexdigest() == hashlib.sha1(data).hexdigest()


def test_numpy_buffers_hash_as_their_bytes() -> None:
    for n in (10, 300, 100_000):
        arr = np.arange(n, dtype=np.uint64) * 0x9E3779B97F4A7C15 % (1 << 63)
        assert hashing.sha256(arr.data).digest() == hashlib.sha256(arr.tobytes()).digest()


class _Recorder:
    def __init__(self) -> None:
        self.sizes: list[int] = []

    def update(self, piece: memoryview) -> None:
        self.sizes.append(memoryview(piece).nbytes)


def test_small_inputs_never_reach_the_size_that_releases_the_gil() -> None:
    h = _Recorder()
    hashing.fed(h, os.urandom(50_000), b"protobuf")
    assert sum(h.sizes) == 50_008
    assert max(h.sizes) == 2047  # HASHLIB_GIL_MINSIZE is 2,048: nothing at or above it is handed over

    big = _Recorder()
    hashing.fed(big, os.urandom(hashing.HELD_MAX_BYTES), b"x")
    assert big.sizes == [hashing.HELD_MAX_BYTES, 1]  # large inputs go whole: the hash is long enough to share the core
