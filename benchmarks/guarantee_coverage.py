"""Coverage of the guaranteed selection (issue 32), measured: does ``select --max-hallucination A --confidence C``
keep its promise over many independent calibration samples?

    python benchmarks/guarantee_coverage.py                  # world seed 7331, 100 draws of 300 labels
    python benchmarks/guarantee_coverage.py --draws 200 --seed 99 --work /tmp/cov
    python benchmarks/guarantee_coverage.py --images 300 --draws 100 --methods multistart   # a quick check
    python benchmarks/guarantee_coverage.py --cascade        # + the guarantee through a cascade, held-out world

Generates a synthetic world (``halsift synth``, a seed nobody tuned on), scores its corpus with an informative but
imperfect detector (``ensemble:members=[oracle;random:seed=0],weights=[0.3,0.7]``: correct sentences score in
[30, 100), hallucinated ones in [0, 70)) and with the oracle. Then, per draw, 300 labelled corpus sentences are drawn
uniformly (the calibration sample a person labels), :func:`halsift.filtering.selection.guarantee.certify` picks the
threshold, and the realized hallucination rate of every labelled corpus sentence scoring >= it is measured. For each
A in {5, 10, 20} % at C = 90 % it prints how often the realized rate exceeded A (allowed: (1 - C) of the draws plus
binomial slack, the 95 % quantile of Binomial(draws, 1 - C)), how often no threshold was certified, and the mean kept
share against the oracle's at the same A (what the guarantee costs), per guarantee method (``multistart``, the
default since issue 44, and the single fixed ``sequence``); the oracle's exceedances count too.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

DETECTOR = "ensemble:members=[oracle;random:seed=0],weights=[0.3,0.7]"
# --cascade: the detector above as the cheap stage, a sharper noisy oracle as the judge, a quarter of the units judged
CASCADE = (f"cascade:cheap=[{DETECTOR}],judge=[ensemble:members=[oracle;random:seed=1],weights=[0.6,0.4]],"
           "budget=0.25")


def labelled_scores(corpus: Path, scores: Path) -> tuple[np.ndarray, np.ndarray]:
    """Scores and hallucinated flags of the corpus's labelled (correct / incorrect) sentences."""
    from halsift.corpus.sample import sentences_of
    from halsift.corpus.scores import read_scores
    from halsift.corpus.shards import iter_samples

    label = {}
    for s in iter_samples(corpus):
        _, labels, _ = sentences_of(s.meta, s.caption)
        for i, lab in enumerate(labels):
            label[(s.key, i)] = lab
    t = read_scores(scores, ["key", "sentence_index", "score"])
    s, y = [], []
    for k, i, v in zip(t["key"].to_pylist(), t["sentence_index"].to_pylist(), t["score"].to_pylist()):
        lab = label.get((k, i))
        if lab in ("correct", "incorrect"):
            s.append(v)
            y.append(lab == "incorrect")
    return np.array(s, np.float64), np.array(y, bool)


def coverage(s: np.ndarray, y: np.ndarray, alpha: float, confidence: float, draws: int, n: int,
             seed: int, method: str = "multistart") -> dict:
    """Per draw: certify on ``n`` uniform labelled units, measure the kept set's realized rate and share."""
    from halsift.filtering.selection.guarantee import certify

    rng = np.random.default_rng(seed)
    exceed, none, kept = 0, 0, []
    for _ in range(draws):
        idx = rng.choice(len(s), size=n, replace=False)
        g = certify(s[idx], y[idx], alpha, confidence, method=method)
        if g.threshold is None:
            none += 1
            kept.append(0.0)
            continue
        mask = s >= g.threshold
        exceed += bool(y[mask].mean() > alpha)
        kept.append(mask.mean())
    return {"exceed": exceed, "none": none, "kept": float(np.mean(kept))}


def held_out_coverage(s: np.ndarray, y: np.ndarray, cal_s: np.ndarray, cal_y: np.ndarray, alpha: float,
                      confidence: float, draws: int, n: int, seed: int) -> dict:
    """Per draw: certify on ``n`` labelled units of the held-out world (``cal_s``, ``cal_y``), measure the realized
    rate and kept share on the corpus's labelled units (``s``, ``y``)."""
    from halsift.filtering.selection.guarantee import certify

    rng = np.random.default_rng(seed)
    exceed, none, kept = 0, 0, []
    for _ in range(draws):
        idx = rng.choice(len(cal_s), size=n, replace=False)
        g = certify(cal_s[idx], cal_y[idx], alpha, confidence)
        if g.threshold is None:
            none += 1
            kept.append(0.0)
            continue
        mask = s >= g.threshold
        exceed += bool(mask.any() and y[mask].mean() > alpha)
        kept.append(mask.mean())
    return {"exceed": exceed, "none": none, "kept": float(np.mean(kept))}


def cascade_rows(args, work: Path, allowed: int) -> bool:
    """The guarantee through a cascade: fitted on this world's corpus, the calibration units drawn from a held-out
    world (seed + 1) scored through the frozen plan, the realized rate measured on this world's corpus."""
    from halsift.filtering.scoring.cascade import with_plan
    from halsift.filtering.scoring.runner import score
    from halsift.launch.cli import main as halsift

    held = work / "heldout"
    if not (held / "world.json").exists():
        assert halsift(["synth", "--images", str(args.images), "--out", str(held), "--seed", str(args.seed + 1)]) == 0
    score(CASCADE, work / "world" / "corpus", work / "cascade", batch_size=256, show_progress=False)
    score(with_plan(CASCADE, work / "cascade"), held / "corpus", work / "cascade_heldout", batch_size=256,
          show_progress=False)
    s, y = labelled_scores(work / "world" / "corpus", work / "cascade")
    cs, cy = labelled_scores(held / "corpus", work / "cascade_heldout")
    share = json.loads((work / "cascade" / "_manifest.json").read_text())["cascade"]["judge_share"]
    print(f"\ncascade {CASCADE} (judge share {share:g}%): calibration from world seed {args.seed + 1} "
          f"({len(cs)} labelled sentences) through the frozen plan, realized rate on world seed {args.seed}")
    print("| A % | draws realized > A | no threshold | kept % | ok |")
    print("|---:|---:|---:|---:|:-:|")
    ok_all = True
    for a in (0.05, 0.1, 0.2):
        c = held_out_coverage(s, y, cs, cy, a, args.confidence, args.draws, args.labels, args.seed)
        ok = c["exceed"] <= allowed
        ok_all &= ok
        print(f"| {100 * a:g} | {c['exceed']} / {args.draws} | {c['none']} | {100 * c['kept']:.1f} | "
              f"{'yes' if ok else 'NO'} |")
    return ok_all


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=7331, help="world seed")
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--draws", type=int, default=100)
    ap.add_argument("--labels", type=int, default=300)
    ap.add_argument("--confidence", type=float, default=0.9)
    ap.add_argument("--methods", default="multistart,sequence",
                    help="guarantee methods to measure (certify's method), comma-separated")
    ap.add_argument("--cascade", action="store_true",
                    help="also the guarantee through a cascade, calibrated on a held-out world (seed + 1)")
    ap.add_argument("--work", default="", help="folder for the world and scores (default: a temporary one)")
    args = ap.parse_args()
    from scipy.stats import binom

    from halsift.filtering.scoring.runner import score
    from halsift.launch.cli import main as halsift

    work = Path(args.work or tempfile.mkdtemp(prefix="guarantee_cov_"))
    t0 = time.perf_counter()
    if not (work / "world" / "world.json").exists():
        assert halsift(["synth", "--images", str(args.images), "--out", str(work / "world"), "--seed",
                        str(args.seed)]) == 0
    for name, spec in (("detector", DETECTOR), ("oracle", "oracle")):
        if not (work / name / "_manifest.json").exists():
            score(spec, work / "world" / "corpus", work / name, batch_size=256, show_progress=False)
    s, y = labelled_scores(work / "world" / "corpus", work / "detector")
    so, yo = labelled_scores(work / "world" / "corpus", work / "oracle")
    print(f"world seed {args.seed}: {len(s)} labelled corpus sentences, {100 * y.mean():.1f}% hallucinated; "
          f"detector {DETECTOR}; {args.draws} draws of {args.labels} labels; C = {100 * args.confidence:g}% "
          f"(setup {time.perf_counter() - t0:.0f} s)")
    allowed = int(binom.ppf(0.95, args.draws, 1 - args.confidence))
    print(f"allowed exceedances: (1 - C) x draws = {(1 - args.confidence) * args.draws:g}, with binomial slack "
          f"<= {allowed}")
    print("| method | A % | draws realized > A | no threshold | kept % (detector) | kept % (oracle) | ok |")
    print("|---|---:|---:|---:|---:|---:|:-:|")
    ok_all = True
    for method in args.methods.split(","):
        for a in (0.05, 0.1, 0.2):
            c = coverage(s, y, a, args.confidence, args.draws, args.labels, args.seed, method)
            o = coverage(so, yo, a, args.confidence, args.draws, args.labels, args.seed, method)
            ok = c["exceed"] <= allowed and o["exceed"] <= allowed
            ok_all &= ok
            print(f"| {method} | {100 * a:g} | {c['exceed']} / {args.draws} | {c['none']} | {100 * c['kept']:.1f} | "
                  f"{100 * o['kept']:.1f} | {'yes' if ok else 'NO'} |")
    if args.cascade:
        ok_all &= cascade_rows(args, work, allowed)
    print(f"coverage {'holds' if ok_all else 'FAILS'}; total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
