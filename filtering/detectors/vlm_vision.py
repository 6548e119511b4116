"""Qwen2-VL's vision tower with one attention call for a batch of equal-size images.

transformers runs Qwen2-VL's vision attention (without flash attention) as one SDPA call per image, after reading
the images' lengths back from the GPU in every layer: 32 layers x 64 images are 2,048 calls and 32 host syncs per
batch, and the 2B judge waits on those launches. When every image of a batch has the same number of patches (a
processor that resizes to one size, or the judge's buckets of equal prefixes), the images' queries, keys and
values are one ``[images, heads, patches, dim]`` batch: :func:`equal_size_attention` runs them in one SDPA call per
layer, with the module's own projections and its rotary embedding (in float32 like transformers', in fewer
passes), so the numbers are the same up to float rounding.
Anything else (other architectures, flash/eager attention, unequal images) keeps the model's own code.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator


def _attention_modules(model: Any) -> list:
    inner = getattr(model, "model", None)
    vis = getattr(inner, "visual", None)
    blocks = getattr(vis, "blocks", None)
    if vis is None or blocks is None or type(vis).__name__ != "Qwen2VisionTransformerPretrainedModel":
        return []
    attns = [getattr(b, "attn", None) for b in blocks]
    ok = all(type(a).__name__ == "VisionAttention" and hasattr(a, "qkv") and hasattr(a, "proj") for a in attns)
    impl = getattr(getattr(vis, "config", None), "_attn_implementation", None)
    return attns if ok and impl == "sdpa" else []


def _rope(qk, cos, sin):
    """transformers' ``apply_rotary_pos_emb_vision`` on queries and keys at once (``[2, n, heads, dim]``), in
    float32 like it, in four passes instead of ten: ``x * cos + rotate_half(x) * sin`` with the rotation written
    as two multiply-adds on the halves."""
    x = qk.float()
    cos, sin = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()
    h = x.shape[-1] // 2
    out = x * cos
    out[..., :h].addcmul_(x[..., h:], sin[..., :h], value=-1)
    out[..., h:].addcmul_(x[..., :h], sin[..., h:])
    return out.to(qk.dtype)


def _batched_forward(attn: Any, patches: int, hidden_states, cu_seqlens, position_embeddings=None, **kwargs):
    """``VisionAttention.forward`` for images of ``patches`` patches each: one SDPA call over all of them."""
    import torch.nn.functional as F

    n = hidden_states.shape[0]
    if n % patches or position_embeddings is None:
        return type(attn).forward(attn, hidden_states, cu_seqlens, position_embeddings=position_embeddings, **kwargs)
    qkv = attn.qkv(hidden_states).reshape(n, 3, attn.num_heads, -1).permute(1, 0, 2, 3)
    q, k = _rope(qkv[:2], *position_embeddings).unbind(0)
    v = qkv[2]
    images = n // patches
    q, k, v = (t.reshape(images, patches, attn.num_heads, -1).transpose(1, 2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, scale=attn.scaling)  # [images, heads, patches, dim]
    return attn.proj(out.transpose(1, 2).reshape(n, -1))


def equal_patches(grid) -> int | None:
    """Patches per image when every image of ``grid`` (``image_grid_thw`` as a list of ``[t, h, w]``, or processor
    features holding it) has the same number, else ``None``."""
    if grid is not None and not isinstance(grid, list):  # processor features
        grid = grid.get("image_grid_thw")
        grid = None if grid is None else grid.tolist()
    if not grid:
        return None
    sizes = {t * h * w for t, h, w in grid}
    return sizes.pop() if len(sizes) == 1 else None


@contextmanager
def equal_size_attention(model: Any, patches: int | None) -> Iterator[bool]:
    """While active, ``model``'s Qwen2-VL vision attention runs one SDPA call per layer for images of ``patches``
    patches each (yields whether it does: ``False`` for other models and settings, which run as they are)."""
    attns = _attention_modules(model) if patches else []
    for a in attns:
        a.forward = lambda *args, _a=a, **kw: _batched_forward(_a, patches, *args, **kw)
    try:
        yield bool(attns)
    finally:
        for a in attns:
            a.__dict__.pop("forward", None)


__all__ = ["equal_patches", "equal_size_attention"]
