"""``halsift synth``: write the synthetic caption world (corpus, bench, retrieval, pretrain, world.json)."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from halsift.corpus.config import config_from_args, field
from halsift.launch.describe import config_arguments
from halsift.synth.world_config import WorldSettings

HELP = "generate the synthetic caption world: corpus shards, annotated bench, retrieval set, pre-training shards"


@dataclass
class SynthConfig(WorldSettings):
    """``halsift synth``'s settings: where to write, the seed, and the world's settings (shared with a recipe's
    ``world`` section)."""

    out: str = field("", help="folder to write the world into", cli={"required": True})
    seed: int = field(0, range="[0, inf)", help="the same seed gives byte-identical files")
    overwrite: bool = field(False, help="replace a world already in --out")


CONFIG = SynthConfig  # the settings (docs/config.md, --describe)

add_arguments = config_arguments(SynthConfig, config_file=False, defaults=True)


def run(args: argparse.Namespace) -> int:
    from halsift.launch.cli import UsageError

    cfg = config_from_args(SynthConfig, args)
    from halsift.synth.world import default_workers, generate_world

    t0 = time.perf_counter()
    try:
        kw = cfg.generator_kwargs()
        world = generate_world(cfg.out, seed=cfg.seed, overwrite=cfg.overwrite, show_progress=True,
                               workers=default_workers(kw["images"], kw["pretrain_images"]), **kw)
    except FileExistsError as e:
        raise UsageError(f"--out: {str(e).split(' (')[0]}; add --overwrite to replace it") from e
    except ValueError as e:
        raise UsageError(f"--{e}") from e
    sizes = world["sizes"]
    print(f"wrote {cfg.out}: {sizes['corpus']} corpus pairs, {sizes['bench_rows']} bench sentences "
          f"({sizes['bench_images']} i2t images, {sizes['t2i_prompts']} t2i prompts), {sizes['retrieval']} "
          f"retrieval images, {sizes['pretrain']} pretrain pairs in {time.perf_counter() - t0:.1f}s")
    return 0
