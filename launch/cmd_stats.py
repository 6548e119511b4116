"""``halsift stats``: per-generator sentence statistics of a bench or of shards (the seeds' Table 1 / Fig. 4)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from halsift.corpus.config import config_from_args, field
from halsift.launch.describe import config_arguments

HELP = "per-generator statistics (sentences, share correct, types, incorrect rate by position) of a bench or shards"


@dataclass
class StatsConfig:
    """``halsift stats``'s settings."""

    path: str = field("", help="bench.jsonl, a folder holding one (or a world folder), or shards (folder, glob or "
                               "brace pattern) whose json has ground-truth sentences", cli={"positional": True})
    json: bool = field(False, help="print JSON instead of a table")


CONFIG = StatsConfig  # the settings (docs/config.md, --describe)

add_arguments = config_arguments(StatsConfig, config_file=False, defaults=True)


def run(args: argparse.Namespace) -> int:
    from halsift.corpus.stats import format_table, stats, to_json
    from halsift.launch.cli import UsageError

    cfg = config_from_args(StatsConfig, args)
    try:
        st = stats(cfg.path)
    except ValueError as e:
        if type(e) is not ValueError:  # format errors (bench/shards) are reported by the dispatcher
            raise
        raise UsageError(f"PATH: {e}") from e
    print(to_json(st) if cfg.json else format_table(st))
    return 0
