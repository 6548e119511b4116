"""The run-folder rules every stage shares (execution/run_folder.py): identity compared key by key (a setting absent
from an old record equals only its default), parts hashed whole when written and verified when reused, a run
stopped by an error left ``failed`` with its reason, and the whole-file fingerprint opt-in."""

from __future__ import annotations

import json
import os

import pytest

from halsift.corpus.fingerprint import file_fingerprint, refingerprint
from halsift.execution.run_folder import (RunFolderError, check_or_start, failing, part_done, part_reusable,
                                       settings_diff)


def test_a_setting_absent_from_an_old_record_equals_only_its_default():
    defaults = {"a": 1, "b": None}
    assert settings_diff({}, {"a": 1, "b": None}, defaults) is None  # new settings at their defaults: same run
    assert settings_diff({}, {"a": 2}, defaults) == "a"  # a changed default (or value) re-runs
    assert settings_diff({"a": 1}, {"a": 1, "c": 0}, defaults) == "c"  # no default known: never equal
    assert settings_diff({"a": 3}, {"a": 3, "b": None}, defaults) is None
    assert settings_diff({"a": 1, "b": 5}, {"a": 1, "b": None}, defaults) == "b"  # recorded values are compared


def test_check_or_start_refuses_another_run_in_one_line_naming_folder_and_key(tmp_path):
    ident = {"detector": "x", "settings": {"unit": "sentence"}}
    check_or_start(tmp_path / "f", ident, keys=("detector",), what="scores")
    assert json.loads((tmp_path / "f" / "_manifest.json").read_text())["status"] == "running"
    check_or_start(tmp_path / "f", ident, keys=("detector",), what="scores")  # the same run: resumes
    for other, key in (({**ident, "detector": "y"}, "detector"), ({**ident, "settings": {"unit": "caption"}}, "unit")):
        with pytest.raises(RunFolderError, match="holds scores with a different") as e:
            check_or_start(tmp_path / "f", other, keys=("detector",), what="scores")
        line = str(e.value)
        assert "\n" not in line and line.startswith(str(tmp_path / "f")) and f"a different {key} (" in line
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "part-a.parquet").write_bytes(b"x")
    with pytest.raises(RunFolderError, match="holds parts but no _manifest.json"):
        check_or_start(tmp_path / "g", ident, keys=("detector",), what="scores")
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "_manifest.json").write_text("[1]")
    with pytest.raises(RunFolderError, match="not a JSON object"):
        check_or_start(tmp_path / "h", ident, keys=("detector",), what="scores")


def test_a_part_is_reused_only_unaltered_and_made_from_the_same_inputs(tmp_path):
    part = tmp_path / "part-a.parquet"
    part.write_bytes(b"0123456789" * 100)
    made = {"source_fp": {"hash": "s"}, "detector_fp": "d"}
    assert not part_reusable(tmp_path, part.name, made)  # no record, no legacy rule: made again
    assert part_reusable(tmp_path, part.name, made, legacy=lambda p: True)  # an older folder's own rule
    part_done(tmp_path, part.name, made)
    assert part_reusable(tmp_path, part.name, made)
    assert not part_reusable(tmp_path, part.name, {**made, "detector_fp": "other"})
    assert not part_reusable(tmp_path, part.name, {**made, "source_fp": {"hash": "t"}})
    st = os.stat(part)
    part.write_bytes(b"0123456789" * 99 + b"012345678X")  # same size, same mtime, one byte changed
    os.utime(part, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert not part_reusable(tmp_path, part.name, made)
    part.write_bytes(b"0123456789" * 101)  # another size
    assert not part_reusable(tmp_path, part.name, made)
    part.unlink()
    assert not part_reusable(tmp_path, part.name, made)


def test_a_run_stopped_by_an_error_is_left_failed_with_its_reason(tmp_path):
    check_or_start(tmp_path, {"detector": "x"}, keys=("detector",), what="scores")
    with pytest.raises(ValueError, match="boom"):
        with failing(tmp_path):
            raise ValueError("boom: the first line\nmore")
    m = json.loads((tmp_path / "_manifest.json").read_text())
    assert m["status"] == "failed" and m["error"] == "boom: the first line" and m["detector"] == "x"
    # an interrupted run (a kill, Ctrl-C) stays running, to be resumed: its record is left as it was
    other = tmp_path / "other"
    check_or_start(other, {"detector": "x"}, keys=("detector",), what="scores")
    before = (other / "_manifest.json").read_text()
    with pytest.raises(KeyboardInterrupt, match="^$"):
        with failing(other):
            raise KeyboardInterrupt
    assert (other / "_manifest.json").read_text() == before and json.loads(before)["status"] == "running"
    # a folder with no record is given none (a run stopped before it started leaves nothing to read)
    with pytest.raises(ValueError, match="^early$"):
        with failing(tmp_path / "empty"):
            raise ValueError("early")
    assert not (tmp_path / "empty" / "_manifest.json").exists()


def test_full_hash_sees_a_change_the_sampled_blocks_miss(tmp_path):
    f = tmp_path / "big.tar"
    data = bytearray(os.urandom(3 << 20))
    f.write_bytes(bytes(data))
    sampled, full = file_fingerprint(f), file_fingerprint(f, full=True)
    assert "full" not in sampled and full["full"] is True and full["size"] == sampled["size"]
    st = os.stat(f)
    data[(3 << 20) // 17 + 5000] ^= 0xFF  # between two sampled blocks
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert file_fingerprint(f) == sampled  # the default, on purpose cheap: blind to it
    assert refingerprint(f, full)["hash"] != full["hash"]  # the opt-in sees it
    small = tmp_path / "small.tar"
    small.write_bytes(b"abc")
    assert file_fingerprint(small, full=True) == file_fingerprint(small)  # small files: hashed whole either way


def test_an_owned_folder_stopped_on_the_way_keeps_its_checkpoints(tmp_path):
    """A recipe's fine-tuning run or trained detector (a folder owned whole): its record is started before the
    training, so a run killed mid-training keeps its checkpoints for the rerun's resume; a folder made from
    something else (or holding no record) is emptied."""
    from halsift.execution.run_folder import clear_unless, made

    run, ident = tmp_path / "run", {"settings": {"lr": 1e-4}, "data": "sel-1"}
    (run / "checkpoints").mkdir(parents=True)  # a folder with no record: made by something else
    (run / "checkpoints" / "stale.pt").write_bytes(b"x")
    assert not clear_unless(run, ident) and not (run / "checkpoints").exists()
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "step-100.pt").write_bytes(b"x")  # ... killed here, before `made`
    assert clear_unless(run, ident) and (run / "checkpoints" / "step-100.pt").is_file()  # resumed, not wiped
    made(run, ident)
    assert clear_unless(run, ident)
    assert not clear_unless(run, {**ident, "data": "sel-2"}) and not (run / "checkpoints").exists()


def test_a_part_just_recorded_is_not_hashed_again_to_be_found_done(tmp_path, monkeypatch):
    """Every engine checks that each part is done before it finishes the folder: the part this process has just
    hashed for its record is not read again (a corpus copy's shards are whole tar files), until it changes."""
    from halsift.corpus import records

    hashed = []
    real = records.file_fingerprint
    monkeypatch.setattr(records, "file_fingerprint", lambda p, full=False: hashed.append(p) or real(p, full))
    part = tmp_path / "part-0.parquet"
    part.write_bytes(b"rows")
    part_done(tmp_path, part.name, {"source_fp": "s"})
    assert part_reusable(tmp_path, part.name, {"source_fp": "s"}) and len(hashed) == 1
    part.write_bytes(b"rowz")  # same size, other content: hashed again, and refused
    assert not part_reusable(tmp_path, part.name, {"source_fp": "s"}) and len(hashed) == 2
