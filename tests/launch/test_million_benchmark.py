"""benchmarks/million.py: the corpus it builds keeps distinct keys apart under dedup's tests and plants copies dedup
must find; its smoke run (``--samples 2000 --check``) runs every stage as its own process and reports each."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _million():
    if "halsift_bench_million" not in sys.modules:  # registered first: its dataclasses look their module up
        spec = importlib.util.spec_from_file_location("halsift_bench_million", ROOT / "benchmarks" / "million.py")
        sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules["halsift_bench_million"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = tmp_path_factory.mktemp("million-world")
    _million().make_world(out, pool=8, retrieval=20, seed=0)
    return out


def test_plan_puts_each_copy_after_its_original():
    m = _million()
    plan = m.make_plan(1000, 10, 20, seed=3)
    for copies in (plan.exact, plan.near):
        assert len(copies) == 10 and all(o < 500 <= p for p, o in copies.items())
    assert len(plan.leaks) == 10 and len(set(plan.leaks.values())) == 10 and min(plan.leaks) >= 500
    positions = [*plan.exact, *plan.near, *plan.leaks]
    originals = [*plan.exact.values(), *plan.near.values()]
    assert len(set(positions)) == 30 and not set(positions) & set(originals)


def test_keys_sharing_a_pool_image_are_not_near_duplicates_but_planted_copies_are(world):
    """dedup's own descriptors: distinct keys (8 per pool image here) fail its near test (phash <= 4 bits and
    thumbnail cosine >= 0.97); the planted near copy passes it and the exact copy has the same bytes."""
    from PIL import Image

    from halsift.filtering.curation.descriptors import phash_bytes, thumb_vectors, thumbnail

    m = _million()
    pool = m.Pool(world, 64)
    plan = m.Plan(80, exact={79: 3}, near={78: 5}, leaks={})
    data = [m.image_of(pool, plan, 0, i) for i in range(80)]
    imgs = [Image.open(io.BytesIO(d)) for d in data]
    bits = np.unpackbits(np.stack([np.frombuffer(phash_bytes(im), np.uint8) for im in imgs]), axis=1)
    vec = thumb_vectors(np.stack([np.frombuffer(thumbnail(im), np.uint8) for im in imgs]))
    dist = (bits[:, None, :] != bits[None, :, :]).sum(2)
    cos = vec @ vec.T
    near = (dist <= 4) & (cos >= 0.97)
    np.fill_diagonal(near, False)
    pairs = {tuple(sorted(p)) for p in zip(*np.nonzero(near))}
    assert data[79] == data[3]
    assert pairs == {(3, 79), (5, 78)}


def test_check_dedup_needs_exactly_the_planted_rows(tmp_path):
    m = _million()
    plan = m.Plan(100, exact={60: 1}, near={70: 2}, leaks={80: 0})
    retrieval = [("images/r000000.png", None)]
    rows = {"key": ["m00000060", "m00000070", "m00000080"], "matched": ["m00000001", "m00000002", retrieval[0][0]],
            "reason": ["exact", "near", "eval"]}
    pq.write_table(pa.table(rows), tmp_path / "duplicates.parquet")
    assert m.check_dedup(tmp_path, plan, retrieval)["all_found_exactly"]
    extra = {k: [*v, x] for (k, v), x in zip(rows.items(), ["m00000090", "m00000091", "near"])}
    pq.write_table(pa.table(extra), tmp_path / "duplicates.parquet")
    got = m.check_dedup(tmp_path, plan, retrieval)
    assert not got["all_found_exactly"] and got["other_listed"] == 1
    wrong = {**rows, "matched": ["m00000009", *rows["matched"][1:]]}  # the exact copy paired with another key
    pq.write_table(pa.table(wrong), tmp_path / "duplicates.parquet")
    got = m.check_dedup(tmp_path, plan, retrieval)
    assert not got["all_found_exactly"] and got["exact"]["matched"] == 0


@pytest.mark.slow  # ~35 CPU s; 115-216 s wall on the shared 2-core machine (load 6-15)
def test_smoke_run_reports_every_stage_and_finds_the_planted_copies(tmp_path):
    out = tmp_path / "million.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "million.py"), "--samples", "2000", "--check",
                        "--json", str(out), "--work", str(tmp_path / "work"), "--keep-work"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["stages"] == ["basic", "dedup", "score", "select", "report"] and doc["growth"] is None
    (size,) = doc["sizes"]
    assert size["samples"] == 2000 and list(size["stages"]) == doc["stages"]
    for name, stage in size["stages"].items():
        procs = stage["processes"]
        assert len(procs) == (2 if name == "score" else 1)
        assert all(p["rc"] == 0 and p["peak_rss_mb"] > 0 and p["wall_s"] > 0 for p in procs)
        assert stage["peak_rss_mb"] == max(p["peak_rss_mb"] for p in procs)
    assert [p["argv"].split()[-1] for p in size["stages"]["score"]["processes"]] == ["0", "1"]
    planted = size["planted_each"]
    dedup = size["dedup"]
    assert dedup["all_found_exactly"] and dedup["other_listed"] == 0
    for reason in ("exact", "near", "eval"):
        assert dedup[reason] == {"planted": planted, "found": planted, "matched": planted}
    # dedup's own manifest agrees with the planted counts
    manifest = json.loads((tmp_path / "work" / "n2000" / "dedup" / "manifest.json").read_text())
    assert manifest["samples"] == 2000 and manifest["counts"] == {"exact": planted, "near": planted, "eval": planted}
    kept = size["kept"]
    assert kept["kept_units"] == int(np.floor(0.2 * kept["candidates"] + 0.5))
    assert 0 < kept["html_thumbnails"] <= 2000
    assert "N=2000" in r.stdout and "dedup found/planted: exact" in r.stdout
    inside = size["inside"]
    assert 2 * 2000 <= inside["score_items"] <= 4 * 2000  # 2-4 sentences a caption, each scored
    assert kept["candidates"] < inside["score_items"]  # dedup's list and DataComp's size rule removed some
    assert inside["dedup_pairs"]["exact"] == planted
