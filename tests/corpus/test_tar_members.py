"""The fast tar member reader gives tarfile's members on every layout, and tarfile's errors on damage."""

import io
import tarfile

import pytest

from halsift.corpus.shards import ShardFormatError, iter_shard
from halsift.corpus.tar_members import open_members


def _tar(path, entries, fmt=tarfile.PAX_FORMAT, mode="w"):
    """``entries``: (name, bytes) files, (name, None) folders, (name, "->target") symlinks."""
    with tarfile.open(path, mode, format=fmt) as t:
        for name, blob in entries:
            info = tarfile.TarInfo(name)
            if blob is None:
                info.type = tarfile.DIRTYPE
                t.addfile(info)
            elif isinstance(blob, str):
                info.type, info.linkname = tarfile.SYMTYPE, blob[2:]
                t.addfile(info)
            else:
                info.size = len(blob)
                t.addfile(info, io.BytesIO(blob))
    return path


def _read_all(path, compressed=False):
    members = open_members(path, compressed, path.stat().st_size)
    return [(name, read()) for name, read in members]


def _tarfile_all(path):
    with tarfile.open(path, "r|*") as t:
        return [(m.name, t.extractfile(m).read()) for m in t if m.isfile()]


ENTRIES = [("a.jpg", b"\xff\xd8" + bytes(range(256)) * 3), ("a.txt", b"one"), ("a.json", b"{}"),
           ("dir/", None), ("dir/b.jpg", b""), ("dir/b.txt", b"x" * 512), ("link.txt", "->a.txt"),
           ("c.txt", b"y" * 1025)]


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_same_members_as_tarfile(tmp_path, fmt):
    path = _tar(tmp_path / "s.tar", ENTRIES, fmt)
    got = _read_all(path)
    assert got == _tarfile_all(path)
    assert [n for n, _ in got] == ["a.jpg", "a.txt", "a.json", "dir/b.jpg", "dir/b.txt", "c.txt"]


def test_long_names_hand_over_to_tarfile(tmp_path):
    long = "d" * 60 + "/" + "k" * 80 + ".txt"  # over 100 bytes: a ustar prefix, a pax or a GNU long-name record
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT):
        path = _tar(tmp_path / f"long{fmt}.tar", [("a.txt", b"1"), (long, b"2"), ("b.txt", b"3")], fmt)
        assert _read_all(path) == _tarfile_all(path) == [("a.txt", b"1"), (long, b"2"), ("b.txt", b"3")]
    first = _tar(tmp_path / "first.tar", [("é" * 60 + ".txt", b"1"), ("b.txt", b"3")])  # a pax header first
    assert _read_all(first) == _tarfile_all(first)


def test_compressed_shards_are_read_by_tarfile(tmp_path):
    path = _tar(tmp_path / "s.tar.gz", ENTRIES, mode="w:gz")
    assert _read_all(path, compressed=True) == _tarfile_all(path)


def test_bad_checksum_mid_file_is_damage_after_earlier_samples(tmp_path):
    path = _tar(tmp_path / "000000.tar", [("s0.txt", b"a"), ("s0.json", b"{}"), ("s1.txt", b"b"),
                                          ("s1.json", b"{}"), ("s2.txt", b"c")])
    data = bytearray(path.read_bytes())
    data[4 * 1024 + 10] ^= 0xFF  # the name of s2.txt's header: its checksum no longer matches
    path.write_bytes(bytes(data))
    got = []
    with pytest.raises(ShardFormatError, match="000000.tar: truncated or corrupt tar after sample s0"):
        for s in iter_shard(path):
            got.append(s.key)
    assert got == ["s0"]  # s1 may be cut short: not yielded, as with tarfile


def test_member_cut_at_a_block_boundary_is_damage(tmp_path):
    path = _tar(tmp_path / "000000.tar", [("s0.txt", b"a"), ("s1.txt", b"b" * 3000)])
    path.write_bytes(path.read_bytes()[:1024 + 512 + 1024])  # s1's header, then 2 of its 6 data blocks
    with pytest.raises(tarfile.ReadError, match="unexpected end of data"):
        _read_all(path)
    names = []
    with pytest.raises(ShardFormatError, match="unexpected end of data"):
        for s in iter_shard(path):
            names.append(s.key)
    assert names == ["s0"]


def test_unread_members_are_skipped(tmp_path):
    path = _tar(tmp_path / "s.tar", ENTRIES)
    members = open_members(path, False, path.stat().st_size)
    picked = [(n, r()) for n, r in members if n.endswith(".txt")]
    assert picked == [(n, b) for n, b in _tarfile_all(path) if n.endswith(".txt")]


def test_tar_cut_between_members_is_damage(tmp_path):
    """Cut on a member boundary (whole 512-byte blocks, no end-of-archive blocks): tarfile reads it as complete."""
    path = _tar(tmp_path / "000000.tar", [("s0.txt", b"a"), ("s0.json", b"{}"), ("s1.txt", b"b"),
                                          ("s1.json", b"{}")])
    whole = path.read_bytes()
    assert [s.key for s in iter_shard(path)] == ["s0", "s1"]  # the whole tar: no damage
    path.write_bytes(whole[:3 * 1024])  # s0's two members and s1.txt: s1.json and the end blocks are gone
    assert [n for n, _ in _tarfile_all(path)] == ["s0.txt", "s0.json", "s1.txt"]  # what the check is for
    names = []
    with pytest.raises(ShardFormatError, match="after sample s0 .*end-of-archive"):
        for s in iter_shard(path):
            names.append(s.key)
    assert names == ["s0"]  # s1 may be cut short: not yielded
