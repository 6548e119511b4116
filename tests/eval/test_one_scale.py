"""One scale for every percentage a user reads (issue 30): a tiny select, ``eval bench`` on the same sentences and
the compare report state the same kept precision on 0–100 in the manifest, the summary line, metrics.json and
report.md; a select manifest of an earlier halsift (shares, 0–1, no ``scale``) is read as the same percentages."""

from __future__ import annotations

import contextlib
import io
import json
import random
import shutil
from pathlib import Path

import pytest
from filtering_data import png

from halsift.corpus.bench import write_bench
from halsift.corpus.scores import read_scores_df
from halsift.corpus.shards import Sample, ShardWriter
from halsift.filtering.scoring.runner import score
from halsift.filtering.selection.manifest_scale import on_percent_scale
from halsift.launch.cli import main
from halsift.launch.run_wandb import select_metrics

N, KEEP, GEN, SET = 40, 0.2, "capA", "synthetic"


def _corpus(out: Path) -> tuple[Path, Path, dict[str, str]]:
    """``N`` one-sentence samples of one captioner (every sentence labelled) and the same sentences as a bench
    (row id = sample key, position 0), so the bench's top ``KEEP`` share is the selection's kept set."""
    rng = random.Random(7)
    labels = {f"k{i:03d}": ("correct" if rng.random() < 0.6 else "incorrect") for i in range(N)}
    rows = []
    (out / "bench" / "images").mkdir(parents=True)
    with ShardWriter(out / "corpus", maxcount=20) as w:
        for i, (key, label) in enumerate(labels.items()):
            text, image = f"A red car number {i}.", png(rng)
            w.write(Sample(key, image, text, {"captioner": GEN, "source": "i2t", "image_id": f"img{i}",
                                              "sentences": [{"text": text, "position": 0, "label": label}]}, "png"))
            (out / "bench" / "images" / f"{key}.png").write_bytes(image)
            rows.append({"id": key, "image": f"images/{key}.png", "image_id": f"img{i}", "generator": GEN,
                         "generator_type": "i2t", "domain": "synthetic", "caption_id": key, "position": 0,
                         "sentence": text, "caption": text, "label": label})
    write_bench(out / "bench" / "bench.jsonl", rows)
    return out / "corpus", out / "bench" / "bench.jsonl", labels


def _expected(scores: Path, labels: dict[str, str]) -> tuple[float, float]:
    """By hand: % correct of all sentences, and of the top ``KEEP`` share by score."""
    df = read_scores_df(scores).sort_values("score", ascending=False)
    k = round(KEEP * N)
    assert df["score"].iloc[k - 1] > df["score"].iloc[k]  # no tie at the cut: one kept set for every rule
    correct = [labels[key] == "correct" for key in df["key"]]
    return 100 * sum(correct) / N, 100 * sum(correct[:k]) / k


def _table_cell(markdown: str, row: str, column: str) -> str:
    """The cell of a markdown table in ``markdown`` at (first cell ``row``, header ``column``)."""
    lines = markdown.splitlines()
    for i, line in enumerate(lines[:-1]):
        head = [c.strip() for c in line.strip("|").split("|")]
        if not (line.startswith("|") and set(lines[i + 1]) <= set("|-: ") and column in head):
            continue
        for body in lines[i + 2:]:
            if not body.startswith("|"):
                break
            cells = [c.strip() for c in body.strip("|").split("|")]
            if cells[0] == row:
                return cells[head.index(column)]
    raise AssertionError(f"no cell ({row}, {column}) in\n{markdown}")


def _old_manifest(m: dict, labels_in: tuple[int, int], labels_kept: tuple[int, int]) -> dict:
    """``m`` as an earlier halsift wrote it: no ``scale``, precision as shares rounded to 6 digits."""
    old = {k: v for k, v in m.items() if k != "scale"}
    share_in, share_kept = (round(c / n, 6) for c, n in (labels_in, labels_kept))
    old["precision"] = {"input": share_in, "kept": share_kept, f"input/{GEN}": share_in, f"kept/{GEN}": share_kept}
    old["sentence_precision"] = {"input": share_in, "kept": share_kept}
    return old


def _report(tmp_path: Path, selections: dict[str, Path], bench_out: Path) -> tuple[dict, str]:
    """The recipe's report stage over ``selections`` (filter -> a select manifest) and the bench metrics."""
    from halsift.launch.stages import Paths
    from halsift.launch.stages.report import stage_report
    from halsift.launch.recipe_config import Recipe

    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    shutil.copytree(bench_out, run / "eval" / "bench")
    runs = {name: [{f"{SET}/i2t/r@5": 40.0 + i, f"{SET}/t2i/r@5": 42.0 + i}] for i, name in
            enumerate(["no-tune", *selections])}
    (run / "eval" / "retrieval.json").write_text(json.dumps(runs))
    for name, manifest in selections.items():
        (run / "select" / name).mkdir(parents=True)
        shutil.copy(manifest, run / "select" / name / "manifest.json")
        (run / "score" / name).mkdir(parents=True)
    r = Recipe(name="t")
    r.wandb.mode, r.eval.bench_split = "disabled", ""
    r.score.detectors, r.score.ensembles = {n: "" for n in selections}, {}
    metrics = stage_report(r, Paths(run, "", "", {SET: "unused"}, "", ""))["metrics"]
    return metrics, (run / "report" / "report.md").read_text()


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """Scores, a ``halsift select --keep 0.2`` (its summary line), ``eval bench`` on the same sentences."""
    from halsift.eval.runs.bench_eval import evaluate_bench

    d = tmp_path_factory.mktemp("one_scale")
    corpus, bench, labels = _corpus(d)
    scores = score("random:seed=1", corpus, d / "scores", show_progress=False)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["select", "--scores", str(scores), "--data", str(corpus), "--out", str(d / "sel"),
                     "--keep", str(KEEP), "--no-progress"]) == 0
    table = read_scores_df(scores)
    table.loc[table.index[:4], "parsed"] = False  # 4 of 40 judge replies unparsed: a 10% failure rate
    metrics = evaluate_bench(bench, {"rnd": table}, d / "bench_eval", keep=KEEP, n_boot=50)
    return {"dir": d, "corpus": corpus, "scores": scores, "labels": labels, "summary": buf.getvalue(),
            "manifest": json.loads((d / "sel" / "manifest.json").read_text()), "bench": metrics,
            "expected": _expected(scores, labels)}


def test_every_precision_a_user_reads_is_one_number_on_0_100(chain, tmp_path):
    base, kept = chain["expected"]
    assert 0 < base < 100 and 0 < kept < 100 and kept != base  # the case tells the scales apart
    m = chain["manifest"]
    assert m["scale"] == 100 and m["kept_units"] == round(KEEP * N)
    assert m["precision"]["input"] == pytest.approx(base, abs=1e-4)
    assert m["precision"]["kept"] == pytest.approx(kept, abs=1e-4)
    assert m["precision"][f"kept/{GEN}"] == m["sentence_precision"]["kept"] == m["precision"]["kept"]
    assert f"precision {base:.1f}% -> {kept:.1f}%" in chain["summary"]
    # eval bench on the same sentences: its top 20% is the selection's kept set
    b = chain["bench"]
    assert b[f"precision@{KEEP:g}/{GEN}"] == pytest.approx(kept) and b[f"base_rate/{GEN}"] == pytest.approx(base)
    assert b["failure_rate"] == pytest.approx(100 * 4 / N)
    bench_md = (chain["dir"] / "bench_eval" / "report.md").read_text()
    assert _table_cell(bench_md, GEN, "rnd") == f"{kept:.1f} (base {base:.1f})"
    assert _table_cell(bench_md, "rnd", "failure rate %") == f"{100 * 4 / N:.2f}"
    assert _table_cell(bench_md, "rnd", "> 5%") == "yes"
    assert json.loads((chain["dir"] / "bench_eval" / "metrics.json").read_text()) == pytest.approx(b)
    # the compare report: metrics.json and the table
    metrics, report = _report(tmp_path, {"rnd": chain["dir"] / "sel" / "manifest.json"}, chain["dir"] / "bench_eval")
    assert metrics["rnd/kept_precision"] == pytest.approx(kept, abs=1e-4)
    assert _table_cell(report, "rnd", "kept precision") == f"{kept:.1f}"
    assert f"Precision of the unfiltered corpus: {base:.1f}%." in report
    logged = select_metrics(m)
    assert (logged["precision/input"], logged["precision/kept"]) == (m["precision"]["input"], m["precision"]["kept"])


def test_a_manifest_of_shares_from_an_earlier_halsift_reads_as_the_same_percentages(chain, tmp_path, capsys):
    base, kept = chain["expected"]
    m, labels = chain["manifest"], chain["labels"]
    n_correct = sum(v == "correct" for v in labels.values())
    k = m["kept_units"]
    old = _old_manifest(m, (n_correct, N), (round(kept * k / 100), k))
    assert on_percent_scale(old)["precision"] == pytest.approx(m["precision"], abs=1e-4)
    (tmp_path / "old.json").write_text(json.dumps(old))
    # the compare report: the old manifest's filter states the same kept precision as the new one's
    metrics, report = _report(tmp_path, {"new": chain["dir"] / "sel" / "manifest.json", "old": tmp_path / "old.json"},
                              chain["dir"] / "bench_eval")
    assert metrics["old/kept_precision"] == pytest.approx(metrics["new/kept_precision"], abs=1e-4)
    assert _table_cell(report, "old", "kept precision") == _table_cell(report, "new", "kept precision") \
        == f"{kept:.1f}"
    # select rerun on a complete folder of an earlier halsift: returned as it is, printed (and paged) in %
    sel = tmp_path / "sel"
    shutil.copytree(chain["dir"] / "sel", sel)
    (sel / "manifest.json").write_text(json.dumps(old))
    capsys.readouterr()
    assert main(["select", "--scores", str(chain["scores"]), "--data", str(chain["corpus"]), "--out", str(sel),
                 "--keep", str(KEEP), "--no-progress", "--html"]) == 0
    out = capsys.readouterr().out
    assert f"precision {base:.1f}% -> {kept:.1f}%" in out
    assert json.loads((sel / "manifest.json").read_text()) == old  # not rewritten
    assert f"precision {base:.1f}% → {kept:.1f}%" in (sel / "index.html").read_text()
    assert select_metrics(old)["precision/kept"] == pytest.approx(select_metrics(m)["precision/kept"], abs=1e-4)


@pytest.mark.parametrize("scale", [50, "100", 0.01])
def test_a_manifest_on_another_scale_is_refused_by_name(scale):
    with pytest.raises(ValueError, match=r"select manifest: scale .*expected 100 \(percentages\) or none"):
        on_percent_scale({"scale": scale, "precision": {"input": 0.5, "kept": 0.8}})
