"""PMI references: scoring time per caption and bench AUROC against the number of reference images, with each
reference's prefix encoded once (``reuse_prefix=true``, the default) and re-encoded for every caption (``false``).

    python benchmarks/pmi_references.py --run runs/quickstart --counts 1 2 4 8 16 [--captions 60] [--repeats 3]

``--run`` is a finished ``halsift run`` folder of a recipe with a ``world_judge`` detector named ``judge`` (the
quickstart): its pre-trained captioner (``detectors/judge/pretrained``) is read with ``vlm mode=pmi`` against the
first K images of ``world/pretrain`` (the references the world judge uses), on the bench test split. AUROC is
reported for PMI alone and for the quickstart's detector (z-score mean with the yes/no judge, scored once).
Time is the minimum over ``--repeats`` of scoring the first ``--captions`` test captions, per caption. Set
``OMP_NUM_THREADS`` / ``--threads`` and measure on a quiet machine. Prints numbers only; never passes or fails.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def _test_bench(bench: Path) -> Path:
    """The bench's test split as a file of its own (next to the bench: image paths stay valid)."""
    from halsift.corpus.bench import read_bench, write_bench

    test = bench.with_name("bench_test.jsonl")
    write_bench(test, [r for r in read_bench(bench) if r.split == "test"])
    return test


def _caption_items(bench: Path, captions: int) -> list:
    """Scoring items of the first ``captions`` captions of ``bench``, as the scoring runner reads them."""
    from halsift.corpus.images import SkipCounter
    from halsift.filtering.scoring.parts import iter_caption_groups, plan_parts

    parts, _ = plan_parts(str(bench))
    groups = (g for part in parts for g in iter_caption_groups(part, "sentence", SkipCounter()))
    return [it for _, g in zip(range(captions), groups) for it in g]


def _bench_scores(spec: str, test: Path):
    """(labels, scores) of a detector on the test bench, rows in the bench's order (labelled rows only)."""
    from halsift.eval.runs.bench_eval import bench_frame, join_scores
    from halsift.eval.metrics.detection import labelled
    from halsift.filtering.scoring.runner import score_bench
    from halsift.filtering.detectors.spec import load_detector

    det = load_detector(spec)
    df, _, _ = join_scores(bench_frame(test), score_bench(det, test, show_progress=False), det.name)
    df = labelled(df).sort_values("id")
    return df.label.to_numpy(), df.score.to_numpy()


def main(argv: list[str] | None = None) -> None:
    import numpy as np
    import torch

    from halsift.eval.metrics.detection import auroc
    from halsift.filtering.detectors.ensemble import combine
    from halsift.filtering.detectors.spec import load_detector

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default="runs/quickstart")
    ap.add_argument("--counts", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--captions", type=int, default=60, help="captions timed per setting")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    run = Path(args.run)
    judge_dir, bench = run / "detectors" / "judge", run / "world" / "bench" / "bench.jsonl"
    refs = run / "world" / "pretrain"
    for need in (judge_dir / "pretrained", judge_dir / "judge" / "adapter", bench):
        if not need.exists():
            raise SystemExit(f"pmi_references: {need} does not exist; run `halsift run quickstart` first")
    test = _test_bench(bench)
    timed = _caption_items(test, args.captions)
    labels, judge = _bench_scores(f"lora:{judge_dir / 'judge' / 'adapter'}", test)
    print(json.dumps({"timed_captions": args.captions, "timed_sentences": len(timed), "test_sentences": len(labels),
                      "judge_auroc": round(auroc(labels, judge), 2)}), flush=True)
    for k in args.counts:
        rec: dict = {"references": k}
        for reuse in (True, False):
            det = load_detector(f"vlm:model={judge_dir / 'pretrained'},mode=pmi,references={refs},n_references={k},"
                                f"reuse_prefix={str(reuse).lower()}")
            det.score_batch(timed[:2])  # warm-up (and, with reuse, the references' encoding, once per run)
            best = min(_timed(det, timed) for _ in range(args.repeats))
            rec[f"s_per_caption_{'reuse' if reuse else 'no_reuse'}"] = round(best / args.captions, 4)
        pmi_labels, pmi = _bench_scores(f"vlm:model={judge_dir / 'pretrained'},mode=pmi,references={refs},"
                                        f"n_references={k}", test)
        assert (pmi_labels == labels).all()
        both = combine(np.stack([judge, pmi]), [1.0, 1.0], "zscore")
        rec["speedup"] = round(rec["s_per_caption_no_reuse"] / rec["s_per_caption_reuse"], 2)
        rec["pmi_auroc"] = round(auroc(labels, pmi), 2)
        rec["judge+pmi_auroc"] = round(auroc(labels, both), 2)
        print(json.dumps(rec), flush=True)


def _timed(det, items) -> float:
    start = time.perf_counter()
    det.score_batch(items)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
