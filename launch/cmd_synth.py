"""``halsift synth``: write the synthetic caption world (corpus, bench, retrieval, pretrain, world.json)."""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass

from halsift.corpus.config import config_from_args, field
from halsift.launch.describe import config_arguments
from halsift.synth.styles import RETRIEVAL_STYLES

HELP = "generate the synthetic caption world: corpus shards, annotated bench, retrieval set, pre-training shards"


@dataclass
class SynthConfig:
    """``halsift synth``'s settings."""

    out: str = field("", help="folder to write the world into", cli={"required": True})
    images: int = field(2000, help="corpus image-caption pairs")
    seed: int = field(0, help="the same seed gives byte-identical files")
    image_size: int = field(64, help="image side in pixels (>= 32)")
    bench_images: int | None = field(None, help="bench images, each captioned by all 6 captioners (default "
                                                "max(24, images/4))")
    t2i_prompts: int | None = field(None, help="t2i prompts, each drawn by all 3 generators (default "
                                               "max(12, bench-images/2))")
    retrieval_images: int | None = field(None, help="held-out retrieval images with 5 captions each (default "
                                                    "max(20, images/10))")
    pretrain_images: int | None = field(None, help="clean pre-training pairs (default images)")
    shard_size: int = field(256, help="samples per shard")
    overwrite: bool = field(False, help="replace a world already in --out")
    captioners: list[str] = field(default_factory=list, help="simulated captioners that write the corpus "
                                                             "(default: all six)", cli={"metavar": "NAME"})
    retrieval_style: str = field("captioners", help="retrieval captions: sentences by the captioners that do not "
                                                    "write the corpus (default), or short human-style captions over "
                                                    "families of look-alike scenes",
                                 cli={"choices": RETRIEVAL_STYLES})

    def validate(self) -> None:
        for name, lo in (("images", 1), ("image_size", 32), ("shard_size", 1), ("bench_images", 0),
                         ("t2i_prompts", 0), ("retrieval_images", 0), ("pretrain_images", 0)):
            v = getattr(self, name)
            if v is not None and v < lo:
                raise ValueError(f"{name}: got {v}, expected an integer >= {lo}")


CONFIG = SynthConfig  # the settings (docs/config.md, --describe)

add_arguments = config_arguments(SynthConfig, config_file=False, defaults=True)


def run(args: argparse.Namespace) -> int:
    from halsift.launch.cli import UsageError

    cfg = config_from_args(SynthConfig, args)
    from halsift.synth.world import generate_world

    t0 = time.perf_counter()
    try:
        world = generate_world(**asdict(cfg), show_progress=True)
    except FileExistsError as e:
        raise UsageError(f"--out: {str(e).split(' (')[0]}; add --overwrite to replace it") from e
    except ValueError as e:
        raise UsageError(f"--{e}") from e
    sizes = world["sizes"]
    print(f"wrote {cfg.out}: {sizes['corpus']} corpus pairs, {sizes['bench_rows']} bench sentences "
          f"({sizes['bench_images']} i2t images, {sizes['t2i_prompts']} t2i prompts), {sizes['retrieval']} "
          f"retrieval images, {sizes['pretrain']} pretrain pairs in {time.perf_counter() - t0:.1f}s")
    return 0
