"""Will a cascade pay on this corpus? Its selection replayed from score folders that already exist, in seconds.

    python benchmarks/cascade_agreement.py runs/cascade_table/seed21/score
    python benchmarks/cascade_agreement.py RUN/score --judge judge --cheap clip-lora student --budgets 0.1 0.25 0.5
    python benchmarks/cascade_agreement.py RUN/score --learn RUN/emb     # also each cascade with learn=RUN/emb

Reads ``SCORE_DIR/<name>/corpus`` of a recipe run (a judge scored on everything, and cheap detectors), and for each
cheap stage prints: the Spearman correlation of its caption scores with the judge's (mean of the sentences), the
share of the judge's kept captions (top ``--keep`` by mean sentence score) that the cheap stage alone keeps, and the
share a cascade keeps at each budget, its plan fitted exactly as ``halsift score`` fits it
(:func:`halsift.filtering.scoring.cascade_plan.fit_plan`) with the judge's scores of the units it would have judged
looked up instead of computed. With ``--agg sentence`` too, the same cascade with its band on sentences. Also a z-scored
sum of the first two cheap stages (``A+B``): two weakly correlated cheap stages together.

No fine-tuning, no judge call: it says how close a cascade's kept set comes to the judge's before anyone spends a GPU
hour on the cascade or on the retrieval table (``benchmarks/cascade_table.py``). The judge's corpus scores stand in
for the calls (a set-level judge's are normalised over the corpus there, over the sample in a cascade: the order of
the units, which is what the kept set depends on, is the same within each).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def load(score_dir: Path, name: str, index=None):
    """The corpus scores of detector ``name`` as a pandas Series on (key, sentence_index)."""
    from halsift.corpus.scores import read_scores

    t = read_scores(score_dir / name / "corpus", ["key", "sentence_index", "score"]).to_pandas()
    s = t.set_index(["key", "sentence_index"])["score"]
    if index is not None:
        s = s.reindex(index)
        if s.isna().any():
            raise SystemExit(f"cascade_agreement: {name} has no score for {int(s.isna().sum())} of the judge's units")
    return s


def kept_captions(scores: np.ndarray, groups: np.ndarray, n: int, keep: float) -> np.ndarray:
    from halsift.filtering.scoring.cascade_plan import aggregate

    a = aggregate(scores, groups, n, "mean")
    return a >= np.quantile(a, 1.0 - keep)


def replay(keys: list[str], idx: np.ndarray, cheap: np.ndarray, judge: np.ndarray, budget: float, keep: float,
           sample: float, agg: str, feats: np.ndarray | None = None) -> np.ndarray:
    """The cascade's standing scores: the judge's where it would call it, the cheap stage's placed elsewhere. With
    ``feats`` (the units' student features) the cheap score is first refined as ``learn=`` does
    (:mod:`halsift.filtering.scoring.cascade_learn`: a ridge head fitted on the sample, out of fold there)."""
    from halsift.filtering.scoring.cascade_learn import fit_head
    from halsift.filtering.scoring.cascade_plan import caption_groups, fit_plan, unit_sample

    rate = sample * budget
    sampled = unit_sample(keys, idx, 0, rate, agg)
    fit_on = cheap
    if feats is not None:
        groups, _ = caption_groups(keys)
        w, bias, coef, oof, _ = fit_head(feats[sampled], cheap[sampled], judge[sampled], groups[sampled])
        cheap = feats @ w + bias + coef * cheap
        fit_on = cheap.copy()
        fit_on[sampled] = oof
    plan = fit_plan("replay", fit_on, sampled, judge[sampled], budget, keep, rate, 0, keys=keys, agg=agg)
    in_s, band = plan.judged(keys, idx, cheap)
    return np.where(in_s | band, judge, plan.standing(keys, cheap))


def main(argv: list[str] | None = None) -> int:
    from scipy.stats import spearmanr

    from halsift.filtering.scoring.cascade_plan import aggregate, caption_groups

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("score_dir", help="a recipe run's score folder (holding NAME/corpus per detector)")
    ap.add_argument("--judge", default="judge")
    ap.add_argument("--cheap", nargs="+", default=["clip-lora", "student", "clip"])
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.1, 0.25, 0.5])
    ap.add_argument("--keep", type=float, default=0.2, help="share of captions kept (default: the seeds' 20%%)")
    ap.add_argument("--sample", type=float, default=0.3, help="share of the budget on the random sample")
    ap.add_argument("--agg", nargs="+", default=["mean", "sentence"], choices=["mean", "min", "sentence"],
                    help="the cascades' unit (the selection always keeps whole captions by mean)")
    ap.add_argument("--learn", default="", metavar="EMB",
                    help="also each cheap stage refined on the sample as the cascade's learn=EMB does (EMB: a "
                         "`halsift embed` folder of the corpus, e.g. cascade_table.py's RUN/emb)")
    a = ap.parse_args(argv)
    d = Path(a.score_dir)
    judge = load(d, a.judge)
    keys = [k for k, _ in judge.index]
    idx = np.array([i for _, i in judge.index], np.int64)
    groups, n = caption_groups(keys)
    j = judge.to_numpy(np.float64)
    top = kept_captions(j, groups, n, a.keep)
    cheaps = {}
    for name in a.cheap:
        if (d / name / "corpus").is_dir():
            cheaps[name] = load(d, name, judge.index).to_numpy(np.float64)
        else:
            print(f"({name}: no {d / name / 'corpus'}, left out)")
    names = list(cheaps)
    if len(names) >= 2:
        z = lambda x: (x - x.mean()) / (x.std() or 1.0)  # noqa: E731
        cheaps[f"{names[0]}+{names[1]}"] = z(cheaps[names[0]]) + z(cheaps[names[1]])
    feats = None
    if a.learn:
        from halsift.filtering.detectors.student import features
        from halsift.filtering.scoring.cascade_learn import sample_vectors

        img, txt, _ = sample_vectors(a.learn, keys, idx, np.ones(len(keys), bool))
        feats = features(img, txt).astype(np.float64)
    cols = [f"{agg} {round(100 * b)}%" for agg in a.agg for b in a.budgets]
    print(f"{len(j)} units, {n} captions; share of the judge's kept captions (top {a.keep:.0%} by mean) that each "
          "filter keeps")
    print("| cheap stage | caption Spearman with the judge | cheap alone | " + " | ".join(
        f"cascade {c}" for c in cols) + " |")
    print("|---|---:|---:|" + "---:|" * len(cols))
    for name, c in cheaps.items():
        rho = spearmanr(aggregate(c, groups, n, "mean"), aggregate(j, groups, n, "mean")).correlation
        for learned in (False, True) if feats is not None else (False,):
            cells = [f"{(kept_captions(c, groups, n, a.keep) & top).sum() / top.sum():.3f}" if not learned else "–"]
            for agg in a.agg:
                for b in a.budgets:
                    final = replay(keys, idx, c, j, b, a.keep, a.sample, agg, feats if learned else None)
                    cells.append(f"{(kept_captions(final, groups, n, a.keep) & top).sum() / top.sum():.3f}")
            label, r = (f"{name}, learn=", "–") if learned else (name, f"{rho:.3f}")
            print(f"| {label} | {r} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
