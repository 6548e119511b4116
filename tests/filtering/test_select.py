"""Selection: kept-set precision with oracle/random, tie-breaking, aggregation, re-sharding, key accounting."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from filtering_data import make_corpus, restamp

from halsift.corpus.scores import read_scores_df
from halsift.corpus.shards import iter_samples, read_sizes
from halsift.filtering.detectors.baselines import hash_uniform
from halsift.filtering.scoring.runner import score
from halsift.filtering.selection.select import SelectError, read_kept, select, select_keys
from halsift.launch.cli import main


@pytest.fixture(scope="module")
def world(synth_world, tmp_path_factory):
    """The synthetic corpus scored by oracle and random."""
    d = tmp_path_factory.mktemp("sel")
    corpus = synth_world / "corpus"
    score("oracle", corpus, d / "oracle", show_progress=False)
    score("random:seed=0", corpus, d / "random", show_progress=False)
    return corpus, d


def _truth(corpus):
    rows = []
    for s in iter_samples(corpus):
        for i, x in enumerate(s.meta["sentences"]):
            rows.append((s.key, i, x["label"], x["text"], s.captioner))
    return pd.DataFrame(rows, columns=["key", "sentence_index", "label", "text", "captioner"])


def _prec(labels) -> float:
    """Percentage (0–100) of correct among the correct and incorrect labels."""
    labels = list(labels)
    return 100 * labels.count("correct") / (labels.count("correct") + labels.count("incorrect"))


def test_oracle_keep_02_has_precision_one(world, tmp_path):
    corpus, d = world
    truth = _truth(corpus)
    assert main(["select", "--scores", str(d / "oracle"), "--data", str(corpus), "--out", str(tmp_path / "s"),
                 "--keep", "0.2", "--maxcount", "50", "--no-progress"]) == 0
    m = json.loads((tmp_path / "s" / "manifest.json").read_text())
    n_keep = round(0.2 * len(truth))
    assert m["kept_units"] == n_keep and m["precision"]["kept"] == 100.0 and m["scale"] == 100
    assert m["precision"]["input"] == pytest.approx(_prec(truth["label"]), abs=1e-4)
    assert m["precision"]["input"] < 95 and m["samples_written"] == n_keep
    assert m["threshold_used"] == 100.0
    out = list(iter_samples(tmp_path / "s"))
    assert len(out) == n_keep == sum(read_sizes(tmp_path / "s").values())
    texts = truth.set_index(["key", "sentence_index"])["text"]
    for s in out:
        parent, idx = s.meta["parent_key"], s.meta["sentence_index"]
        assert s.key == f"{parent}_s{idx}" and s.caption == texts[(parent, idx)]
        assert s.meta["sentences"][0]["label"] == "correct" and s.image
    # deterministic tie-breaking: all kept score 100; the lowest hash_uniform(seed, key, index) among them win,
    # so the kept pairs spread over the corpus instead of piling onto the first keys
    correct = truth[truth["label"] == "correct"].copy()
    correct["h"] = [hash_uniform(0, k, i) for k, i in zip(correct["key"], correct["sentence_index"])]
    correct = correct.sort_values("h").head(n_keep).sort_values(["key", "sentence_index"])
    kept = read_kept(tmp_path / "s").to_pandas()
    assert list(zip(kept["key"], kept["sentence_index"])) == list(zip(correct["key"], correct["sentence_index"]))
    by_key_order = truth[truth["label"] == "correct"].sort_values(["key", "sentence_index"]).head(n_keep)
    assert kept["key"].nunique() > 1.5 * by_key_order["key"].nunique()  # spread over images
    per_cap = kept.merge(truth, on=["key", "sentence_index"])["captioner"].value_counts().to_dict()
    assert m["kept_units_per_captioner"] == {c: per_cap.get(c, 0) for c in sorted(truth["captioner"].unique())}


def test_random_keeps_input_rate_within_noise(world, tmp_path):
    corpus, d = world
    truth = _truth(corpus)
    p_in = _prec(truth["label"])
    for name, kw in (("rnd", dict(scores=d / "random")), ("base", dict(scores=d / "oracle", random_baseline=True))):
        m = select(kw["scores"], corpus, tmp_path / name, keep=0.2, show_progress=False,
                   random_baseline=kw.get("random_baseline", False), seed=3)
        n = m["labelled_units"]["kept"]
        sigma = np.sqrt(p_in * (100 - p_in) / n)
        assert abs(m["precision"]["kept"] - p_in) < 4 * sigma, (name, m["precision"], sigma)
        assert m["kept_units"] == round(0.2 * len(truth))
    again = select(d / "oracle", corpus, tmp_path / "base2", keep=0.2, random_baseline=True, seed=3,
                   show_progress=False)
    assert read_kept(tmp_path / "base2").equals(read_kept(tmp_path / "base"))
    assert again["kept_units"] == m["kept_units"]


def _table(rows):
    df = pd.DataFrame(rows, columns=["key", "sentence_index", "score", "captioner"])
    return pa.Table.from_pandas(df.astype({"sentence_index": "int32", "score": "float32"}), preserve_index=False)


def test_caption_aggregation_by_hand():
    t = _table([("a", 0, 90, "x"), ("a", 1, 20, "x"), ("b", 0, 60, "x"), ("b", 1, 50, "x"), ("c", 0, 70, "y")])
    # min: a=20 b=50 c=70 ; mean: a=55 b=55 c=70 ; prob: a=18 b=30 c=70
    kept, info = select_keys(t, top_k=2, unit="caption", agg="min")
    assert kept["key"].to_pylist() == ["b", "c"] and info["threshold_used"] == 50
    kept, info = select_keys(t, top_k=2, unit="caption", agg="mean")
    tie_winner = min("ab", key=lambda k: hash_uniform(0, k, -1))  # tie a/b at 55: the lower hash wins
    assert kept["key"].to_pylist() == sorted([tie_winner, "c"]) and info["threshold_used"] == pytest.approx(55)
    kept, _ = select_keys(t, top_k=1, unit="caption", agg="prob")
    assert kept["key"].to_pylist() == ["c"] and kept["score"][0].as_py() == pytest.approx(70)
    kept, _ = select_keys(t, threshold=25, unit="caption", agg="prob")
    assert kept["key"].to_pylist() == ["b", "c"] and kept["score"][0].as_py() == pytest.approx(30)
    kept, info = select_keys(t, keep=0.5, per_captioner=True)
    assert sorted(zip(kept["key"].to_pylist(), kept["sentence_index"].to_pylist())) == [("a", 0), ("b", 0), ("c", 0)]
    assert info["threshold_used"] == {"x": 60, "y": 70}
    kept, _ = select_keys(t, top_k=3)
    assert kept["key"].to_pylist() == ["a", "b", "c"]


def test_select_argument_errors(tmp_path):
    t = _table([("a", 0, 90, "x")])
    with pytest.raises(SelectError, match="exactly one"):
        select_keys(t, keep=0.2, top_k=3)
    with pytest.raises(SelectError, match="keep=1.5"):
        select_keys(t, keep=1.5)
    with pytest.raises(SelectError, match="caption-level"):
        select_keys(_table([("a", -1, 90, "x")]), keep=0.5)
    data = make_corpus(tmp_path / "c", shards=1, per_shard=3)
    score("oracle", data, tmp_path / "o", show_progress=False)
    base = ["select", "--scores", str(tmp_path / "o"), "--data", str(data), "--no-progress"]
    assert main(base + ["--out", str(tmp_path / "s"), "--keep", "1.5"]) == 2
    assert main(base + ["--out", str(tmp_path / "s"), "--keep", "0.5"]) == 0
    assert main(base + ["--out", str(tmp_path / "s"), "--keep", "0.5"]) == 0  # the same selection: as it is
    assert main(base + ["--out", str(tmp_path / "s"), "--keep", "0.4"]) == 2  # another one: refused
    assert main(base + ["--out", str(tmp_path / "t"), "--keep", "0.5", "--agg", "mean"]) == 2


def test_prune_and_one_sided_keys(tmp_path):
    data = make_corpus(tmp_path / "c", shards=2, per_shard=6, seed=9, corrupt={"s9_00004": "image"})
    out = score("oracle", data, tmp_path / "o", show_progress=False)
    # add a score row for a key that is in no shard (to a listed part: a foreign part file is refused)
    import pyarrow as pa
    import pyarrow.parquet as pq

    from halsift.corpus.scores import scores_table
    first = sorted(out.glob("part-*.parquet"))[0]
    t = pq.read_table(first)
    ghost = scores_table(["ghost"], [0], [100.0], [True], "oracle", {"captioner": ["capA"]})
    pq.write_table(pa.concat_tables([t.select(ghost.column_names), ghost]), first)
    restamp(out)
    m = select(out, data, tmp_path / "p", threshold=60, unit="caption", agg="prune", show_progress=False)
    assert m["keys"]["only_in_shards"] == 1 and m["keys"]["only_in_shards_examples"] == ["s9_00004"]
    assert m["keys"]["only_in_scores"] == 1 and m["keys"]["only_in_scores_examples"] == ["ghost"]
    assert m["precision"]["kept"] == 100.0
    scores = read_scores_df(out)
    for s in iter_samples(tmp_path / "p"):
        src = next(x for x in iter_samples(data) if x.key == s.key)
        keep_idx = sorted(scores[(scores["key"] == s.key) & (scores["score"] >= 60)]["sentence_index"])
        assert s.meta["kept_sentence_indices"] == keep_idx
        assert s.caption == " ".join(src.meta["sentences"][i]["text"] for i in keep_idx)
        assert [x["position"] for x in s.meta["sentences"]] == list(range(len(keep_idx)))


def test_per_captioner_quota_reads_captioners_from_shards_when_scores_lack_them(tmp_path):
    import pyarrow.parquet as pq

    data = make_corpus(tmp_path / "c", shards=2, per_shard=9, seed=11)
    out = score("random:seed=4", data, tmp_path / "o", show_progress=False)
    for p in out.glob("part-*.parquet"):
        pq.write_table(pq.read_table(p).drop_columns(["captioner"]), p)
    restamp(out)
    m = select(out, data, tmp_path / "s", keep=0.3, per_captioner=True, show_progress=False)
    truth = _truth(data)
    want = {c: int(np.floor(0.3 * n + 0.5)) for c, n in truth["captioner"].value_counts().items()}
    assert m["kept_units_per_captioner"] == dict(sorted(want.items()))


def test_whole_caption_selection_reports_the_share_of_correct_sentences_it_kept(world, tmp_path):
    corpus, d = world
    truth = _truth(corpus)
    m = select(d / "oracle", corpus, tmp_path / "w", keep=0.8, unit="caption", agg="mean", show_progress=False)
    kept = {s.key for s in iter_samples(tmp_path / "w")}
    mine = truth[truth["key"].isin(kept)]
    assert m["sentence_precision"]["kept"] == pytest.approx(_prec(mine["label"]), abs=1e-4)
    assert m["sentence_precision"]["input"] == pytest.approx(_prec(truth["label"]), abs=1e-4)
    whole = [s for s in iter_samples(tmp_path / "w")]  # caption-level precision: every sentence correct
    full = sum(all(x["label"] == "correct" for x in s.meta["sentences"]) for s in whole)
    wrong = sum(any(x["label"] == "incorrect" for x in s.meta["sentences"]) for s in whole)
    assert m["precision"]["kept"] == pytest.approx(100 * full / (full + wrong), abs=1e-4)
    assert m["precision"]["kept"] < m["sentence_precision"]["kept"] < 100.0  # mean score keeps some wrong sentences
    from halsift.eval.report.compare import _kept_precision

    assert _kept_precision(m) == m["sentence_precision"]["kept"]  # what the report's "kept precision" states


def test_select_cli_prints_sentence_precision_for_whole_captions_only(world, tmp_path, capsys):
    corpus, d = world
    base = ["select", "--scores", str(d / "oracle"), "--data", str(corpus), "--no-progress"]
    assert main(base + ["--out", str(tmp_path / "w"), "--keep", "0.8", "--unit", "caption", "--agg", "mean"]) == 0
    m = json.loads((tmp_path / "w" / "manifest.json").read_text())
    sp = m["sentence_precision"]
    assert f"(sentences {sp['input']:.1f}% -> {sp['kept']:.1f}%)" in capsys.readouterr().out
    assert main(base + ["--out", str(tmp_path / "s"), "--keep", "0.2"]) == 0
    assert "(sentences" not in capsys.readouterr().out  # sentence units: the two precisions are one
