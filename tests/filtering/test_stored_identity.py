"""Identity of stored derived data (issue 41): what a stage reads back (score parts, stored embeddings) is checked
against the content of the inputs it was made from, and a part altered since it was written is made again."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow.parquet as pq
from filtering_data import make_corpus

from halsift.corpus.embedding_store import embedding_table, part_meta, write_embedding_part
from halsift.corpus.scores import read_scores_df, scores_table, write_part_atomic
from halsift.filtering.scoring.embed import EmbedJob
from halsift.execution.engines import run_job
from halsift.filtering.scoring.part_records import PART_META_KEY
from halsift.filtering.scoring.runner import score
from halsift.launch.cli import main

TINY = "clip:arch=halsift-tiny,pretrained=random,seed=0"


def _swap_pixels(corpus, other, name):
    """Replace shard ``name`` of ``corpus`` with the one of ``other`` (same keys and captions, other images)."""
    shutil.copyfile(other / name, corpus / name)


def test_score_with_embeddings_refuses_a_shard_changed_since_they_were_made(tmp_path, capsys):
    corpus = make_corpus(tmp_path / "c", shards=2, per_shard=3, seed=1)
    emb = tmp_path / "emb"
    assert run_job(EmbedJob(TINY, corpus, emb, batch_size=5, show_progress=False)).complete
    args = ["score", "--detector", TINY, "--data", str(corpus), "--embeddings", str(emb), "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "ok")]) == 0
    capsys.readouterr()
    other = make_corpus(tmp_path / "o", shards=2, per_shard=3, seed=2)
    shard = sorted(corpus.glob("*.tar"))[1]
    _swap_pixels(corpus, other, shard.name)
    assert main([*args, "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(shard) in err and "changed since `halsift embed`" in err
    assert not list((tmp_path / "bad").glob("part-*.parquet"))
    # variant: the stored vectors themselves altered since embed wrote them
    shutil.copyfile(other / shard.name, corpus / shard.name)
    assert run_job(EmbedJob(TINY, corpus, emb, batch_size=5, show_progress=False)).complete  # re-embedded
    part = sorted(emb.glob("part-*.parquet"))[0]
    t = pq.read_table(part)
    write_embedding_part(embedding_table(t["key"].to_pylist(), t["sentence_index"].to_pylist(),
                                         -np.asarray(t["embedding"].to_pylist(), np.float32)), part, part_meta(part))
    assert main([*args, "--out", str(tmp_path / "bad2")]) == 2
    assert "is not the part `halsift embed` wrote" in capsys.readouterr().err


def test_a_rescore_remakes_a_tampered_part_and_one_whose_shard_changed(tmp_path):
    corpus = make_corpus(tmp_path / "c", shards=3, per_shard=3, seed=1)
    out = tmp_path / "s"
    score("random:seed=0", corpus, out, batch_size=4, show_progress=False)
    want = read_scores_df(out).sort_values(["key", "sentence_index"]).reset_index(drop=True)
    # tamper: other scores, the part's own metadata (its fingerprints) kept
    part = sorted(out.glob("part-*.parquet"))[0]
    t = pq.read_table(part)
    bad = scores_table(t["key"].to_pylist(), t["sentence_index"].to_pylist(), [0.0] * len(t),
                       t["parsed"].to_pylist(), t["detector"][0].as_py(), {"captioner": t["captioner"].to_pylist()})
    write_part_atomic(bad.replace_schema_metadata({PART_META_KEY: t.schema.metadata[PART_META_KEY]}), part)
    score("random:seed=0", corpus, out, batch_size=4, show_progress=False)
    m = json.loads((out / "_manifest.json").read_text())
    assert m["parts_resumed"] == 2 and m["status"] == "complete"
    got = read_scores_df(out).sort_values(["key", "sentence_index"]).reset_index(drop=True)
    assert got["score"].tolist() == want["score"].tolist()
    # a shard replaced by another with the same keys: its part is rescored, the others reused
    other = make_corpus(tmp_path / "o", shards=3, per_shard=3, seed=2)
    shard = sorted(corpus.glob("*.tar"))[2]
    _swap_pixels(corpus, other, shard.name)
    score("random:seed=0", corpus, out, batch_size=4, show_progress=False)
    assert json.loads((out / "_manifest.json").read_text())["parts_resumed"] == 2


def test_embed_remakes_a_part_rewritten_with_vectors_of_another_width(tmp_path):
    corpus = make_corpus(tmp_path / "c", shards=2, per_shard=3, seed=1)
    emb = tmp_path / "emb"
    m = run_job(EmbedJob(TINY, corpus, emb, batch_size=5, show_progress=False)).stats
    part = sorted(emb.glob("part-*.parquet"))[0]
    t = pq.read_table(part)
    narrow = embedding_table(t["key"].to_pylist(), t["sentence_index"].to_pylist(),
                             np.ones((len(t), 8), np.float32))
    write_embedding_part(narrow, part, part_meta(part))  # the footer still names the same shard and model
    again = run_job(EmbedJob(TINY, corpus, emb, batch_size=5, show_progress=False)).stats
    assert again["complete"] and again["parts_embedded_this_run"] == 1 and again["parts_resumed"] == 1
    assert pq.read_schema(part).field("embedding").type.list_size == m["dim"]


def test_dedup_reuses_a_hash_part_only_for_the_same_shard_content_and_unaltered(tmp_path):
    import os

    corpus = make_corpus(tmp_path / "c", shards=3, per_shard=3, seed=1)
    args = ["dedup", "--data", str(corpus), "--out", str(tmp_path / "d"), "--no-progress"]
    assert main(args) == 0
    assert main(args) == 0
    assert json.loads((tmp_path / "d" / "manifest.json").read_text())["shards_reused"] == 3
    other = make_corpus(tmp_path / "o", shards=3, per_shard=3, seed=2)
    shard = sorted(corpus.glob("*.tar"))[0]
    st = os.stat(shard)
    _swap_pixels(corpus, other, shard.name)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))  # the old rule (size and mtime) could miss it
    part = sorted((tmp_path / "d" / "_parts").glob("part-*.parquet"))[1]
    t = pq.read_table(part)
    write_part_atomic(t.slice(0, 1), part)  # a part altered since it was written: a sample dropped
    assert main(args) == 0
    assert json.loads((tmp_path / "d" / "manifest.json").read_text())["shards_reused"] == 1
    assert len(pq.read_table(part)) == len(t)


def test_a_selection_setting_absent_from_an_older_record_equals_only_its_default(tmp_path, capsys):
    corpus = make_corpus(tmp_path / "c", shards=2, per_shard=3, seed=1)
    score("random:seed=0", corpus, tmp_path / "s", batch_size=4, show_progress=False)
    args = ["select", "--scores", str(tmp_path / "s"), "--data", str(corpus), "--out", str(tmp_path / "sel"),
            "--keep", "0.5", "--no-progress"]
    assert main(args) == 0
    state = tmp_path / "sel" / "_select" / "filter.json"
    filt = json.loads(state.read_text())
    assert filt["per_captioner"] is False and filt["keys_only"] is False
    older = {k: v for k, v in filt.items() if k not in ("per_captioner", "keys_only")}  # made before they existed
    state.write_text(json.dumps(older))
    capsys.readouterr()
    assert main(args) == 0  # the same selection: its manifest as it is, not refused
    assert main([*args, "--per-captioner"]) == 2  # not the default: another selection
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds a selection with a different per_captioner (None vs True)" in err


def test_dedup_never_overwrites_another_stages_manifest(tmp_path, capsys):
    corpus = make_corpus(tmp_path / "c", shards=1, per_shard=3, seed=1)
    sel = tmp_path / "sel"
    sel.mkdir()
    (sel / "manifest.json").write_text(json.dumps({"status": "complete", "filter": {"keep": 0.2}}))
    before = (sel / "manifest.json").read_bytes()
    assert main(["dedup", "--data", str(corpus), "--out", str(sel), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(sel) in err and "format" in err
    assert (sel / "manifest.json").read_bytes() == before and not (sel / "_parts").exists()
    assert main(["dedup", "--data", str(corpus), "--out", str(tmp_path / "d"), "--no-progress"]) == 0
    assert main(["dedup", "--data", str(corpus), "--out", str(tmp_path / "d"), "--no-progress"]) == 0  # its own
