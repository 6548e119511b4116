"""``lora`` detector: a ``clip`` or ``vlm`` base detector with a peft LoRA adapter trained by ``halsift train detector``.

Spec: ``lora:DIR`` (short for ``lora:path=DIR``), where ``DIR`` is the ``adapter/`` folder of a run::

    detector.yaml               kind (clip|vlm), base (the base detector spec), mode (vlm), step, val_auroc
    adapter_config.json         peft LoraConfig
    adapter_model.safetensors   the LoRA weights
    head.safetensors            clip only: the binary head on [cosine, image*text]
    merged/                     optional: the adapter merged into the base weights (detector.yaml says adapter: false)

``merge=true`` merges the adapter into the base weights after loading (same scores, no LoRA overhead). Relative
paths (``./...``) in the base spec are relative to ``DIR``. A missing or corrupt file raises an error naming it.
The base is built as a file's options (:mod:`~halsift.filtering.detectors.trust`): ``detector.yaml`` never turns on
``trust_remote_code`` or chooses ``api_key_env``, at any depth; ``lora:DIR,trust_remote_code=true`` written by the
user grants remote code to every model the folder's base loads.

``clip`` kind: score = ``100 * sigmoid(head([cos, img*txt]))``; the head starts as ``COS_SCALE * cos`` (its MLP
branch's output layer is zero-initialised), so an untrained head ranks exactly like its base.
``vlm`` kind: the base :class:`~halsift.filtering.detectors.vlm.VlmDetector` scores with the LoRA-adapted model,
and the detector lends that judge (capability ``vlm-judge``: I-HallA answers, ``eval bench --likelihood``).
Both kinds have a CPU half (``prepare``) for ``score --decode-workers``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from halsift.filtering.detectors.base import Detector, Item, PreparedDetector, Result, preprocess_side, renamed_option
from halsift.filtering.detectors.pixel_batch import PixelBatcher, device_decoding, image_text_inputs
from halsift.filtering.models.lora_adapters import apply_adapter, read_description

COS_SCALE = 10.0


class ClipHead(nn.Module):
    """``[cos, img*txt] -> logit``: a linear term (init ``COS_SCALE * cos``) plus a zero-initialised MLP."""

    def __init__(self, dim: int, hidden: int = 64) -> None:
        super().__init__()
        self.dim, self.hidden = int(dim), int(hidden)
        self.linear = nn.Linear(dim + 1, 1)
        with torch.no_grad():
            self.linear.weight.zero_()
            self.linear.weight[0, 0] = COS_SCALE
            self.linear.bias.zero_()
        self.mlp = None
        if hidden:
            self.mlp = nn.Sequential(nn.Linear(dim + 1, hidden), nn.GELU(), nn.Linear(hidden, 1))
            nn.init.zeros_(self.mlp[-1].weight)
            nn.init.zeros_(self.mlp[-1].bias)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        out = self.linear(feats)
        if self.mlp is not None:
            out = out + self.mlp(feats)
        return out.squeeze(-1)


class ClipLoraScorer(nn.Module):
    """An open_clip model (LoRA layers injected by peft) and a :class:`ClipHead`; ``forward`` returns logits."""

    def __init__(self, clip: nn.Module, head: ClipHead) -> None:
        super().__init__()
        self.clip = clip
        self.head = head

    def forward(self, images: torch.Tensor, tokens: torch.Tensor, image_index: torch.Tensor) -> torch.Tensor:
        """Logits for ``len(tokens)`` sentences; sentence ``i`` is paired with ``images[image_index[i]]``."""
        img = nn.functional.normalize(self.clip.encode_image(images).float(), dim=-1)[image_index]
        txt = nn.functional.normalize(self.clip.encode_text(tokens).float(), dim=-1)
        prod = img * txt
        return self.head(torch.cat([prod.sum(-1, keepdim=True), prod], -1))



class LoraClipDetector(PreparedDetector):
    """Scores with a :class:`ClipLoraScorer`: ``100 * sigmoid(head([cos, img*txt]))``."""

    family = "lora"
    image_arrays = True  # PixelBatcher takes decoded arrays as they are

    def __init__(self, scorer: ClipLoraScorer, preprocess, tokenizer, spec: str = "lora:in-memory",
                 decode: str = "cpu") -> None:
        super().__init__(spec)
        self.scorer, self.preprocess, self.tokenizer = scorer, preprocess, tokenizer
        self.pixels = PixelBatcher(preprocess)
        self.decode = decode
        device_decoding(decode, "cpu", self.pixels, "lora detector")  # checks the option

    def to(self, device: Any) -> "LoraClipDetector":
        self.scorer.to(device)
        self.image_arrays = "jpeg" if device_decoding(self.decode, device, self.pixels, "lora detector") else True
        return self

    def take_decode_counts(self) -> dict:
        return self.pixels.take_counts()

    def prepare(self, items: Sequence[Item]) -> dict:
        """The CPU half: each distinct image preprocessed once, each item's image row, the tokenized sentences."""
        return image_text_inputs(items, self.pixels, self.tokenizer, "lora clip detector",
                                 next(self.scorer.parameters()).device)

    def score_prepared(self, items: Sequence[Any], prepared: dict) -> list[Result]:
        was = self.scorer.training
        self.scorer.eval()
        try:
            dev = next(self.scorer.parameters()).device
            with torch.inference_mode():
                pixels = self.pixels.finish(prepared["pixels"], dev)
                logits = self.scorer(pixels, prepared["tokens"].to(dev), prepared["rows"].to(dev))
        finally:
            self.scorer.train(was)
        bad = set(self.pixels.unreadable)  # images no decoder read (decode=gpu): unparsed, never a score
        rows = prepared["rows"].tolist()
        return [Result(50.0, parsed=False) if int(r) in bad else Result(float(s))
                for r, s in zip(rows, (100 * logits.float().sigmoid()).cpu().tolist())]


def save_head(head: ClipHead, path: Path) -> None:
    from safetensors.torch import save_file

    # one metadata key: safetensors writes several in a per-process random order, and a file that differs byte for
    # byte between two identical trainings changes the fingerprint of every score made with it
    save_file({k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}, str(path),
              metadata={"head": json.dumps({"dim": head.dim, "hidden": head.hidden}, sort_keys=True)})


def load_head(path: Path) -> ClipHead:
    """Rebuild a :class:`ClipHead` from ``head.safetensors``; a corrupt file raises ValueError naming it."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            state = {k: f.get_tensor(k) for k in f.keys()}
        meta = json.loads(meta["head"]) if "head" in meta else meta  # earlier files: "dim" and "hidden" keys
        head = ClipHead(int(meta["dim"]), int(meta["hidden"]))
        head.load_state_dict(state)
    except FileNotFoundError:
        raise
    except Exception as e:  # safetensors raises its own error types on truncated/garbled files
        raise ValueError(f"{path}: not a valid clip head safetensors file ({type(e).__name__}: {e})") from None
    return head


# ---------------------------------------------------------------------------------------------- loading
def _resolve_base(spec: str, folder: Path) -> str:
    """Options of the base spec that are ``./relative`` paths are taken relative to the adapter folder."""
    from halsift.filtering.detectors.spec import format_spec, parse_spec

    family, opts = parse_spec(spec)
    for k, v in opts.items():
        if isinstance(v, str) and v.startswith("./"):
            opts[k] = str((folder / v).resolve())
    return format_spec(family, opts)


class LoraDetector(Detector):
    """A base ``clip``/``vlm`` detector plus the LoRA adapter (and clip head) in ``path`` (see module docstring).

    Options: ``path`` (the adapter folder), ``merge`` (merge the adapter into the base weights after loading),
    ``device``, ``forward_batch`` (vlm: rows per forward pass; default the base spec's; ``batch_size`` is its former
    name), ``trust_remote_code`` (off;
    only this option written by the user, never the folder's ``detector.yaml``, lets the models of its base run code
    shipped with their weights).
    """

    family = "lora"
    FILE_OPTIONS = ("path",)  # options naming a local file or folder: checked to exist before any work

    # one line of help per spec option (docs/config.md, --describe); a test keeps it in step with __init__
    OPTION_HELP = {
        "path": "the adapter/ folder of a halsift train detector run (lora:DIR is short for lora:path=DIR)",
        "merge": "merge the adapter into the base weights after loading (same scores, no LoRA overhead)",
        "device": "cpu, cuda, cuda:1 ...",
        "forward_batch": "vlm kind: rows per forward call (default: the base detector's)",
        "trust_remote_code": "let every model of the adapter's base run its repository's own code (off; the "
                             "folder's detector.yaml never turns it on)",
        "fast_decode": "clip kind: decode JPEGs at 1/2-1/8 scale, never below the model's input side (pixels "
                       "differ slightly from a full decode)",
        "decode": "clip kind: where JPEGs are decoded: auto (gpu on CUDA, else cpu) | cpu (the input workers) | gpu "
                  "(batched on the model's device by torchvision)",
        "batch_size": "former name of forward_batch (accepted with a warning)",
    }

    # the options' ranges, declared once: the dry run (check_spec), --describe and the build check them
    OPTION_RANGES = {"forward_batch": "[1, inf)", "batch_size": "[1, inf)"}

    def __init__(self, path: str, merge: bool = False, device: str = "cpu", forward_batch: int | None = None,
                 trust_remote_code: bool = False, fast_decode: bool = False, decode: str = "auto",
                 batch_size: int | None = None) -> None:
        super().__init__()
        forward_batch = renamed_option("lora", "batch_size", batch_size, "forward_batch", forward_batch, None)
        from halsift.filtering.detectors.spec import load_detector
        from halsift.filtering.detectors.trust import from_file

        folder = Path(str(path)).expanduser()
        if not folder.is_dir():
            raise FileNotFoundError(f"lora detector: adapter folder {folder} does not exist")
        desc = read_description(folder)
        self.kind = desc["kind"]
        self.description = desc
        with from_file(folder / "detector.yaml", remote_code=bool(trust_remote_code)):  # the folder's, not yours
            base = load_detector(_resolve_base(desc["base"], folder))
        if base.family != self.kind:
            raise ValueError(f"{folder / 'detector.yaml'}: kind {self.kind!r} but base {desc['base']!r} is a "
                             f"{base.family!r} detector")
        model = apply_adapter(base.model, folder, merge) if desc.get("adapter", True) else base.model
        if self.kind == "clip":
            head_path = folder / str(desc.get("head") or "head.safetensors")
            if not head_path.is_file():
                raise FileNotFoundError(f"lora detector: {head_path} is missing (the clip head)")
            scorer = ClipLoraScorer(model.float(), load_head(head_path)).eval()
            self.inner: Detector = LoraClipDetector(scorer, base.preprocess, base.tokenizer, decode=decode)
            self.decode_size = preprocess_side(base.preprocess) if fast_decode else None
        else:
            base.model = model.eval()
            if forward_batch:
                base.batch_size = int(forward_batch)
            self.inner = base
        self.to(device)

    @property
    def needs_image(self) -> bool:  # type: ignore[override]
        return self.inner.needs_image

    @property
    def localizes(self) -> bool:  # type: ignore[override]
        return self.inner.localizes

    @property
    def image_arrays(self) -> bool:  # type: ignore[override]
        return self.inner.image_arrays

    @property
    def judge(self):  # type: ignore[override]
        """A ``vlm`` kind lends its base's (LoRA-adapted) judge: I-HallA and likelihoods use the tuned model."""
        return self.inner.judge

    def to(self, device: Any) -> "LoraDetector":
        self.inner.to(device)
        return self

    def fingerprint_spec(self) -> str:
        """The spec, plus ``decode=gpu`` where ``decode=auto`` resolved to it (clip kind)."""
        return self.spec + (",decode=gpu" if self.image_arrays == "jpeg" and "decode=" not in self.spec else "")

    def take_decode_counts(self) -> dict:
        return self.inner.take_decode_counts()

    def score_batch(self, items: Sequence[Item]) -> list[Result]:
        return self.inner.score_batch(items)

    def prepare(self, items: Sequence[Item]) -> Any:
        return self.inner.prepare(items)

    def score_prepared(self, items: Sequence[Any], prepared: Any) -> list[Result]:
        return self.inner.score_prepared(items, prepared)


__all__ = ["COS_SCALE", "ClipHead", "ClipLoraScorer", "LoraClipDetector", "LoraDetector", "apply_adapter",
           "load_head", "read_description", "save_head"]
