"""--prefix-caching-hash-algo sha256_cbor gives vLLM's portable block hashes, the ones llm-d's
indexer recomputes from token ids: canonical CBOR (checked on RFC 8949's own examples), a block's
hash spelled out byte by byte from the documented scheme, the root from PYTHONHASHSEED, and the
block manager chaining them (with the adapter's name as the extra key)."""

from __future__ import annotations

import hashlib

import pytest
from infernetes.runtime.engine.block_hash import block_hash, cbor, none_hash
from infernetes.runtime.engine.block_manager import BlockManager
from infernetes.runtime.engine.request import Request
from infernetes.runtime.kv_events.events import KVEventCollector
from infernetes.runtime.lora.request import LoRARequest
from infernetes.runtime.sampling_params import SamplingParams

# RFC 8949, Appendix A (the items block hashes are made of).
RFC_8949 = [
    (0, "00"),
    (23, "17"),
    (24, "1818"),
    (100, "1864"),
    (1000, "1903e8"),
    (1000000, "1a000f4240"),
    (1000000000000, "1b000000e8d4a51000"),
    (18446744073709551615, "1bffffffffffffffff"),
    (-1, "20"),
    (-1000, "3903e7"),
    (None, "f6"),
    (False, "f4"),
    (True, "f5"),
    (b"", "40"),
    (bytes.fromhex("01020304"), "4401020304"),
    ("", "60"),
    ("a", "6161"),
    ("\u00fc", "62c3bc"),
    ([], "80"),
    ((1, 2, 3), "83010203"),
    ([1, [2, 3], [4, 5]], "8301820203820405"),
    (list(range(1, 26)), "98190102030405060708090a0b0c0d0e0f101112131415161718181819"),
]


@pytest.mark.parametrize(("item", "encoded"), RFC_8949)
def test_cbor_is_rfc_8949_s_canonical_encoding(item, encoded):
    assert cbor(item).hex() == encoded


def _spelled_out(parent: bytes, tokens: list[int]) -> bytes:
    """sha256 of the CBOR array [parent bytes, tokens, null], each token id below 2**16 here."""
    items = b"".join(
        bytes([t]) if t < 24 else bytes([0x18, t]) if t < 256 else b"\x19" + t.to_bytes(2, "big")
        for t in tokens
    )
    assert len(tokens) < 24
    array = bytes([0x80 | len(tokens)]) + items
    return hashlib.sha256(b"\x83" + b"\x58\x20" + parent + array + b"\xf6").digest()


def test_the_root_and_a_block_s_hash_are_vllm_s_scheme(monkeypatch):
    root = hashlib.sha256(b"\x64" + b"1234").digest()  # the text string "1234"
    monkeypatch.setenv("PYTHONHASHSEED", "1234")
    assert none_hash() == root
    tokens = [1, 23, 24, 300, 70000 % 65536]
    assert block_hash(root, tuple(tokens), None) == _spelled_out(root, tokens)
    monkeypatch.delenv("PYTHONHASHSEED")
    assert none_hash() != none_hash()  # no seed: random, as vLLM's


def test_the_block_manager_chains_sha256_cbor_from_the_seeded_root(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "7")
    root = hashlib.sha256(b"\x61" + b"7").digest()
    sink = KVEventCollector()
    manager = BlockManager(num_blocks=8, block_size=2, hash_algo="sha256_cbor", event_sink=sink)
    request = Request("a", [5, 6, 7, 8, 9], SamplingParams(max_tokens=1))
    assert manager.allocate_slots(request, 5)
    first = _spelled_out(root, [5, 6])
    assert request.block_hashes == [first, _spelled_out(first, [7, 8])]
    (stored,) = sink.take()
    assert stored.block_hashes == [int.from_bytes(h[24:], "big") for h in request.block_hashes]

    # An adapter's blocks: its name is the extra key (vLLM's), so they differ from the base's.
    lora = LoRARequest("sql", 3, "/adapters/sql")
    adapted = Request("b", [5, 6, 7], SamplingParams(max_tokens=1), lora_request=lora)
    assert manager.allocate_slots(adapted, 3)
    assert adapted.block_hashes == [block_hash(root, (5, 6), ("sql",))] != [first]
