"""A model folder that plain open_clip loads: ``open_clip.create_model_and_transforms("local-dir:FOLDER")``.

open_clip (>= 3.0) reads ``local-dir:`` folders holding ``open_clip_config.json`` (``{"model_cfg": ...,
"preprocess_cfg": ...}``, the layout of its Hugging Face Hub uploads) and the weights
(``open_clip_model.safetensors``). Writing the architecture's config beside the weights makes a model of an
architecture open_clip does not ship (``halsift-tiny``) load without halsift, and pins the preprocessing the
model was trained with. Used by ``train clip``'s ``final/`` and the LoRA detector's ``merged/`` folder.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch

CONFIG_NAME = "open_clip_config.json"
WEIGHTS_NAME = "open_clip_model.safetensors"


def model_config(arch: str, model: torch.nn.Module | None = None) -> dict:
    """open_clip's ``model_cfg`` of ``arch`` (a built-in or halsift name, ``local-dir:`` or cached ``hf-hub:``).

    With ``model``: a model that holds a ``logit_bias`` (a SigLIP-loss fine-tune of an arch without one) gets
    ``init_logit_bias`` so that open_clip creates the parameter the weights fill."""
    import open_clip

    from halsift.filtering.models.clip_models import register_builtin_configs

    register_builtin_configs()
    cfg = open_clip.get_model_config(arch)
    if not cfg:
        raise ValueError(f"model: no open_clip config for {arch!r} (see open_clip.list_models())")
    cfg = dict(cfg)
    bias = getattr(model, "logit_bias", None) if model is not None else None
    if isinstance(bias, torch.Tensor) and cfg.get("init_logit_bias") is None:
        cfg["init_logit_bias"] = float(bias.detach().float().reshape(-1)[0])
    return cfg


def preprocess_config(model: torch.nn.Module) -> dict:
    """The image preprocessing open_clip attached to ``model`` (size, mean, std, interpolation, resize mode)."""
    import open_clip

    cfg = dict(open_clip.get_model_preprocess_cfg(model))
    return json.loads(json.dumps(cfg))  # tuples -> lists: what json.load gives back


def write_open_clip_folder(model: torch.nn.Module, arch: str, folder: str | Path, tokenizer: Any = None) -> Path:
    """Write ``folder/open_clip_model.safetensors`` and ``folder/open_clip_config.json`` (and a Hugging Face
    tokenizer's files when the arch names one), so that ``local-dir:FOLDER`` loads in plain open_clip; returns
    the config's path."""
    from halsift.training.engine import save_state_dict_safetensors

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_state_dict_safetensors(model, folder / WEIGHTS_NAME)
    cfg = model_config(arch, model)
    path = folder / CONFIG_NAME
    path.write_text(json.dumps({"model_cfg": cfg, "preprocess_cfg": preprocess_config(model)}, indent=2) + "\n",
                    encoding="utf-8")
    if cfg.get("text_cfg", {}).get("hf_tokenizer_name"):  # local-dir: reads the tokenizer from the folder
        save = getattr(tokenizer, "save_pretrained", None)
        if save is None:
            warnings.warn(f"{folder}: the tokenizer of {arch!r} could not be saved; local-dir:{folder} needs "
                          "its files (tokenizer.save_pretrained)", stacklevel=2)
        else:
            save(str(folder))
    return path


__all__ = ["CONFIG_NAME", "WEIGHTS_NAME", "model_config", "preprocess_config", "write_open_clip_folder"]
