"""``halsift basic``: basic-filter fields (caption language, words, characters, image size, aspect ratio) of shards
or a parquet table, without a model; a preset's pass flag (DataComp's basic filter: ``--preset datacomp``)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Literal

from halsift.corpus.config import config_from_args, field
from halsift.execution.flags import EngineFlags
from halsift.launch.describe import config_arguments

HELP = "basic-filter fields (language, words, characters, image size, aspect) of shards or a parquet table"


@dataclass
class BasicConfig(EngineFlags):
    """``halsift basic``'s settings."""

    data: str = field("", help="shards (halsift's or img2dataset's; folder / glob / brace pattern) or parquet "
                               "table(s) with key, caption and width/height columns (a .parquet file, glob, or a "
                               "folder of them without shards)", cli={"required": True})
    out: str = field("", help="new folder: part-<input>.parquet per input + manifest.json (rerun the same command "
                              "to finish a killed run)", cli={"required": True})
    preset: list[str] = field(default_factory=lambda: ["datacomp"],
                              help="presets whose pass flag (column pass_<preset>) and per-rule counts are written; "
                                   "datacomp: English, > 2 words, > 5 characters, short side >= 200 px, "
                                   "aspect <= 3")
    languages: list[str] = field(default_factory=list,
                                 help="ISO 639-1 codes the language detector chooses among (default: every "
                                      "language lingua knows; a few, e.g. en de fr es, is ~20x faster)")
    lang_low_accuracy: bool = field(False, help="lingua's low-accuracy mode (~8x faster over every language; "
                                                "less accurate on short captions)")
    lid_model: str | None = field(None, help="use fastText's language id model file (lid.176.bin) instead of "
                                             "lingua (needs the fasttext package)", cli={"metavar": "PATH"})
    size_from: Literal["auto", "header"] = field("auto", help="image sizes: auto = the size the sample's json records "
                                        "(img2dataset's original_width/original_height) else the image header; "
                                        "header = always the image header")
    no_progress: bool = field(False, help="no progress bar")


CONFIG = BasicConfig  # the settings (docs/config.md, --describe)

add_arguments = config_arguments(BasicConfig, config_file=False, defaults=True)


def run(args: argparse.Namespace) -> int:
    from halsift.filtering.curation.basic_run import run_basic
    from halsift.filtering.curation.language import make_detector

    cfg = config_from_args(BasicConfig, args)
    detector = make_detector(cfg.languages, cfg.lang_low_accuracy, cfg.lid_model)
    m = run_basic(cfg.data, cfg.out, presets=cfg.preset, detector=detector, size_from=cfg.size_from,
                  show_progress=not cfg.no_progress, engine=cfg.engine, **cfg.engine_flags())
    for line in m.get("lines", []):
        print(line, flush=True)
    if m["status"] != "complete":
        return 0
    for name, c in m["presets"].items():
        rules = ", ".join(f"{r} {n}" for r, n in c["removed"].items())
        print(f"{name}: {c['passed']} of {c['samples']} samples pass; removed by rule: {rules}")
    rate = f" ({m['samples_per_s']} samples/s)" if m.get("samples_per_s") else ""
    print(f"wrote {len(m['parts'])} parts ({m['parts_done_before']} done before){rate} -> {cfg.out}", flush=True)
    return 0
