"""Per-sequence random numbers: splitmix64 in numba, seeded from (sampling seed, epoch, db, task, seed id).

The generator of a sequence depends only on those values, never on the thread that builds it, so batches are
identical whatever the thread count.
"""

from __future__ import annotations

import hashlib

import numpy as np
from numba import njit

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S32 = np.uint64(32)


@njit(nogil=True, cache=True, inline="always")
def mix64(z: np.uint64) -> np.uint64:
    """The splitmix64 finalizer: a bijective avalanche mix of a 64-bit word."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@njit(nogil=True, cache=True, inline="always")
def next_u64(state: np.ndarray) -> np.uint64:
    """Advance the splitmix64 state (a 1-element uint64 array) and return the next word."""
    state[0] = state[0] + _GOLDEN
    return mix64(state[0])


@njit(nogil=True, cache=True, inline="always")
def below(state: np.ndarray, n: int) -> int:
    """A uniform integer in [0, n) for 0 < n < 2**32 (multiply-high, no modulo bias worth noting)."""
    x = next_u64(state) >> _S32
    return int((x * np.uint64(n)) >> _S32)


def stream_key(*parts: int | str) -> np.uint64:
    """A stable 64-bit key from ints / strings (blake2b), identical across processes and platforms."""
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(repr(p).encode())
        h.update(b"\x00")
    return np.uint64(int.from_bytes(h.digest(), "little"))


@njit(nogil=True, cache=True)
def sequence_states(key: np.uint64, seed_ids: np.ndarray) -> np.ndarray:
    """Initial splitmix64 state of each sequence: mix(key ^ mix(seed_id))."""
    out = np.empty(seed_ids.shape[0], dtype=np.uint64)
    for i in range(seed_ids.shape[0]):
        out[i] = mix64(key ^ mix64(np.uint64(seed_ids[i]) + _GOLDEN))
    return out


def hash_unit(key: np.uint64, values: np.ndarray) -> np.ndarray:
    """Vectorized stable hash of int64 values with `key`, mapped to floats in [0, 1)."""
    with np.errstate(over="ignore"):
        z = values.astype(np.uint64) ^ key
        z = z + _GOLDEN
        z = (z ^ (z >> _S30)) * _M1
        z = (z ^ (z >> _S27)) * _M2
        z = z ^ (z >> _S31)
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)
