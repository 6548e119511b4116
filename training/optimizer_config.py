"""One optimizer section for every trainer (``train clip``, ``train detector``, caption pre-training, the world's
judge): AdamW's settings and the learning-rate schedule, declared, checked and built here once.

A trainer's settings class subclasses :func:`optimizer_section`, naming the fields it offers with its own
defaults; their YAML keys are the field names, flat in the trainer's section (``lr``, ``wd``, ``beta1``, ...), or
with a prefix (the world judge's ``pretrain_lr`` / ``judge_lr``). A field a trainer does not offer takes the value
it fixes (``fixed=``), else AdamW's own default. No torch import until :meth:`OptimizerSettings.build_optimizer`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from halsift.corpus.config import check_ranges, field

SCHEDULES = ("cosine", "linear_floor")
FIELDS: dict[str, tuple[type, str]] = {  # name -> (type, help)
    "lr": (float, "peak learning rate (AdamW)"),
    "wd": (float, "weight decay"),
    "beta1": (float, "AdamW beta1"),
    "beta2": (float, "AdamW beta2"),
    "eps": (float, "AdamW epsilon"),
    "warmup": (int, "linear warmup steps, then the schedule's decay"),
    "schedule": (str, "after warmup: cosine (decay to 0) | linear_floor (linear decay to 5% of the peak at the "
                      "last step)"),
}
RANGES = {"lr": "[0, inf)", "wd": "[0, inf)", "beta1": "[0, 1)", "beta2": "[0, 1)", "eps": "(0, inf)",
          "warmup": "[0, inf)"}  # each field's declared range (corpus/ranges.py): NaN and inf are refused
ADAMW = {"lr": 1e-3, "wd": 0.0, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "warmup": 0, "schedule": "cosine"}


@dataclasses.dataclass
class OptimizerSettings:
    """The optimizer fields of one trainer (see the module docstring); subclass through :func:`optimizer_section`."""

    FIXED: ClassVar[dict[str, Any]] = {}  # values of the fields the trainer does not offer
    PREFIX: ClassVar[str] = ""

    def optimizer(self) -> dict[str, Any]:
        """Every optimizer setting by its plain name: the offered fields' values, the fixed ones for the rest."""
        out = {**ADAMW, **self.FIXED}
        for name in FIELDS:
            if hasattr(self, self.PREFIX + name):
                out[name] = getattr(self, self.PREFIX + name)
        return out

    def check_optimizer(self) -> None:
        """Raise ValueError naming the field on a bad value: the declared ranges (:data:`RANGES`, also for settings
        built in Python rather than by :func:`~halsift.corpus.config.from_dict`), then the schedule."""
        check_ranges(self)
        o = self.optimizer()
        if o["schedule"] not in SCHEDULES:
            raise ValueError(f"{self.PREFIX}schedule: expected one of {SCHEDULES}, got {o['schedule']!r}")

    def build_optimizer(self, params, steps: int, fused: bool = False):
        """``(AdamW over params, its LambdaLR schedule over steps)``; ``params`` may be parameter groups (a
        group's own ``weight_decay`` / ``lr`` wins)."""
        import torch

        o = self.optimizer()
        kw = {"fused": True} if fused else {"foreach": True}  # torch's CPU default is the per-tensor loop: the
        # same arithmetic per element (weights bit-equal, tested), one kernel per step for all tensors
        optimizer = torch.optim.AdamW(params, lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"],
                                      weight_decay=o["wd"], **kw)
        return optimizer, lr_schedule(optimizer, o["schedule"], o["warmup"], steps)


def lr_schedule(optimizer, schedule: str, warmup: int, steps: int):
    """``cosine``: linear warmup to the peak, cosine decay to 0 at ``steps``; ``linear_floor``: warmup times a
    linear decay to 5% of the peak at the last step."""
    import torch

    from halsift.training.engine import cosine_with_warmup

    if schedule == "cosine":
        return cosine_with_warmup(optimizer, warmup, steps)
    warm = max(1, warmup)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warm) * max(0.05, 1 - s / steps))


def optimizer_field(name: str, default: Any, help: str = "") -> Any:
    """The dataclass field of optimizer setting ``name`` (a key of :data:`FIELDS`) with ``default``; ``help``
    replaces the common help text (e.g. to say which trainer a prefixed field feeds)."""
    return field(default, help=help or FIELDS[name][1], range=RANGES.get(name))


def optimizer_section(name: str, *, prefix: str = "", help: dict[str, str] | None = None,
                      fixed: dict[str, Any] | None = None, **defaults: Any) -> type:
    """A dataclass base (``name``) holding the optimizer fields given in ``defaults`` (each with that default,
    named ``prefix + field``; help from :data:`FIELDS` unless ``help`` overrides it); ``fixed`` sets the fields it
    does not offer."""
    unknown = sorted((set(defaults) | set(fixed or {}) | set(help or {})) - set(FIELDS))
    if unknown:
        raise TypeError(f"optimizer_section: unknown optimizer fields {unknown}; expected some of {list(FIELDS)}")
    fields = [(prefix + k, FIELDS[k][0], optimizer_field(k, v, (help or {}).get(k, ""))) for k, v in defaults.items()]
    ns = {"FIXED": dict(fixed or {}), "PREFIX": prefix, "__doc__": f"Optimizer fields of {name}."}
    return dataclasses.make_dataclass(name, fields, bases=(OptimizerSettings,), namespace=ns)


__all__ = ["ADAMW", "FIELDS", "RANGES", "OptimizerSettings", "SCHEDULES", "lr_schedule", "optimizer_field", "optimizer_section"]
