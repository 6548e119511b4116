"""``halsift synth``: write the synthetic caption world (corpus, bench, retrieval, pretrain, world.json)."""

from __future__ import annotations

import argparse
import time

HELP = "generate the synthetic caption world: corpus shards, annotated bench, retrieval set, pre-training shards"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from halsift.synth.styles import RETRIEVAL_STYLES

    p.add_argument("--out", required=True, help="folder to write the world into")
    p.add_argument("--images", type=int, default=2000, help="corpus image-caption pairs (default 2000)")
    p.add_argument("--seed", type=int, default=0, help="the same seed gives byte-identical files")
    p.add_argument("--image-size", type=int, default=64, help="image side in pixels (>= 32; default 64)")
    p.add_argument("--bench-images", type=int, default=None,
                   help="bench images, each captioned by all 6 captioners (default max(24, images/4))")
    p.add_argument("--t2i-prompts", type=int, default=None,
                   help="t2i prompts, each drawn by all 3 generators (default max(12, bench-images/2))")
    p.add_argument("--retrieval-images", type=int, default=None,
                   help="held-out retrieval images with 5 captions each (default max(20, images/10))")
    p.add_argument("--pretrain-images", type=int, default=None, help="clean pre-training pairs (default images)")
    p.add_argument("--shard-size", type=int, default=256, help="samples per shard (default 256)")
    p.add_argument("--overwrite", action="store_true", help="replace a world already in --out")
    p.add_argument("--captioners", nargs="+", default=[], metavar="NAME",
                   help="simulated captioners that write the corpus (default: all six)")
    p.add_argument("--retrieval-style", choices=RETRIEVAL_STYLES, default="captioners",
                   help="retrieval captions: sentences by the captioners that do not write the corpus (default), or "
                        "short human-style captions over families of look-alike scenes")


def run(args: argparse.Namespace) -> int:
    from halsift.launch.cli import UsageError

    for flag, v, lo in (("--images", args.images, 1), ("--image-size", args.image_size, 32),
                        ("--shard-size", args.shard_size, 1), ("--bench-images", args.bench_images, 0),
                        ("--t2i-prompts", args.t2i_prompts, 0), ("--retrieval-images", args.retrieval_images, 0),
                        ("--pretrain-images", args.pretrain_images, 0)):
        if v is not None and v < lo:
            raise UsageError(f"{flag}: got {v}, expected an integer >= {lo}")
    from halsift.synth.world import generate_world

    t0 = time.perf_counter()
    try:
        world = generate_world(args.out, images=args.images, seed=args.seed, image_size=args.image_size,
                               bench_images=args.bench_images, retrieval_images=args.retrieval_images,
                               pretrain_images=args.pretrain_images, t2i_prompts=args.t2i_prompts,
                               shard_size=args.shard_size, overwrite=args.overwrite, show_progress=True,
                               captioners=args.captioners, retrieval_style=args.retrieval_style)
    except FileExistsError as e:
        raise UsageError(f"--out: {str(e).split(' (')[0]}; add --overwrite to replace it") from e
    except ValueError as e:
        raise UsageError(f"--{e}") from e
    sizes = world["sizes"]
    print(f"wrote {args.out}: {sizes['corpus']} corpus pairs, {sizes['bench_rows']} bench sentences "
          f"({sizes['bench_images']} i2t images, {sizes['t2i_prompts']} t2i prompts), {sizes['retrieval']} "
          f"retrieval images, {sizes['pretrain']} pretrain pairs in {time.perf_counter() - t0:.1f}s")
    return 0
