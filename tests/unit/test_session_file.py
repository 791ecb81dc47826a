"""A session file's K/V is used only by the model that computed it (engine.sessions.session_file): every field of
the identity (weights, dtype, block size, KV dtype, KV shape) must match, not only the weights fingerprint. A bf16
engine's file read into an fp16 engine of the same shape (same bytes per block) gives the tokens only and
leaves the fp16 pool untouched. No model is loaded: a block manager, a session store and a KV pool by hand."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.sessions.session_file import ModelIdentity, decode, encode
from mindie_service.engine.sessions.session_spill import SessionSpill
from mindie_service.engine.sessions.session_store import SessionStore
from mindie_service.errors import ValidationError

BS, LAYERS, KVH, ROW, BLOCKS = 4, 2, 2, 8, 16
TOKENS = tuple(range(100, 111))  # two full blocks and three tokens
IDENTITY = ModelIdentity(weights="f" * 64, dtype="torch.bfloat16", block_size=BS, kv_dtype="auto",
                         kv_shape=(LAYERS, 2, BS, KVH, ROW))
OTHERS = {"weights": "e" * 64, "dtype": "torch.float16", "block_size": 8, "kv_dtype": "int8",
          "kv_shape": (LAYERS, 2, BS, KVH, ROW + 4)}


def _file(identity: ModelIdentity = IDENTITY) -> bytes:
    kv = torch.arange(2 * LAYERS * 2 * BS * KVH * ROW, dtype=torch.int16).view(torch.uint8).numpy().tobytes()
    return encode("s", TOKENS, identity, "torch.bfloat16", (2, LAYERS, 2, BS, KVH, ROW), kv)


def test_the_same_identity_gives_the_kv_bytes():
    f = decode(_file(), IDENTITY, 1 << 20)
    assert f.tokens == TOKENS and f.kv is not None and len(f.kv) == 2 * LAYERS * 2 * BS * KVH * ROW * 2


@pytest.mark.parametrize("field", sorted(OTHERS))
def test_any_other_identity_field_gives_the_tokens_only(field):
    """Only this field differs from the file's identity; the weights fingerprint alone is not enough."""
    reader = dataclasses.replace(IDENTITY, **{field: OTHERS[field]})
    f = decode(_file(), reader, 1 << 20)
    assert f.tokens == TOKENS and f.kv is None
    f = decode(_file(reader), IDENTITY, 1 << 20)  # and the other way round
    assert f.tokens == TOKENS and f.kv is None


def test_a_file_over_the_cap_or_damaged_is_refused():
    data = _file()
    with pytest.raises(ValidationError, match="over the cap"):
        decode(data, IDENTITY, len(data) - 1)
    bad = bytearray(data)
    bad[30] ^= 0x01  # inside the header or tokens: the first checksum
    with pytest.raises(ValidationError):
        decode(bytes(bad), IDENTITY, 1 << 20)


def _engine_side(dtype: torch.dtype, folder: Path) -> tuple[SessionSpill, torch.Tensor]:
    bm = BlockManager(BLOCKS, BS)
    store = SessionStore(bm, max_sessions=4, kv_share=0.5, idle_seconds=3600, max_tokens=4096)
    pool = torch.zeros(LAYERS, 2, BLOCKS, BS, KVH, ROW, dtype=dtype)
    identity = dataclasses.replace(IDENTITY, dtype=str(dtype))
    return SessionSpill(bm, store, pool, identity, str(folder), 1 << 22), pool


def _kept_session(spill: SessionSpill) -> bytes:
    """A session of TOKENS whose two full blocks hold known K/V, as ``snapshot`` writes it."""
    bm, parent = spill.blocks, b""
    pins = []
    for i in range(len(TOKENS) // BS):
        toks = list(TOKENS[i * BS:(i + 1) * BS])
        h = bm.block_key(parent, toks)
        b = bm.adopt_block(h, parent or None, toks)
        assert b is not None
        spill.kv_pool[:, :, b] = float(i + 1)
        pins.append(b)
        parent = h
    spill.store.adopt("s", TOKENS, pins)
    ((key, session),) = spill.store.items()
    return spill.snapshot(key, session)


def test_a_bf16_file_is_not_restored_into_an_fp16_engine(tmp_path):
    writer, _ = _engine_side(torch.bfloat16, tmp_path / "a")
    data = _kept_session(writer)
    same, same_pool = _engine_side(torch.bfloat16, tmp_path / "b")
    assert same.adopt(decode(data, same.identity, same.max_bytes)) == 2  # the same engine kind: K/V restored
    assert same_pool.float().sum() > 0
    fp16, fp16_pool = _engine_side(torch.float16, tmp_path / "c")  # same shape, same bytes per block
    f = decode(data, fp16.identity, fp16.max_bytes)
    assert f.kv is None and f.tokens == TOKENS
    assert fp16.adopt(f) == 0  # continues from its tokens
    assert fp16_pool.abs().sum() == 0 and fp16.blocks.num_free_blocks == BLOCKS
