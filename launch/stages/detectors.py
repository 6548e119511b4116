"""The detectors stage: train each ``detectors`` entry (LoRA detector or the world's VLM judge)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from halsift.corpus.config import ConfigError
from halsift.launch.stages.base import Paths, Stage

if TYPE_CHECKING:
    from halsift.launch.recipe_config import Recipe


def trained_spec(r: Recipe, p: Paths, name: str) -> str:
    """The ``lora:DIR`` spec the detectors stage produces for ``detectors.NAME``; with ``trust_remote_code=true``
    when the recipe's own ``detectors.NAME.base`` has it (the adapter folder's ``detector.yaml`` never grants it)."""
    out = p.named("detectors", name)
    if r.detectors[name].kind == "world_judge":
        from halsift.synth.world_judge_config import world_judge_spec

        return world_judge_spec(out, trained_configs(r, p)[name])
    return f"lora:{out / 'adapter'}" + (",trust_remote_code=true" if _base_grants_remote_code(r, p, name) else "")


def _base_grants_remote_code(r: Recipe, p: Paths, name: str) -> bool:
    from halsift.filtering.detectors.spec import parse_spec

    subs = {"run_dir": str(p.run), "base": p.base, "arch": r.model.arch}
    try:
        _, opts = parse_spec(substitute(r.detectors[name].base, f"detectors.{name}.base", subs))
    except ValueError:  # a malformed base is reported by the detectors stage's own validation
        return False
    return opts.get("trust_remote_code") is True


def substitute(spec: str, where: str, subs: dict) -> str:
    """``spec`` with its ``{placeholders}`` filled from ``subs``; an unknown or bad one is a ConfigError naming
    ``where``."""
    try:
        return spec.format(**subs)
    except KeyError as e:
        raise ConfigError(f"{where}: unknown placeholder {{{e.args[0]}}}; known: {sorted(subs)}") from None
    except (ValueError, IndexError) as e:
        raise ConfigError(f"{where}: bad placeholder in {spec!r} ({e})") from None


def trained_configs(r: Recipe, p: Paths) -> dict:
    """``detectors.NAME`` -> a validated ``DetectorTrainConfig`` (lora) or ``WorldJudgeSettings`` (world_judge)."""
    from halsift.corpus.config import from_dict
    from halsift.training.detector_config import DetectorTrainConfig
    from halsift.synth.world_judge_config import WorldJudgeSettings

    subs = {"run_dir": str(p.run), "base": p.base, "arch": r.model.arch}
    out = {}
    for name, t in r.detectors.items():
        where = f"detectors.{name}.options"
        if t.kind == "world_judge":  # string options may name {base} / {arch} (vision_from, vision_arch)
            opts = {k: substitute(v, f"{where}.{k}", subs) if isinstance(v, str) else v
                    for k, v in t.options.items()}
            out[name] = from_dict(WorldJudgeSettings, opts, prefix=where)
            continue
        if not p.bench:
            raise ConfigError(f"detectors.{name}: kind lora trains on a bench; set data.bench")
        fixed = {"base": substitute(t.base, f"detectors.{name}.base", subs), "bench": p.bench,
                 "out": str(p.named("detectors", name)), "seed": r.seed, "resume": True,
                 "wandb_mode": r.wandb.mode, "wandb_project": r.wandb.project, "wandb_run": f"{r.name}-{name}"}
        out[name] = from_dict(DetectorTrainConfig, {**fixed, **t.options}, prefix=where)
    return out


def stage_detectors(r: Recipe, p: Paths) -> dict:
    """Train each ``detectors`` entry (a finished one is reused: its adapter, or the judge's cache record)."""
    from halsift.training.detector_train import train_detector
    from halsift.synth.world_judge import build_world_judge

    info = {}
    for name, cfg in trained_configs(r, p).items():
        spec = trained_spec(r, p, name)
        out = p.named("detectors", name)
        started = time.time()
        if r.detectors[name].kind == "world_judge":
            built = build_world_judge(p.stage("world"), out, seed=r.seed, settings=cfg, show_progress=True)
            assert built == spec, (built, spec)
        elif not (out / "adapter" / "detector.yaml").exists():
            train_detector(cfg)
        print(f"[halsift run] detectors.{name}: {spec} ({time.time() - started:.1f}s)")
        info[name] = spec
    return {"trained": info}


STAGE = Stage("detectors", ("detectors",), stage_detectors)
