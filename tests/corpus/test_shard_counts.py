"""A folder's ``sizes.json`` is parsed once for all its shards (not once per shard), and a rewritten one is read
again: iter_shard's count check sees the new record."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from halsift.corpus.shards import Sample, ShardFormatError, ShardWriter, iter_samples, iter_shard, write_json_atomic


def _png(i: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((4, 4, 3), i, np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _corpus(out, n: int, per: int):
    with ShardWriter(out, maxcount=per) as w:
        for i in range(n):
            w.write(Sample(f"k{i:04d}", _png(i), f"Caption {i}.", {"captioner": "t", "source": "i2t"}, ext="png"))
    return out


def test_sizes_json_is_parsed_once_per_folder(tmp_path, monkeypatch):
    data = _corpus(tmp_path / "c", 40, 2)  # 20 shards
    reads = []
    real = Path.read_text

    def read_text(self, *a, **k):
        reads.append(self.name)
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", read_text)
    assert len(list(iter_samples(data))) == 40
    assert reads.count("sizes.json") == 1  # once for 20 shards, not once per shard


def test_a_rewritten_sizes_json_is_read_again(tmp_path):
    data = _corpus(tmp_path / "c", 4, 2)
    assert len(list(iter_shard(data / "000000.tar"))) == 2
    sizes = json.loads((data / "sizes.json").read_text())
    write_json_atomic(data / "sizes.json", {**sizes, "000000.tar": 3})
    with pytest.raises(ShardFormatError, match=r"holds 2 samples but sizes.json records 3"):
        list(iter_shard(data / "000000.tar"))
