"""``halsift train detector``: LoRA fine-tuning of a clip or vlm detector on an annotated bench (flags mirror
DetectorTrainConfig's fields); the result is a detector spec ``lora:OUT/adapter``. With ``--teacher SCORES
--embeddings EMB``: a student head distilled from a judge's scores (:mod:`halsift.training.distill`), the detector
``student:path=OUT/student,embeddings=EMB``."""

from __future__ import annotations

import argparse
import sys

from halsift.launch.describe import config_arguments, parsed_config
from halsift.training.detector_config import DetectorTrainConfig

HELP = "LoRA fine-tune a clip or vlm detector on an annotated bench; writes OUT/adapter (spec lora:OUT/adapter)"

_SHORT = {"base": "SPEC", "bench": "BENCH.jsonl", "out": "DIR", "target_modules": "NAME"}

CONFIG = DetectorTrainConfig  # the settings (docs/config.md, --describe)
add_arguments = config_arguments(DetectorTrainConfig, _SHORT, detectors=True)


def run(args: argparse.Namespace) -> int:
    cfg = parsed_config(DetectorTrainConfig, args, DetectorTrainConfig.resolved_kind)
    if cfg.teacher:  # distillation: a student head on stored embeddings (issue 44)
        from halsift.training.distill import distill

        s = distill(cfg.teacher, cfg.embeddings, cfg.out, steps=cfg.steps, batch_size=max(cfg.batch_size, 1),
                    lr=cfg.lr, hidden=cfg.head_hidden, sample=cfg.teacher_sample, seed=cfg.seed)
        line = (f"detector: {s['spec']}  {s['units']} teacher units, held-out spearman "
                f"{s['held_out_spearman']:.3f}" if s["held_out_spearman"] is not None else f"detector: {s['spec']}")
        print(line + ("  (trained already: the same teacher, embeddings and settings)" if s.get("trained_already")
                      else ""))
        return 0
    from halsift.training.detector_train import train_detector

    try:
        result = train_detector(cfg)
    except FloatingPointError as e:
        print(f"halsift train detector: {e}", file=sys.stderr)
        return 1
    auc = result.get("val/auroc")
    print(f"detector: lora:{result['adapter']}  best step {result['best_step']}"
          + (f"  val auroc {auc:.2f}" if auc is not None else ""))
    return 0
