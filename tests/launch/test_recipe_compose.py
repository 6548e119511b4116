"""A recipe's select.where over its own detectors' names and halsift basic's fields (computed once into the run
folder when the expression names them); a selection made with another where is not reused."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
from filtering_data import make_corpus

from halsift.corpus.config import from_dict
from halsift.corpus.scores import read_scores_df
from halsift.corpus.shards import iter_samples
from halsift.filtering.scoring.runner import score
from halsift.launch.recipe_config import Recipe
from halsift.launch.stages import resolve_paths
from halsift.launch.stages.select import stage_select


def test_recipe_where_with_basic_fields(tmp_path, monkeypatch):
    from halsift.filtering.curation import language

    # every language's models take ~40 s to load here; two languages do for these English captions
    monkeypatch.setattr(language, "make_detector", lambda: language.LanguageDetector(["en", "de"]))
    corpus = make_corpus(tmp_path / "corpus", shards=2, per_shard=6)
    where = "judge >= 50 and chars > 60"

    def recipe(w):
        return from_dict(Recipe, {"run_dir": str(tmp_path / "run"), "data": {"corpus": str(corpus)},
                                  "score": {"detectors": {"judge": "oracle", "clip": "random:seed=1"}},
                                  "select": {"keep": 1.0, "where": w}, "dedup": {"enabled": False},
                                  "wandb": {"mode": "disabled"}})

    r = recipe(where)
    p = resolve_paths(r)
    for name, spec in r.score.detectors.items():
        score(spec, corpus, p.named("score", name) / "corpus", show_progress=False)
    long_keys = {s.key for s in iter_samples(corpus) if len(s.caption) > 60}
    info = stage_select(r, p)["selections"]
    assert (p.run / "basic" / "corpus" / "manifest.json").exists()
    for name in ("judge", "clip"):
        j = read_scores_df(p.named("score", "judge") / "corpus")
        want = {(k, i) for k, i, s in zip(j["key"], j["sentence_index"], j["score"]) if s >= 50 and k in long_keys}
        kept = pq.read_table(p.named("select", name) / "kept.parquet").to_pandas()
        assert set(zip(kept["key"], kept["sentence_index"])) == want and 0 < len(want)
        assert info[name]["composition"]["where"] == where
    mtime = (p.named("select", "judge") / "manifest.json").stat().st_mtime_ns
    assert stage_select(r, p)["selections"]["judge"]["kept_units"] == len(want)  # reused as it is
    assert (p.named("select", "judge") / "manifest.json").stat().st_mtime_ns == mtime
    info = stage_select(recipe("judge >= 50"), p)["selections"]  # another where: selected again
    m = json.loads((p.named("select", "judge") / "manifest.json").read_text())
    assert m["filter"]["compose"]["where"] == "judge >= 50" and info["judge"]["kept_units"] > len(want)
