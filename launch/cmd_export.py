"""``halsift export FORMAT SRC --out OUT``: halsift's sets into the layouts other tools read (the reverse of
``halsift convert``)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from halsift.corpus.config import config_from_args, field
from halsift.launch.describe import add_format_command_arguments

HELP = "export a retrieval set for CLIP_benchmark (its wds/ WebDataset layout)"

# format -> (what SRC is, what OUT is)
FORMATS = {
    "clip-benchmark": ("a retrieval set: retrieval.jsonl or its folder",
                       "a CLIP_benchmark wds dataset root (OUT/<split>/0.tar ..., nshards.txt, dataset_type.txt)"),
}


@dataclass
class ExportConfig:
    """``halsift export``'s settings."""

    format: str = field("", help="the layout to write (see below)",
                        cli={"positional": True, "choices": sorted(FORMATS)})
    src: str = field("", help="the halsift file or folder to export", cli={"positional": True})
    out: str = field("", help="the output folder (a CLIP_benchmark --dataset_root)", cli={"required": True})
    split: str = field("test", help="clip-benchmark: the split folder written under OUT (clip_benchmark --split)")
    maxcount: int = field(10_000, range="[1, inf)", help="clip-benchmark: samples per tar shard")

    def validate(self) -> None:
        from halsift.corpus.clip_benchmark_wds import ClipBenchmarkExportError, check_split_name

        try:
            check_split_name(self.split)
        except ClipBenchmarkExportError as e:
            raise ValueError(str(e)) from None


CONFIG = ExportConfig  # the settings (docs/config.md, --describe)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_format_command_arguments(p, ExportConfig, FORMATS, width=15)


def run(args: argparse.Namespace) -> int:
    from halsift.corpus.clip_benchmark_wds import export_retrieval

    cfg = config_from_args(ExportConfig, args)
    summary = export_retrieval(cfg.src, cfg.out, split=cfg.split, maxcount=cfg.maxcount)
    print(json.dumps(summary, sort_keys=True))
    print(f"exported {cfg.format} {cfg.src} -> {cfg.out}; evaluate with: {summary['clip_benchmark']}")
    return 0
