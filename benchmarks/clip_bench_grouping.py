"""Speed of ``score_bench`` with the ``clip`` detector: images encoded once per distinct image (the runner keeps the
rows of one image together and the detector groups by ``image_id``) vs once per row (the old behaviour, emulated
by dropping ``image_id`` so that every row id is its own image group).

    python benchmarks/clip_bench_grouping.py                         # tiny config, synthetic bench
    python benchmarks/clip_bench_grouping.py --arch ViT-B-32         # real ViT-B/32 shape, random weights

Prints seconds, rows/s, encoded images and the speedup; never passes or fails on time.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="halsift-tiny")
    ap.add_argument("--bench-images", type=int, default=24, help="i2t bench images (each captioned 6 times)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)

    from halsift.corpus.bench import read_bench
    from halsift.synth.world import generate_world
    from halsift.filtering.detectors.clip import ClipDetector
    from halsift.filtering.scoring.runner import score_bench

    class PerRow(ClipDetector):
        """The old grouping: no image identity beyond the row id, so each row encodes its image."""

        def prepare(self, items):
            return super().prepare([replace(it, image_id="") for it in items])

    with tempfile.TemporaryDirectory() as tmp:
        generate_world(tmp, images=40, seed=0, bench_images=args.bench_images)
        bench = f"{tmp}/bench/bench.jsonl"
        rows = read_bench(bench)
        print(f"bench: {len(rows)} rows, {len({r.image for r in rows})} images, "
              f"{len({r.caption_id for r in rows})} captions; arch {args.arch}, batch {args.batch_size}")
        res = {}
        for name, cls in (("per-row", PerRow), ("grouped", ClipDetector)):
            det = cls(arch=args.arch, pretrained="random", seed=0, device=args.device)
            encoded = []
            orig = det.model.encode_image
            det.model.encode_image = lambda pix, *a, **k: (encoded.append(pix.shape[0]), orig(pix, *a, **k))[1]
            score_bench(det, bench, batch_size=args.batch_size, show_progress=False)  # warm-up
            best = float("inf")
            for _ in range(args.repeats):
                encoded.clear()
                t = time.perf_counter()
                df = score_bench(det, bench, batch_size=args.batch_size, show_progress=False)
                best = min(best, time.perf_counter() - t)
            res[name] = (best, df.set_index("key")["score"])
            print(f"{name:8s} {best:7.2f} s  {len(rows) / best:8.1f} rows/s  encoded images {sum(encoded)}")
        diff = (res["per-row"][1] - res["grouped"][1].reindex(res["per-row"][1].index)).abs().max()
        print(f"speedup {res['per-row'][0] / res['grouped'][0]:.2f}x; max |score diff| {diff:.2e}")


if __name__ == "__main__":
    main()
