"""End-to-end `evaluate_bench` / `halsift eval bench`: oracle and random scores, report rendering, degenerate inputs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from sklearn.metrics import roc_auc_score

from halsift.corpus.bench import TYPES, read_bench, write_bench
from halsift.corpus.scores import scores_table, write_part_atomic
from halsift.eval.runs.bench_eval import evaluate_bench
from halsift.eval.metrics.detection import MetricError
from halsift.launch.cli import main

HAVE_SYNTH = importlib.util.find_spec("halsift.synth.world") is not None
I2T, T2I = ("cap_a", "cap_b", "cap_c"), ("gen_x", "gen_y")


def make_bench(path: Path, images: int = 40, seed: int = 0, one_class: str | None = None,
               counts: bool = False) -> Path:
    """A hand-made bench: i2t generators caption shared images, t2i generators own their images."""
    rng = np.random.default_rng(seed)
    rows = []
    words = "a small red bird sits on the old wooden fence near two tall green trees".split()
    for gen in I2T + T2I:
        gtype = "i2t" if gen in I2T else "t2i"
        for i in range(images):
            image_id = f"img{i}" if gtype == "i2t" else f"{gen}_img{i}"
            n_sent = int(rng.integers(2, 6))
            sents = [" ".join(rng.choice(words, int(rng.integers(4, 9)))) + "." for _ in range(n_sent)]
            for p, s in enumerate(sents):
                label = rng.choice(["correct", "incorrect", "unknown"], p=[0.65, 0.3, 0.05])
                if gen == one_class:
                    label = "correct"
                n_words = len(s.split())
                start = int(rng.integers(0, n_words - 1))
                inc = label == "incorrect"
                row = {"id": f"{gen}-{i}-{p}", "image": f"images/{image_id}.png", "image_id": image_id,
                       "generator": gen, "generator_type": gtype, "domain": "synthetic",
                       "caption_id": f"{gen}-{i}", "position": p, "sentence": s, "caption": " ".join(sents),
                       "label": str(label), "types": [str(rng.choice(TYPES))] if inc else [],
                       "spans": [[start, start + int(rng.integers(1, 3))]] if inc else [], "split": "test"}
                if counts:
                    c = rng.multinomial(3, [0.6, 0.3, 0.1] if label == "correct" else [0.3, 0.6, 0.1])
                    row.update(n_correct=int(c[0]), n_incorrect=int(c[1]), n_unknown=int(c[2]))
                rows.append(row)
    write_bench(path, rows)
    return path


@pytest.fixture(scope="module")
def bench(tmp_path_factory, request) -> Path:
    """The synthetic world's bench when the synth module exists, else a hand-made one."""
    if HAVE_SYNTH:
        world = request.getfixturevalue("synth_world")
        return Path(world) / "bench" / "bench.jsonl"
    return make_bench(tmp_path_factory.mktemp("bench") / "bench.jsonl")


def bench_df(path: Path) -> pd.DataFrame:
    return pd.DataFrame([r.to_json() for r in read_bench(path)])


def score_frame(df: pd.DataFrame, score, parsed=True) -> pd.DataFrame:
    return pd.DataFrame({"key": df["id"], "sentence_index": df["position"], "score": score, "parsed": parsed})


def oracle(df: pd.DataFrame) -> pd.DataFrame:
    return score_frame(df, np.where(df["label"] == "correct", 100.0, 0.0))


def random_scores(df: pd.DataFrame, seed: int = 1) -> pd.DataFrame:
    return score_frame(df, np.random.default_rng(seed).uniform(0, 100, len(df)))


def noisy(df: pd.DataFrame, seed: int, noise: float = 60.0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return score_frame(df, np.clip(np.where(df["label"] == "correct", 65.0, 35.0) + rng.normal(0, noise, len(df)),
                                   0, 100))


def test_oracle_100_random_50(bench, tmp_path):
    df = bench_df(bench)
    m = evaluate_bench(bench, {"oracle": oracle(df), "random": random_scores(df)}, tmp_path, n_boot=300)
    gens = sorted(df["generator"].unique())
    for g in gens:
        assert m[f"oracle/auroc/{g}"] == pytest.approx(100.0)
    assert m["oracle/auroc/mean"] == pytest.approx(100.0)
    assert m["random/auroc_lo/mean"] <= 50.0 <= m["random/auroc_hi/mean"]
    assert abs(m["random/auroc/mean"] - 50.0) < 8
    # independent per-generator check of the random detector with sklearn
    rnd = random_scores(df)
    lab = df["label"] != "unknown"
    for g in gens:
        sel = lab & (df["generator"] == g)
        want = 100 * roc_auc_score(df.loc[sel, "label"] == "correct", rnd.loc[sel, "score"])
        assert m[f"random/auroc/{g}"] == pytest.approx(want)
        assert m[f"random/auroc_lo/{g}"] <= m[f"random/auroc/{g}"] <= m[f"random/auroc_hi/{g}"]
    # oracle keeps only correct sentences in its top 20% wherever the base rate allows it
    base = df[lab].groupby("generator")["label"].apply(lambda s: (s == "correct").mean())
    for g in gens:
        if base[g] >= 0.2:
            assert m[f"oracle/precision@0.2/{g}"] == 100.0
        assert m[f"oracle/base_rate/{g}"] == pytest.approx(100 * base[g])


def test_report_renders_every_generator_and_plot(bench, tmp_path):
    df = bench_df(bench)
    gens = sorted(df["generator"].unique())
    i2t = sorted(df.loc[df["generator_type"] == "i2t", "generator"].unique())
    a, b = noisy(df, 2), noisy(df, 3)
    mapping = {"detA": i2t[0], "detB": i2t[1]}
    m = evaluate_bench(bench, {"detA": a, "detB": b}, tmp_path, n_boot=200, self_pref_map=mapping,
                       ensembles=["detA+detB"])
    report = (tmp_path / "report.md").read_text()
    for g in gens:
        assert report.count(g) >= 3, g  # Table 3, precision table, ensemble table
    for head in ("(Table 3)", "(Table 6)", "Self-preference", "Fig. 9", "Fig. 7"):
        assert head in report
    pngs = sorted((tmp_path / "plots").glob("*.png"))
    assert {p.name for p in pngs} == {"auroc_per_generator.png", "position.png", "types.png", "score_hist.png",
                                      "precision.png", "self_preference.png"}
    for p in pngs:
        with Image.open(p) as im:
            im.verify()
        assert f"plots/{p.name}" in report
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics == pytest.approx(m)
    assert all(np.isfinite(v) for v in metrics.values())
    # ensemble = mean of the members, gain over the better member
    ens = (a["score"] + b["score"]) / 2
    lab = df["label"] != "unknown"
    for g in gens:
        sel = lab & (df["generator"] == g)
        want = 100 * roc_auc_score(df.loc[sel, "label"] == "correct", ens[sel])
        assert m[f"detA+detB/auroc/{g}"] == pytest.approx(want)
        gain = want - max(m[f"detA/auroc/{g}"], m[f"detB/auroc/{g}"])
        assert m[f"detA+detB/auroc_gain/{g}"] == pytest.approx(gain)
    # self-preference: row-normalised AUROC
    for d, own in mapping.items():
        row = [m[f"{d}/auroc/{g}"] for g in mapping.values()]
        assert m[f"self_preference/{d}/{own}"] == pytest.approx(m[f"{d}/auroc/{own}"] / np.mean(row))


def test_single_detector_keys_and_failures(tmp_path):
    path = make_bench(tmp_path / "b" / "bench.jsonl", images=12, counts=True)
    df = bench_df(path)
    s = noisy(df, 4)
    s["parsed"] = np.arange(len(s)) % 10 != 0  # 10% parse failures
    m = evaluate_bench(path, {"judge": s}, tmp_path / "out", n_boot=100)
    assert "auroc/mean" in m and "auroc/i2t" in m and "auroc/t2i" in m
    assert m["failure_rate"] == pytest.approx(100 * (1 - s["parsed"].mean()))
    assert m["failure_rate/judge"] == m["failure_rate"]
    assert "agreement/kappa" in m
    report = (tmp_path / "out" / "report.md").read_text()
    assert "exceeds 5%" in report


def test_one_class_generator_is_na_with_reason(tmp_path):
    path = make_bench(tmp_path / "bench.jsonl", images=10, one_class="gen_y")
    df = bench_df(path)
    m = evaluate_bench(path, {"judge": noisy(df, 5)}, tmp_path / "out", n_boot=100, plots=False)
    assert "auroc/gen_y" not in m and "auroc/gen_x" in m
    others = [m[f"auroc/{g}"] for g in I2T + ("gen_x",)]
    assert m["auroc/mean"] == pytest.approx(np.mean(others))
    report = (tmp_path / "out" / "report.md").read_text()
    assert "gen_y: AUROC n/a, only one class" in report
    assert "nan" not in report.lower()


def test_missing_scores_counted_and_none_is_error(tmp_path):
    path = make_bench(tmp_path / "bench.jsonl", images=10)
    df = bench_df(path)
    s = noisy(df, 6).iloc[: len(df) - 7]
    m = evaluate_bench(path, {"judge": s}, tmp_path / "out", n_boot=100, plots=False)
    assert m["n_missing"] == 7 and m["n_scored"] == len(df) - 7
    assert "7 of" in (tmp_path / "out" / "report.md").read_text()
    bad = s.assign(key="nope-" + s["key"])
    with pytest.raises(MetricError, match="none of the .* bench rows has a score"):
        evaluate_bench(path, {"judge": bad}, tmp_path / "out2", n_boot=100, plots=False)


def test_empty_bench_is_clear_error(tmp_path):
    p = tmp_path / "bench.jsonl"
    p.write_text("")
    with pytest.raises(MetricError, match="no rows"):
        evaluate_bench(p, {"x": pd.DataFrame({"key": [], "sentence_index": [], "score": []})}, tmp_path / "o")


def test_localization_from_outputs(tmp_path):
    path = make_bench(tmp_path / "bench.jsonl", images=8)
    df = bench_df(path)
    # a judge that marks exactly the ground-truth span on every incorrect sentence: AP = mIoU = 100
    outs = []
    for sent, spans in zip(df["sentence"], df["spans"]):
        w = sent.split()
        for s, e in reversed(spans):
            w[s:e] = ["**[" + " ".join(w[s:e]) + "]**"]
        outs.append('```json\n' + json.dumps({"output": " ".join(w)}) + '\n```')
    s = noisy(df, 7).assign(output=outs)
    m = evaluate_bench(path, {"judge": s}, tmp_path / "out", n_boot=100, plots=False)
    assert m["localization/ap"] == pytest.approx(100.0)
    assert m["localization/miou"] == pytest.approx(100.0)
    assert "(Table 5)" in (tmp_path / "out" / "report.md").read_text()


def test_cli_scores_dirs(tmp_path):
    path = make_bench(tmp_path / "bench.jsonl", images=10)
    df = bench_df(path)
    dirs = []
    for name, frame in (("oracle", oracle(df)), ("random", random_scores(df))):
        d = tmp_path / name
        d.mkdir()
        t = scores_table(frame["key"], frame["sentence_index"], frame["score"], frame["parsed"], name)
        write_part_atomic(t, d / "part-000000.parquet")
        dirs.append(str(d))
    out = tmp_path / "out"
    rc = main(["eval", "bench", "--bench", str(path), "--scores", *dirs, "--out", str(out), "--ensemble",
               "oracle+random", "--self-preference", "oracle=cap_a", "random=cap_b", "--n-boot", "100"])
    assert rc == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["oracle/auroc/mean"] == pytest.approx(100.0)
    assert "self_preference/oracle/cap_a" in m
    assert main(["eval", "bench", "--bench", str(path), "--scores", dirs[0], "--out", str(out),
                 "--self-preference", "oracle"]) == 2
    assert main(["eval", "bench", "--bench", str(path), "--out", str(out)]) == 2
    assert main(["eval", "bench", "--bench", str(tmp_path / "missing.jsonl"), "--scores", dirs[0],
                 "--out", str(out)]) == 2


def test_cli_detector_calls_runner(tmp_path, monkeypatch):
    """`--detector SPEC` loads the spec and scores the bench through filtering.scoring.runner.score_bench."""
    import sys
    import types

    import halsift.filtering.detectors.spec as spec_mod

    path = make_bench(tmp_path / "bench.jsonl", images=8)
    df = bench_df(path)
    calls = []

    class Fake:
        name = "fake-oracle"

    def score_bench(detector, bench_path, out_dir):
        calls.append((detector.name, str(bench_path), Path(out_dir)))
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        f = oracle(df)
        write_part_atomic(scores_table(f["key"], f["sentence_index"], f["score"], f["parsed"], detector.name),
                          Path(out_dir) / "part-bench.parquet")
        return Path(out_dir)

    monkeypatch.setattr(spec_mod, "load_detector", lambda s: Fake())
    monkeypatch.setitem(sys.modules, "halsift.filtering.scoring.runner", types.SimpleNamespace(score_bench=score_bench))
    out = tmp_path / "out"
    assert main(["eval", "bench", "--bench", str(path), "--detector", "oracle", "--out", str(out),
                 "--n-boot", "50", "--no-plots"]) == 0
    assert calls == [("fake-oracle", str(path), out / "scores" / "fake-oracle")]
    assert json.loads((out / "metrics.json").read_text())["auroc/mean"] == pytest.approx(100.0)


def test_bench_and_recipe_ensembles_use_the_ensemble_detectors_combine(tmp_path):
    """One ensemble implementation: the bench's ``A+B`` rows and the recipe's ensemble score folder hold
    :func:`halsift.filtering.detectors.ensemble.combine` (equal weights, norm none) of the members' scores, on the rows every
    member scored; with two members that is exactly the float32 mean the recipe always wrote."""
    from halsift.corpus.scores import read_scores_df
    from halsift.eval.metrics.detection import ensemble_scores
    from halsift.filtering.detectors.ensemble import combine
    from halsift.launch.stages.score import write_ensemble

    rng = np.random.default_rng(3)
    members = [rng.uniform(0, 100, 40).astype(np.float32) for _ in range(2)]
    assert np.array_equal(ensemble_scores(members), combine(np.vstack(members), [1, 1], "none"))
    dirs = []
    for i, s in enumerate(members):
        d = tmp_path / f"m{i}"
        d.mkdir()
        keep = slice(i, 40)  # member 1 lacks row 0: the ensemble covers rows both scored
        write_part_atomic(scores_table([f"k{j:02d}" for j in range(40)][keep], [0] * (40 - i), s[keep],
                                       [j % 7 != i for j in range(40)][keep], f"m{i}"), d / "part-0.parquet")
        dirs.append(d)
    write_ensemble("m0+m1", dirs, tmp_path / "ens")
    got = read_scores_df(tmp_path / "ens").sort_values("key").reset_index(drop=True)
    assert got["key"].tolist() == [f"k{j:02d}" for j in range(1, 40)]
    want = pd.DataFrame({"a": members[0][1:], "b": members[1][1:]}).mean(axis=1).to_numpy(np.float32)
    assert np.array_equal(got["score"].to_numpy(np.float32), want)
    assert np.array_equal(got["score"].to_numpy(np.float32),
                          combine(np.vstack([m[1:] for m in members]), [1, 1], "none").astype(np.float32))
    assert got["parsed"].tolist() == [j % 7 not in (0, 1) for j in range(1, 40)]
