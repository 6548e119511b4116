"""open_clip models by name, tag, weights file or checkpoint: the one loader behind the CLIP detector, ``embed``,
training, retrieval/zero-shot evaluation and the world judge's vision tower.

:func:`load_clip` is the full rule (architecture checked, random weights only by name, ``.safetensors`` only, a
SigLIP fine-tune's ``logit_bias`` created before loading, a checkpoint of another architecture refused in one line);
:func:`load_open_clip` is ``open_clip.create_model_and_transforms`` with halsift's configs registered.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any, NamedTuple

from halsift.corpus.weights import WeightsFormatError, read_safetensors, require_safetensors
from halsift.filtering.models.clip_tokenizer import get_tokenizer

_CONFIG_DIR = Path(__file__).parent / "model_configs"  # halsift-tiny.json (package data)
_registered = False
SCHEMAS = ("hf-hub:", "local-dir:")  # open_clip model names that carry their own config and weights
RANDOM = "random"  # pretrained=random: a seeded random init, asked for by name


def check_weights(arch: str, pretrained: Any = None, checkpoint: Any = None) -> None:
    """Random weights only when asked for by name: a ValueError unless ``pretrained`` or ``checkpoint`` is given
    (``pretrained=random`` for a seeded random init) or ``arch`` carries its weights (``hf-hub:``/``local-dir:``).
    Light: the dry run of a recipe calls it without loading anything."""
    if not (str(arch).startswith(SCHEMAS) or pretrained or checkpoint):
        raise ValueError(f"arch={arch!r}: no pretrained= or checkpoint= given, so it would score with random weights; "
                         f"give pretrained=<tag|file> or checkpoint=<file>, or pretrained={RANDOM} to ask for a random "
                         "init")


def _load_error(what: str, e: Exception) -> str:
    """One line for weights that could not be loaded: the name, open_clip's reason, and what to do."""
    reason = (str(e).splitlines() or [type(e).__name__])[0][:240]
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")
    return (f"{what}: weights could not be loaded ({reason})"
            + ("; HF_HUB_OFFLINE is set, so they must already be in the Hugging Face cache" if offline else "")
            + "; download them once, or give checkpoint=PATH to a local file")


def register_builtin_configs() -> None:
    """Add halsift's tiny open_clip configs (``halsift-tiny``) to open_clip's registry, once."""
    global _registered
    if not _registered:
        import open_clip

        open_clip.add_model_config(_CONFIG_DIR)
        _registered = True


def load_open_clip(arch: str, pretrained: str | None = None, device="cpu", **kw):
    """``open_clip.create_model_and_transforms`` with halsift's configs registered, for every stage that loads an
    open_clip model (the detector, training, evaluation, the world judge's vision tower): one behaviour for all.

    ``pretrained`` is an open_clip tag or a weights file, which must be a ``.safetensors`` file (a pickle is
    refused, never loaded: :func:`halsift.corpus.weights.require_safetensors`). A ``.safetensors`` file that
    stores ``logit_bias`` (a SigLIP-loss fine-tune of an arch without one) gets the parameter created before loading
    (``init_logit_bias``, overwritten by the stored value), so such checkpoints load everywhere."""
    import open_clip

    register_builtin_configs()
    if pretrained and os.path.isfile(pretrained):
        require_safetensors(pretrained, "pretrained")
        kw = {**siglip_kwargs(pretrained), **kw}
    return open_clip.create_model_and_transforms(arch, pretrained=pretrained, device=device, **kw)


def siglip_kwargs(weights: str | os.PathLike) -> dict:
    """``{"init_logit_bias": -10.0}`` when the safetensors file ``weights`` stores a ``logit_bias``, else ``{}``."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(weights), framework="pt") as f:
            return {"init_logit_bias": -10.0} if "logit_bias" in f.keys() else {}
    except SafetensorError as e:
        raise SafetensorError(f"{weights}: not a valid safetensors file ({e})") from None


@contextlib.contextmanager
def _quiet_create(loading_checkpoint: bool):
    """While open_clip builds the model: drop its error log of a failed download (we raise one line of our own)
    and, when a checkpoint is loaded right after, its "No pretrained weights loaded" warning."""

    class _Drop(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if record.levelno >= logging.ERROR:
                return False
            return not (loading_checkpoint and "No pretrained weights loaded" in record.getMessage())

    root, drop = logging.getLogger(), _Drop()
    root.addFilter(drop)
    try:
        yield
    finally:
        root.removeFilter(drop)


def _trimmable_text(model) -> bool:
    """Whether padding can be cut from a batch's tokens without changing the text embedding: open_clip's built-in
    text tower (``CLIP``) with a causal mask, so no token attends to the padding after it, pooled at the end-of-text
    (``argmax``/``eos``) or first token. Not SigLIP-style towers (no causal mask) nor ``last``-token pooling."""
    return (getattr(model, "attn_mask", None) is not None and hasattr(model, "token_embedding")
            and hasattr(model, "positional_embedding") and hasattr(model, "ln_final")
            and getattr(model, "text_pool_type", None) in ("argmax", "eos", "first"))


def used_positions(tokens) -> int:
    """The positions the longest of ``tokens`` (``[N, L]``, pad id 0) uses: what :func:`encode_text` keeps. Worth
    computing on the CPU copy of the tokens: on a GPU it waits for every kernel queued before it."""
    used = (tokens != 0).any(0).nonzero()
    return int(used.max()) + 1 if len(used) else 1


def encode_text(model, tokens, used: int | None = None):
    """``model.encode_text(tokens)`` on only the positions the batch's longest text uses (pad id 0), when the tower
    allows it (:func:`_trimmable_text`): the same embeddings up to float rounding (~1e-6, tested) for ~1/5 of the
    text compute on captions' sentences (~15 of 77 tokens). Hand-written because open_clip's ``CLIP.encode_text`` always
    adds all ``context_length`` positional embeddings; it follows that method step by step. ``used``: the count
    :func:`used_positions` gives, computed beforehand (on the CPU tokens: no device sync here)."""
    import torch
    from open_clip.transformer import text_global_pool

    if not _trimmable_text(model) or getattr(tokens, "ndim", 0) != 2:
        return model.encode_text(tokens)
    n = used if used is not None else used_positions(tokens)
    if n >= tokens.shape[1]:
        return model.encode_text(tokens)
    tokens = tokens[:, :n]
    cast = model.transformer.get_cast_dtype()
    x = model.token_embedding(tokens).to(cast) + model.positional_embedding[:n].to(cast)
    x = model.ln_final(model.transformer(x, attn_mask=model.attn_mask[:n, :n]))
    eos = getattr(model, "text_eos_id", None)
    x = text_global_pool(x, tokens, model.text_pool_type, **({"eos_token_id": eos} if eos is not None else {}))
    proj = model.text_projection
    if proj is None:
        return x
    return proj(x) if isinstance(proj, torch.nn.Linear) else x @ proj


class ClipBundle(NamedTuple):
    """What :func:`load_clip` returns: the model (eval mode, on CPU), its image transform and its tokenizer."""

    model: Any
    preprocess: Any
    tokenizer: Any


def load_clip(arch: str, pretrained: str | None = None, checkpoint: str | None = None, seed: int = 0) -> ClipBundle:
    """Build open_clip ``arch`` with ``pretrained`` (an open_clip tag, a ``.safetensors`` file, or ``random``: a
    random init seeded by ``seed``) or ``checkpoint`` (fine-tuned ``.safetensors`` weights loaded over a random init),
    or an ``hf-hub:``/``local-dir:`` name that carries its weights. Every failure is a ValueError naming the option
    (a pickle: :class:`WeightsFormatError`, never unpickled)."""
    import open_clip
    import torch
    from safetensors import SafetensorError

    register_builtin_configs()
    schema = arch.startswith(SCHEMAS)
    if not schema and arch not in open_clip.list_models():
        raise ValueError(f"arch={arch!r}: not an open_clip architecture (see open_clip.list_models()) nor an "
                         "hf-hub:org/repo or local-dir:PATH name")
    if schema and pretrained:
        raise ValueError(f"pretrained={pretrained!r}: not used with arch={arch!r} (its weights come with it)")
    if pretrained and checkpoint:
        raise ValueError("give pretrained= or checkpoint=, not both")
    check_weights(arch, pretrained, checkpoint)
    if pretrained == RANDOM:
        pretrained = None
    if checkpoint and not Path(checkpoint).exists():
        raise ValueError(f"checkpoint={checkpoint!r}: file does not exist")
    if checkpoint:
        require_safetensors(checkpoint, "checkpoint")  # a pickle is refused here, never unpickled
    what = f"arch={arch!r}" if schema else f"pretrained={pretrained!r} of arch={arch!r}"
    extra = {}
    if checkpoint:
        try:
            extra = siglip_kwargs(checkpoint)  # a SigLIP fine-tune stores logit_bias: create it first
        except SafetensorError as e:
            raise ValueError(f"checkpoint={checkpoint!r}: {e}") from None
    try:
        with torch.random.fork_rng(devices=[]), _quiet_create(bool(checkpoint)):
            torch.manual_seed(int(seed))  # random init is the same in every process
            model, _, preprocess = load_open_clip(arch, pretrained or None, **extra)
            tokenizer = get_tokenizer(arch)
    except WeightsFormatError:
        raise
    except SafetensorError as e:  # a damaged local weights file: name it, no hub advice
        if pretrained and os.path.isfile(pretrained):
            raise ValueError(f"pretrained={pretrained!r}: {e}") from None
        raise ValueError(_load_error(what, e)) from e
    except (RuntimeError, OSError, ValueError) as e:  # hub misses, missing/bad files, a bad config
        raise ValueError(_load_error(what, e)) from e
    if checkpoint:
        state = read_safetensors(checkpoint, "checkpoint")
        try:
            model.load_state_dict({k.removeprefix("module."): v for k, v in state.items()})
        except RuntimeError as e:  # state dict of another architecture
            raise ValueError(f"checkpoint={checkpoint!r}: does not fit arch {arch!r} "
                             f"({str(e).splitlines()[0][:200]})") from None
    return ClipBundle(model.eval(), preprocess, tokenizer)


__all__ = ["RANDOM", "SCHEMAS", "ClipBundle", "check_weights", "encode_text", "load_clip", "load_open_clip",
           "register_builtin_configs", "siglip_kwargs"]
