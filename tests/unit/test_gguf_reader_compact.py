"""Our GGUF parse (models/gguf_reader.py) keeps array fields compact (issue 44: RSS after load): the stock
gguf.GGUFReader makes a numpy view per array item at the parse (~250k objects for SmolLM2's vocabulary and merges,
whose allocator arenas the objects a load keeps pin in the RSS once the parse is dropped), ours makes each when it is
read. Every field must read exactly as the stock reader's: offsets, names, types, data indices, every part's dtype
and bytes, ``contents()``; on the shipped SmolLM2 file and on a small file holding string, int, float and bool
arrays and an array of arrays (which stays the stock reader's)."""
from __future__ import annotations

import gc
import struct
from pathlib import Path

import numpy as np
import pytest

from mindie_service.models.gguf_reader import ArrayParts, parse_gguf
from mindie_service.models.packaged_models import packaged_file


def _small(tmp_path: Path) -> Path:
    import gguf
    out = tmp_path / "arrays.gguf"
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_array("t.strings", ["a", "", "héllo", "Ġworld", "x" * 300])
    w.add_array("t.ints", [3, -1, 7])
    w.add_array("t.floats", [0.5, -2.0])
    w.add_array("t.bools", [True, False, True])
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_string("t.name", "small")
    w.add_uint32("t.count", 7)
    w.add_tensor("w", np.arange(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _same_as_stock(path: Path) -> None:
    from gguf import GGUFReader
    stock, ours = GGUFReader(str(path)), parse_gguf(path)
    assert list(stock.fields) == list(ours.fields)
    for name, a in stock.fields.items():
        b = ours.fields[name]
        assert (a.offset, a.name, a.types, list(a.data), len(a.parts)) == (b.offset, b.name, b.types, list(b.data),
                                                                            len(b.parts)), name
        for i in range(len(a.parts)):
            assert a.parts[i].dtype == b.parts[i].dtype and a.parts[i].tobytes() == b.parts[i].tobytes(), (name, i)
        assert a.contents() == b.contents(), name
    assert [(t.name, t.data.tobytes()) for t in stock.tensors] == [(t.name, t.data.tobytes()) for t in ours.tensors]


def test_every_field_of_a_small_file_reads_as_the_stock_readers(tmp_path):
    _same_as_stock(_small(tmp_path))
    fields = parse_gguf(_small(tmp_path)).fields
    assert isinstance(fields["t.strings"].parts, ArrayParts) and isinstance(fields["t.ints"].parts, ArrayParts)
    assert fields["t.strings"].parts[-1].tobytes() == b"x" * 300 and fields["t.ints"].parts[-4:][0].tolist() == [3]
    with pytest.raises(IndexError):
        fields["t.ints"].parts[len(fields["t.ints"].parts)]


def test_empty_arrays_read_as_the_stock_readers(tmp_path):
    # gguf's writer refuses an empty array; other writers do not: a file of two, written by hand (GGUF v3, no tensor)
    def key(k: str, item: int) -> bytes:
        return struct.pack("<Q", len(k)) + k.encode() + struct.pack("<IIQ", 9, item, 0)  # ARRAY of item, 0 long
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + key("t.strings", 8) + key("t.ints", 5))
    _same_as_stock(path)
    assert [f.contents() for k, f in parse_gguf(path).fields.items() if k.startswith("t.")] == [[], []]


def test_the_shipped_file_reads_as_the_stock_readers_with_no_view_per_vocabulary_entry():
    path = Path(packaged_file("SmolLM2-135M-Instruct"))
    _same_as_stock(path)
    gc.collect()
    before = sum(isinstance(o, np.ndarray) for o in gc.get_objects())
    reader = parse_gguf(path)
    gc.collect()
    made = sum(isinstance(o, np.ndarray) for o in gc.get_objects()) - before
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == 49152
    assert made < 5000, f"the parse holds {made} numpy arrays (the stock reader: ~250k)"
