"""halsift's LoRA adapter folders (written by ``halsift train detector``, read by the ``lora`` detector)::

    detector.yaml               format, kind (clip|vlm), base (the base detector spec), mode, step, val_auroc ...
    adapter_config.json         peft LoraConfig
    adapter_model.safetensors   the LoRA weights
    head.safetensors            clip only: the binary head (:mod:`halsift.filtering.detectors.lora`)

:func:`read_description` / :func:`write_description` own ``detector.yaml``; :func:`apply_adapter` injects the peft
adapter into a base model. Missing or corrupt files raise errors naming them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from halsift.corpus.weights import read_safetensors

FORMAT = "halsift-lora-detector/1"
KINDS = ("clip", "vlm")


DESCRIPTION = "detector.yaml"  # an adapter (or merged) folder's description, read by read_description


def save_adapter(peft_model: Any, folder: Path) -> None:
    """peft's ``save_pretrained`` of ``peft_model`` into ``folder``, with ``adapter_config.json``'s
    ``target_modules`` (a set to peft) in sorted order: peft writes a set in the order of this process's string
    hashes, so two identical trainings would write different files and every score made with the adapter would
    count as made by another detector (:func:`~halsift.corpus.fingerprint.spec_fingerprint` hashes the folder)."""
    import json

    from halsift.corpus.atomic import write_text_atomic

    peft_model.save_pretrained(str(folder))
    path = Path(folder) / "adapter_config.json"
    config = json.loads(path.read_text())
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
        write_text_atomic(path, json.dumps(config, indent=2, sort_keys=True))


def write_description(folder: Path, fields: dict) -> Path:
    """Write ``folder/detector.yaml``: the format tag first, then ``fields`` (kind, base, adapter, ...), in order."""
    import yaml

    from halsift.corpus.atomic import write_text_atomic

    path = folder / DESCRIPTION
    write_text_atomic(path, yaml.safe_dump({"format": FORMAT, **fields}, sort_keys=False))
    return path


def read_description(folder: Path) -> dict:
    """``detector.yaml`` of an adapter folder, checked; errors name the file and the field."""
    import yaml

    from halsift.corpus.safe_yaml import safe_load_yaml, short_repr

    path = folder / DESCRIPTION
    if not path.is_file():
        raise FileNotFoundError(f"lora detector: {path} is missing (expected the adapter/ folder written by "
                                "`halsift train detector`)")
    try:
        desc = safe_load_yaml(path.read_text())  # alias expansion capped
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(desc, dict):
        raise ValueError(f"{path}: expected a mapping with kind, base and adapter fields")
    if desc.get("kind") not in KINDS:
        raise ValueError(f"{path}: field 'kind' must be one of {KINDS}, got {short_repr(desc.get('kind'))}")
    if not isinstance(desc.get("base"), str) or not desc["base"]:
        raise ValueError(f"{path}: field 'base' must be a detector spec string (e.g. clip:arch=...)")
    return desc


def apply_adapter(model: Any, folder: Path, merge: bool = False) -> Any:
    """Inject the peft LoRA adapter of ``folder`` into ``model`` (in place); returns the model to score with
    (the merged, unwrapped model with ``merge``). Missing or corrupt files raise errors naming them."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

    cfg_path, w_path = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise FileNotFoundError(f"lora detector: {p} is missing (an adapter folder holds adapter_config.json "
                                    "and adapter_model.safetensors)")
    try:
        config = LoraConfig.from_pretrained(str(folder))
    except Exception as e:  # json errors, unknown fields, wrong peft type
        raise ValueError(f"{cfg_path}: not a valid peft LoRA config ({type(e).__name__}: {e})") from None
    state = read_safetensors(w_path, "adapter")
    try:
        peft_model = get_peft_model(model, config)
    except ValueError as e:
        raise ValueError(f"{cfg_path}: its target modules do not fit the base model ({e})") from None
    expected = set(get_peft_model_state_dict(peft_model))
    if set(state) != expected:
        miss, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        raise ValueError(f"{w_path}: does not match the base model and {cfg_path.name} "
                         f"(missing {miss[:2]}, unexpected {extra[:2]})")
    set_peft_model_state_dict(peft_model, state)
    for p in peft_model.parameters():
        p.requires_grad_(False)
    if merge:
        return peft_model.merge_and_unload()
    return peft_model.base_model.model


__all__ = ["DESCRIPTION", "FORMAT", "KINDS", "apply_adapter", "read_description", "write_description"]
