"""Hugging Face vision-language models (``AutoModelForImageTextToText`` + ``AutoProcessor``) by local path or hub
name: the one loader behind the VLM judge, the LoRA-tuned VLM detectors and caption pre-training.

``trust_remote_code`` stays off unless the caller passes it (the detector spec's trust rule decides:
:mod:`halsift.filtering.detectors.trust`); a checkpoint that lacks weights of the architecture is refused instead
of being scored with those weights initialised at random.
"""

from __future__ import annotations

from typing import Any

DTYPES = ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16")


def torch_dtype(dtype: str) -> Any:
    """``"bf16"`` -> ``torch.bfloat16`` (``"auto"`` stays ``"auto"``); anything else is a ValueError naming it."""
    import torch

    table = {"auto": "auto", "float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise ValueError(f"dtype={dtype!r}: expected one of {sorted(table)}")
    return table[dtype]


def load_vlm(model: str, *, dtype: str = "auto", device_map: str | None = None,
             attn_implementation: str | None = None, trust_remote_code: bool = False) -> tuple[Any, Any]:
    """``(model, processor)`` of ``model`` (a local path or hub name). A model that cannot be loaded, or whose
    checkpoint misses weights, raises ValueError naming it."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    kw: dict[str, Any] = {"dtype": torch_dtype(dtype), "trust_remote_code": bool(trust_remote_code)}
    if device_map:
        kw["device_map"] = device_map
    if attn_implementation:
        kw["attn_implementation"] = attn_implementation
    try:
        processor = AutoProcessor.from_pretrained(model, trust_remote_code=bool(trust_remote_code))
        net, info = AutoModelForImageTextToText.from_pretrained(model, output_loading_info=True, **kw)
    except (OSError, ValueError) as e:
        raise ValueError(f"model={model!r}: cannot load a vision-language model and processor ({e})") from e
    missing = sorted(info.get("missing_keys") or [])
    if missing:  # transformers would score with these initialised at random: never silently
        raise ValueError(f"model={model!r}: {len(missing)} weight(s) are not in its checkpoint (e.g. "
                         f"{', '.join(missing[:3])}) and would be randomly initialised; give a complete checkpoint")
    return net, processor


__all__ = ["DTYPES", "load_vlm", "torch_dtype"]
