"""``clip`` detector: cosine similarity of an open_clip image and sentence embedding, mapped to 0–100.

Score maps (option ``map``):

* ``linear`` (default): ``score = 50 * (cos + 1)``, clamped to [0, 100]. Monotone in the cosine, so ranking
  metrics (AUROC, top-k selection) equal those of raw CLIPScore; absolute values bunch near 55–70 because CLIP
  cosines of matching pairs are small.
* ``sigmoid``: ``score = 100 * sigmoid(logit_scale * (cos - center))`` with the model's own learned logit
  scale (≈100 for trained CLIP) and ``center`` (default 0.25): spreads typical cosines over the full range.

Each distinct image in a batch (same ``image_id``, or ``key`` when it is empty, and the same image object) is
encoded once; all of its sentences are scored against that embedding. With ``embeddings=DIR`` (a folder written by
``halsift embed`` with the same model) nothing is encoded: each item's image and text vectors are read from it
(:mod:`~halsift.filtering.detectors.embedding_lookup`), and the cosine of the stored float16 vectors is scored.
``arch=halsift-tiny`` is a built-in 2-layer config (no download) for tests and CPU smoke runs. ``arch`` may also
be open_clip's ``hf-hub:org/repo`` (config and weights from the Hugging Face cache; with ``HF_HUB_OFFLINE=1`` only
what is cached) or ``local-dir:/path`` (a folder with ``open_clip_config.json`` and the weights, e.g. ``train clip``'s
``RUN/final``). Weights that
cannot be found or loaded are a ``ValueError`` naming the tag or path (one line at the CLI, exit 2). Random
weights only when asked for by name: an open_clip ``arch`` without ``pretrained`` or ``checkpoint`` is refused
(it would rank captions by noise) unless ``pretrained=random`` (seeded by ``seed``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from halsift.filtering.detectors.base import Detector, Item, Result, preprocess_side
from halsift.filtering.models.clip_models import encode_text, load_clip, used_positions
from halsift.filtering.detectors.pixel_batch import PixelBatcher, device_decoding, image_text_inputs

class ClipDetector(Detector):
    """Score (image, sentence) by open_clip cosine similarity.

    Options: ``arch`` (open_clip model name), ``pretrained`` (open_clip tag, or ``random``: a random init seeded by
    ``seed``), ``checkpoint`` (a local ``.safetensors`` file; a pickled ``.pt`` is refused, never loaded), one of them
    required; ``device``,
    ``precision`` (auto|fp32|bf16|fp16; ``auto``, the default: bf16 with TF32 matmuls on CUDA, fp32 elsewhere),
    ``map`` (linear|sigmoid), ``center`` (sigmoid map), ``fast_decode`` (JPEGs decoded at a reduced DCT scale
    that keeps the model's input side), ``decode`` (auto|cpu|gpu: where JPEGs are decoded; see
    :mod:`~halsift.filtering.detectors.pixel_batch`), ``delay`` (seconds to sleep per batch; interruption tests only).
    """

    family = "clip"
    FILE_OPTIONS = ("checkpoint",)  # options naming a local file or folder: checked to exist before any work
    image_arrays = True  # PixelBatcher takes decoded arrays as they are

    # one line of help per spec option (docs/config.md, --describe); a test keeps it in step with __init__
    OPTION_HELP = {
        "arch": "open_clip architecture (open_clip.list_models()), or halsift-tiny",
        "pretrained": "open_clip pretrained tag (e.g. openai), a local weights file, or random (a seeded random "
                      "init: needed to score without weights)",
        "checkpoint": "fine-tuned weights (.safetensors, e.g. train clip's final/open_clip_model.safetensors)",
        "seed": "seed of the random init (pretrained=random)",
        "device": "cpu, cuda, cuda:1 ...",
        "precision": "auto (bf16 + TF32 on CUDA, fp32 on CPU) | fp32 | bf16 | fp16",
        "map": "cosine -> score: linear (50 * (cos + 1)) | sigmoid (100 * sigmoid(logit_scale * (cos - center)))",
        "center": "map=sigmoid: the cosine that scores 50",
        "delay": "seconds to sleep per batch (interruption tests only)",
        "fast_decode": "decode JPEGs at 1/2-1/8 scale, never below the model's input side (faster on large "
                       "photos; pixels differ slightly from a full decode)",
        "embeddings": "a folder written by `halsift embed` with this model: read the image and text vectors "
                      "from it instead of encoding (scores equal up to their float16 rounding)",
        "decode": "where JPEGs are decoded: auto (gpu on CUDA, else cpu) | cpu (the input workers, libjpeg-turbo) | "
                  "gpu (batched on the model's device by torchvision: nvJPEG on CUDA; other images, and fast_decode, "
                  "on the host)",
    }

    # the options' ranges, declared once: the dry run (check_spec), --describe and the build check them
    OPTION_RANGES = {"seed": "[0, inf)", "center": "[-1, 1]", "delay": "[0, inf)"}

    def __init__(self, arch: str = "ViT-B-32", pretrained: str | None = None, checkpoint: str | None = None,
                 seed: int = 0, device: str = "cpu", precision: str = "auto", map: str = "linear",
                 center: float = 0.25, delay: float = 0.0, fast_decode: bool = False,
                 embeddings: str | None = None, decode: str = "auto") -> None:
        super().__init__()
        if map not in ("linear", "sigmoid"):
            raise ValueError(f"map={map!r}: expected 'linear' or 'sigmoid'")
        if precision not in ("auto", "fp32", "bf16", "fp16"):
            raise ValueError(f"precision={precision!r}: expected auto, fp32, bf16 or fp16")
        from halsift.filtering.detectors.spec import format_spec

        # what the vectors depend on: the model and its weights, and the decoded pixels (fast_decode, decode)
        id_opts = {"arch": arch, "pretrained": pretrained, "checkpoint": checkpoint, "seed": int(seed),
                   "fast_decode": bool(fast_decode)}
        self.encoder_id = format_spec("clip", id_opts)
        model, preprocess, tokenizer = load_clip(arch, pretrained, checkpoint, seed)
        self._setup(model, preprocess, tokenizer, map=map, center=center, delay=delay,
                    precision=precision)
        self._id_opts = id_opts  # to() adds decode=gpu where JPEGs are decoded on the device
        self.decode = decode
        device_decoding(decode, device, self.pixels, "clip detector")  # checks the option before the model moves
        self.arch = arch  # the open_clip name the model was built from (a merged LoRA's open_clip_config.json)
        self.decode_size = preprocess_side(preprocess) if fast_decode else None
        self.to(device)
        self.lookup = None
        if embeddings:
            from halsift.filtering.detectors.embedding_lookup import EmbeddingLookup

            self.lookup = EmbeddingLookup(embeddings, self.encoder_id, self.embed_dim())

    @classmethod
    def from_model(cls, model: Any, preprocess: Any, tokenizer: Any, *, map: str = "linear",
                   center: float = 0.25, name: str = "clip:in-memory") -> "ClipDetector":
        """Wrap an in-memory open_clip model (e.g. during training) as a detector."""
        self = cls.__new__(cls)
        Detector.__init__(self, name)
        self._setup(model, preprocess, tokenizer, map=map, center=center, delay=0.0, precision="fp32")
        self.encoder_id = name
        self.device = next(model.parameters()).device
        return self

    def _setup(self, model, preprocess, tokenizer, *, map: str, center: float, delay: float,
               precision: str) -> None:
        self.model = model.eval()
        self.preprocess = preprocess
        self.pixels = PixelBatcher(preprocess)
        self.tokenizer = tokenizer
        self.map = map
        self.center = float(center)
        self.delay = float(delay)
        self.precision = precision
        self.device = "cpu"
        self.lookup = None  # an EmbeddingLookup (embeddings=DIR): vectors read, not encoded
        self.decode = "cpu"
        self.image_arrays: bool | str = True  # "jpeg" where JPEGs are decoded on the model's device
        self._id_opts: dict | None = None

    def to(self, device: Any) -> "ClipDetector":
        import torch

        precision = self.precision
        if precision == "auto":  # scoring only ranks cosines: bf16 keeps the order on GPUs, at half the bytes
            precision = "bf16" if torch.device(device).type == "cuda" else "fp32"
            if torch.device(device).type == "cuda":
                torch.backends.cuda.matmul.allow_tf32 = True
                torch.backends.cudnn.allow_tf32 = True
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
        self.model.to(device=device, dtype=dtype)
        self.device = device
        on_device = device_decoding(self.decode, device, self.pixels, "clip detector")
        self.image_arrays = "jpeg" if on_device else True
        if self._id_opts is not None:  # decode=gpu pixels differ slightly: stored vectors tell the decoders apart
            from halsift.filtering.detectors.spec import format_spec

            self.encoder_id = format_spec("clip", {**self._id_opts, **({"decode": "gpu"} if on_device else {})})
        return self

    def fingerprint_spec(self) -> str:
        """The spec, plus ``decode=gpu`` where ``decode=auto`` resolved to it: a score folder resumes only with the
        same decoder."""
        return self.spec + (",decode=gpu" if self.image_arrays == "jpeg" and "decode=" not in self.spec else "")

    def take_decode_counts(self) -> dict:
        """Images decoded on the device / host / fallback / unreadable since the last call (decode=gpu)."""
        return self.pixels.take_counts()

    def embed_dim(self) -> int:
        """The width of the model's embeddings (one text encoded)."""
        import torch

        with torch.inference_mode():
            return int(self.model.encode_text(self.tokenizer(["a"]).to(self.device)).shape[-1])

    def prepare(self, items: Sequence[Item]) -> dict:
        """Preprocessed images (each distinct image once; 8-bit, normalized where the model runs: see
        :class:`~halsift.filtering.detectors.pixel_batch.PixelBatcher`), the row of each item's image, and the tokenized
        sentences, on the CPU: what :meth:`cosines` feeds the model. With ``embeddings=DIR``: each item's stored
        image and text vectors instead (``{"image_vectors", "text_vectors"}``)."""
        if self.lookup is not None:
            return self.lookup.vectors(items)
        return image_text_inputs(items, self.pixels, self.tokenizer, "clip detector", self.device)

    def cosines(self, items: Sequence[Item], prepared: dict | None = None):
        """Cosine similarity per item (a float32 CPU tensor); each distinct image (``image_id`` or else ``key``, and
        the image object) is encoded once; NaN for an item whose image no decoder read."""
        return self._cosines(items, prepared)[0]

    def _cosines(self, items: Sequence[Item], prepared: dict | None):
        """:meth:`cosines` and, per item, whether no decoder read its image (a bool list, or ``None``: all read)."""
        import torch

        prepared = prepared if prepared is not None else self.prepare(items)
        if "image_vectors" in prepared:  # read from an embeddings folder: float16 vectors, cosine in float32
            img, txt = (torch.as_tensor(prepared[k]).float() for k in ("image_vectors", "text_vectors"))
            return (img * txt).sum(-1), None
        img, txt, idx = self.encode(prepared)
        unread = self.unread_items(idx)
        with torch.inference_mode():
            cos = (img[idx] * txt).sum(-1).cpu()
            if unread is not None:  # images no decoder read: NaN, scored as unparsed by score_prepared
                cos[torch.as_tensor(unread)] = float("nan")
        return cos, unread

    def unread_items(self, rows) -> list[bool] | None:
        """After :meth:`encode`: per item (``rows``, each item's image row), whether no decoder read its image;
        ``None`` when every image was read."""
        if not self.pixels.unreadable:
            return None
        bad = set(self.pixels.unreadable)
        return [int(r) in bad for r in rows.tolist()]

    def encode(self, prepared: dict):
        """The L2-normalised float32 embeddings of :meth:`prepare`'s output: ``(images [distinct, D], texts
        [items, D], rows)`` on the model's device, ``rows[i]`` the image of item ``i`` (what ``halsift embed``
        stores and :meth:`cosines` scores)."""
        import torch

        dtype = next(self.model.parameters()).dtype
        with torch.inference_mode():
            used = used_positions(prepared["tokens"])  # on the CPU copy: no device sync between the two towers
            pix = self.pixels.finish(prepared["pixels"], self.device, dtype)
            tok = prepared["tokens"].to(self.device, non_blocking=True)
            idx = prepared["rows"].to(self.device, non_blocking=True)
            img = torch.nn.functional.normalize(self.model.encode_image(pix).float(), dim=-1)
            txt = torch.nn.functional.normalize(encode_text(self.model, tok, used).float(), dim=-1)
        return img, txt, idx

    def score_batch(self, items: Sequence[Item]) -> list[Result]:
        return self.score_prepared(items, None)

    def score_prepared(self, items: Sequence[Item], prepared: dict | None) -> list[Result]:
        if not items:
            return []
        cos, unread = self._cosines(items, prepared)
        unread = unread or [False] * len(items)
        if self.map == "linear":
            scores = ((cos + 1) * 50).clamp(0, 100)
        else:
            scale = float(self.model.logit_scale.exp().item()) if hasattr(self.model, "logit_scale") else 100.0
            scores = 100 * (scale * (cos - self.center)).sigmoid()
        if self.delay:
            time.sleep(self.delay)
        # only an image no decoder read is unparsed; any other NaN (a broken model) stays NaN for the run's guard
        return [Result(50.0, parsed=False) if bad else Result(float(s)) for s, bad in zip(scores.tolist(), unread)]


def cosine_to_score(cos: float) -> float:
    """The default (linear) map, for documentation and tests: ``clamp(50 * (cos + 1), 0, 100)``."""
    return min(100.0, max(0.0, 50.0 * (cos + 1.0)))


__all__ = ["ClipDetector", "cosine_to_score"]
