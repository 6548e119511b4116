"""``halsift annotate``: draw corpus sentences for labelling (stratified by score, weights recorded), write a static
labelling page, and let its exported labels feed ``score`` and ``select --calibration``. The library call is
:func:`halsift.eval.annotate.annotate` (a job of the execution layer); this command parses and prints."""

from __future__ import annotations

import argparse

from halsift.corpus.config import config_from_args
from halsift.eval.annotate import AnnotateConfig
from halsift.launch.describe import config_arguments

HELP = "draw a score-stratified sample of the corpus for labelling and write a keyboard labelling page (HTML)"
CONFIG = AnnotateConfig  # the settings (docs/config.md, --describe)

add_arguments = config_arguments(AnnotateConfig, config_file=False, defaults=True)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from halsift.eval.annotate import annotate
    from halsift.execution.run_folder import read_record

    cfg = config_from_args(AnnotateConfig, args)
    out = Path(cfg.out)
    before = read_record(out / "annotate.json") if (out / "annotate.json").is_file() else None
    record = annotate(cfg)
    if before is not None and before.get("status") == "complete":  # the same draw: the page and any labels stay
        print(f"{out}: this sample is drawn already ({record['drawn']} sentences, {out / 'index.html'}); "
              "labels.jsonl there is kept", flush=True)
        return 0
    print(f"drew {record['drawn']} sentences -> {out / 'index.html'}: mark them (j/k, y/n), Export, save labels.jsonl "
          f"in {out}; then `halsift select ... --calibration {out}/labels.jsonl`")
    return 0
