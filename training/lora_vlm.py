"""LoRA (peft) on a transformers VLM judge: the ``vlm`` kind of ``train detector``.

Train and score agree by construction: the inputs are built by the base
:class:`~halsift.filtering.detectors.vlm.VlmDetector` itself (its chat template, prompt, prefill and continuation
tokens, via ``prefix_inputs`` / ``continuation_ids`` and its judge's ``full_batch``), and the training target is the
detector's own score read from the same next-token distribution with the same token sets:

* ``yes_prob``: logit = ``log P(yes tokens) - log P(no tokens)`` at the answer position, so
  ``sigmoid(logit) = score / 100`` exactly; binary cross-entropy pushes the mass to "Yes" for correct sentences
  and to "No" for incorrect ones.
* ``logits``: ``p = score / 100`` with the expected-number formula of the detector (single-token numbers or the
  digit path), differentiable; binary cross-entropy on ``p`` pushes the mass to high numbers for correct
  sentences and low ones for incorrect ones.

:func:`judge_scores` is that formula on tensors; a test checks it equals the detector's ``_scores_from_logits``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from halsift.corpus.memo import BudgetedMemo
from halsift.filtering.detectors.base import Item
from halsift.training.detector_config import VLM_TARGETS, DetectorTrainConfig

_EPS = 1e-4
PREFIX_CACHE_BYTES = 1 << 30  # per process: a bench's processed train images (the quickstart's: ~3 MB)


def judge_scores(det, logits: torch.Tensor) -> torch.Tensor:
    """Scores (0-100, ``[B]``) from the last ``k`` logits ``[B, k, V]``, as ``det._scores_from_logits`` but on
    tensors (so gradients flow)."""
    probs = logits.float().softmax(-1)
    if det.mode == "yes_prob":
        py = probs[:, -1, det.yes_ids].sum(-1)
        pn = probs[:, -1, det.no_ids].sum(-1)
        return 100 * py / (py + pn).clamp_min(1e-30)
    ids = det.number_ids

    def mass(p, n):
        return p[:, ids[n]].sum(-1)

    if det.number_mode == "single":
        m = torch.stack([mass(probs[:, -1], n) for n in range(101)], -1)
        m = m / m.sum(-1, keepdim=True).clamp_min(1e-30)
        return (m * torch.arange(101, dtype=m.dtype, device=m.device)).sum(-1)
    p1 = torch.stack([mass(probs[:, 0], d) for d in range(10)], -1)
    p1 = p1 / p1.sum(-1, keepdim=True).clamp_min(1e-30)
    q = torch.stack([mass(probs[:, 1], d) for d in range(10)], -1)
    q_end = (1 - q.sum(-1)).clamp_min(0)
    r0 = mass(probs[:, 2], 0)
    v1 = q_end + (q[:, 1:] * torch.arange(11, 20, dtype=q.dtype, device=q.device)).sum(-1) \
        + q[:, 0] * (r0 * 100 + (1 - r0) * 10)
    v = (torch.arange(10, dtype=p1.dtype, device=p1.device) * 10 + 4.5).expand_as(p1)
    v = torch.cat([torch.zeros_like(v[:, :1]), v1[:, None], v[:, 2:]], -1)
    return (p1 * v).sum(-1)


def judge_logits(det, logits: torch.Tensor) -> torch.Tensor:
    """Binary logits whose sigmoid is the judge's score / 100 (exact log-odds for ``yes_prob``)."""
    if det.mode == "yes_prob":
        logp = logits[:, -1].float().log_softmax(-1)
        return torch.logsumexp(logp[:, det.yes_ids], -1) - torch.logsumexp(logp[:, det.no_ids], -1)
    p = (judge_scores(det, logits) / 100).clamp(_EPS, 1 - _EPS)
    return torch.log(p) - torch.log1p(-p)


class JudgeModule(nn.Module):
    """The (LoRA-injected) VLM; ``forward(**batch)`` returns one binary logit per row."""

    def __init__(self, model: nn.Module, det) -> None:
        super().__init__()
        self.model = model
        self._det = [det]  # not a submodule: the detector only lends its token tables
        self.k = 3 if det.mode == "logits" and det.number_mode == "digits" else 1

    def forward(self, **batch) -> torch.Tensor:
        logits = self.model(**batch, use_cache=False, logits_to_keep=self.k).logits[:, -self.k:]
        return judge_logits(self._det[0], logits)


class VlmTask:
    """The ``vlm`` half of a ``train detector`` run (see :func:`halsift.training.detector_train.build_task`)."""

    kind = "vlm"

    def __init__(self, cfg: DetectorTrainConfig) -> None:
        from peft import LoraConfig, get_peft_model

        from halsift.filtering.detectors.spec import format_spec, load_detector, parse_spec
        from halsift.filtering.detectors.vlm import VlmDetector
        from halsift.training.detector_config import absolute_spec

        family, opts = parse_spec(absolute_spec(cfg.base))
        if family != "vlm":
            raise ValueError(f"base: {cfg.base!r} is not a vlm detector spec")
        opts["mode"] = cfg.mode or opts.get("mode") or "yes_prob"
        if opts["mode"] not in ("yes_prob", "logits"):
            raise ValueError(f"mode: a judge is trained in mode yes_prob or logits, not {opts['mode']!r}")
        opts.setdefault("device", "cpu")  # the training loop moves the model to its accelerator device
        det = load_detector(format_spec("vlm", opts))
        assert isinstance(det, VlmDetector)
        self.det, self.base_spec = det, det.spec
        if not torch.cuda.is_available():
            det.model.float()
        names = {n.rsplit(".", 1)[-1] for n, _ in det.model.named_modules()}
        targets = [t for t in (cfg.target_modules or VLM_TARGETS) if t in names]
        if not targets:
            raise ValueError(f"target_modules: none of {cfg.target_modules or VLM_TARGETS} is a module of "
                             f"{type(det.model).__name__}")
        missing = [m for m in cfg.modules_to_save if m not in names]
        if missing:
            raise ValueError(f"modules_to_save: {missing} not found in {type(det.model).__name__}")
        lcfg = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                          target_modules=targets, modules_to_save=list(cfg.modules_to_save) or None)
        self.targets = targets
        self.peft = get_peft_model(det.model, lcfg)
        self.module = JudgeModule(self.peft.base_model.model, det)
        self._prefixes = BudgetedMemo(PREFIX_CACHE_BYTES)  # a train image's processor features: made once

    def param_groups(self, cfg: DetectorTrainConfig) -> list[dict]:
        return [{"params": [p for p in self.module.parameters() if p.requires_grad]}]

    def collate(self, examples: Sequence[tuple[Item, int]]) -> dict:
        """The detector's own full-sequence inputs (left-padded prefix + continuation) and the labels."""
        det = self.det
        prefixes = [self._prefix(it) for it, _ in examples]
        conts = [det.continuation_ids(it) for it, _ in examples]
        batch = det.judge.full_batch(prefixes, conts)
        batch["labels"] = torch.tensor([y for _, y in examples], dtype=torch.float32)
        return batch

    def _prefix(self, it: Item) -> dict:
        """``det.prefix_inputs`` of the item's image, kept while the kept features fit :data:`PREFIX_CACHE_BYTES`
        (the processor is deterministic and ``full_batch`` only reads them)."""
        return self._prefixes.get((it.image_id or it.key, it.meta.get("image_path")),
                                  lambda: self.det.prefix_inputs(it.image))

    def forward(self, model: nn.Module, batch: dict, device) -> torch.Tensor:
        return model(**{k: v.to(device) for k, v in batch.items()})

    def detector(self, module: JudgeModule):
        self.det.model = module.model
        self.det.device = next(module.parameters()).device
        return self.det

    def export(self, folder: Path) -> dict:
        from halsift.filtering.models.lora_adapters import save_adapter

        save_adapter(self.peft, folder)
        return {"kind": "vlm", "base": self.base_spec, "adapter": True, "mode": self.det.mode,
                "target_modules": self.targets}

    def load_export(self, folder: Path) -> None:
        from peft import set_peft_model_state_dict

        from halsift.corpus.weights import read_safetensors

        set_peft_model_state_dict(self.peft, read_safetensors(folder / "adapter_model.safetensors", "adapter"))

    def export_merged(self, folder: Path) -> None:
        """``merged/``: the merged model + processor (``save_pretrained``) and a detector.yaml without adapter."""
        import copy

        from halsift.filtering.models.lora_adapters import write_description
        from halsift.filtering.detectors.spec import format_spec, parse_spec

        folder.mkdir(parents=True, exist_ok=True)
        merged = copy.deepcopy(self.peft).merge_and_unload()
        merged.save_pretrained(str(folder))
        self.det.processor.save_pretrained(str(folder))
        family, opts = parse_spec(self.base_spec)
        opts["model"] = "./"
        write_description(folder, {"kind": "vlm", "base": format_spec(family, opts), "adapter": False,
                                   "mode": self.det.mode})


__all__ = ["JudgeModule", "VlmTask", "judge_logits", "judge_scores"]
