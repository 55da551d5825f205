"""``--prefix-caching-hash-algo sha256_cbor``: vLLM's portable block hash, the one a KV-aware
router recomputes from a prompt's token ids (llm-d's indexer does, to ask which replica holds a
prefix), so a replica's published block hashes must be these exactly.

A block's hash is ``sha256(cbor((parent, tokens, extra_keys)))`` in canonical CBOR (RFC 8949
section 4.2.1): ``parent`` the hash of the block before it (32 bytes), or for a request's first
block the root ``NONE_HASH``; ``tokens`` the block's token ids; ``extra_keys`` None, or a tuple of
what else the KV depends on (the adapter's name). The root is ``sha256(cbor(PYTHONHASHSEED))``,
the seed read as a string, or 32 random bytes without one, so replicas (and a router) agree on
it only when they are given the same seed, as in vLLM.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
from typing import Any

logger = logging.getLogger(__name__)


def _head(major: int, value: int) -> bytes:
    """A CBOR item's head: its major type and the shortest encoding of its argument."""
    if value < 24:
        return bytes([major << 5 | value])
    for info, fmt in ((24, ">B"), (25, ">H"), (26, ">I"), (27, ">Q")):
        if value < 1 << (8 * struct.calcsize(fmt)):
            return bytes([major << 5 | info]) + struct.pack(fmt, value)
    raise ValueError(f"a CBOR argument above 64 bits: {value}")


def cbor(item: Any) -> bytes:
    """Canonical CBOR of None, booleans, integers, bytes, strings, tuples and lists (what block
    hashes are made of)."""
    if item is None:
        return b"\xf6"
    if item is True or item is False:
        return b"\xf5" if item else b"\xf4"
    if isinstance(item, int):
        return _head(0, item) if item >= 0 else _head(1, -1 - item)
    if isinstance(item, bytes):
        return _head(2, len(item)) + item
    if isinstance(item, str):
        data = item.encode()
        return _head(3, len(data)) + data
    if isinstance(item, tuple | list):
        return _head(4, len(item)) + b"".join(cbor(element) for element in item)
    raise TypeError(f"no CBOR encoding here for {type(item).__name__}")


def sha256_cbor(item: Any) -> bytes:
    return hashlib.sha256(cbor(item)).digest()


def none_hash(seed: str | None = None) -> bytes:
    """The root a request's first block chains from: from ``PYTHONHASHSEED`` (or ``seed``)."""
    seed = os.environ.get("PYTHONHASHSEED") if seed is None else seed
    if seed is None:
        logger.warning(
            "sha256_cbor block hashes without PYTHONHASHSEED start from a random root: no other "
            "replica or KV-aware router computes the same hashes"
        )
        return os.urandom(32)
    return sha256_cbor(seed)


def block_hash(parent: bytes, tokens: tuple[int, ...], extra_keys: tuple | None) -> bytes:
    return sha256_cbor((parent, tokens, extra_keys))
