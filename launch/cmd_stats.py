"""``halsift stats``: per-generator sentence statistics of a bench or of shards (the seeds' Table 1 / Fig. 4)."""

from __future__ import annotations

import argparse

HELP = "per-generator statistics (sentences, share correct, types, incorrect rate by position) of a bench or shards"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="bench.jsonl, a folder holding one (or a world folder), or shards "
                                "(folder, glob or brace pattern) whose json has ground-truth sentences")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    from halsift.corpus.stats import format_table, stats, to_json
    from halsift.launch.cli import UsageError

    try:
        st = stats(args.path)
    except ValueError as e:
        if type(e) is not ValueError:  # format errors (bench/shards) are reported by the dispatcher
            raise
        raise UsageError(f"PATH: {e}") from e
    print(to_json(st) if args.json else format_table(st))
    return 0
