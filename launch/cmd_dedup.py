"""``halsift dedup``: exact and near-duplicate images and evaluation leaks of a corpus (docs/curation.md)."""

from __future__ import annotations

import argparse
import json

from halsift.corpus.config import config_from_args
from halsift.filtering.curation.config import DedupConfig
from halsift.launch.describe import config_arguments

HELP = "find exact / near-duplicate samples and evaluation leaks (--against); writes duplicates.parquet"
CONFIG = DedupConfig  # the settings (docs/config.md, --describe)

add_arguments = config_arguments(DedupConfig, config_file=False, defaults=True)


def run(args: argparse.Namespace) -> int:
    from halsift.filtering.curation.dedup import run_dedup

    cfg = config_from_args(DedupConfig, args)
    m = run_dedup(cfg.data, cfg.out, against=cfg.against, embeddings=cfg.embeddings, model=cfg.model,
                  exact_on=cfg.exact_on, phash_distance=cfg.phash_distance, near_thumbnail=cfg.near_thumbnail,
                  eval_thumbnail=cfg.eval_thumbnail, cosine=cfg.cosine, nprobe=cfg.nprobe,
                  show_progress=not cfg.no_progress, allow_implausible=cfg.allow_implausible, engine=cfg.engine,
                  **cfg.engine_flags())
    for line in m.get("lines", []):
        print(line, flush=True)
    if m.get("status") == "parts":
        print(f"dedup: {m['made']} shard parts made, {m['reused']} reused; run dedup without --num-tasks for the "
              f"duplicates", flush=True)
        return 0
    print(json.dumps({k: m[k] for k in ("samples", "counts", "removed", "groups")}, sort_keys=True))
    print(f"dedup: {m['removed']} of {m['samples']} samples listed in {cfg.out}/duplicates.parquet "
          f"(exact {m['counts']['exact']}, near {m['counts']['near']}, eval {m['counts']['eval']}); "
          f"{m['skipped']['total']} skipped")
    return 0
