"""``student``: a small head on stored CLIP embeddings, distilled from a judge's scores (``halsift train detector
--teacher SCORES --embeddings EMB``, :mod:`halsift.training.distill`); no image is decoded, no model run but the head.

Spec: ``student:path=DIR,embeddings=EMB`` (``DIR``: the ``student/`` folder distillation writes, holding
``model.safetensors`` and ``config.json``; ``EMB``: a ``halsift embed`` folder of the shards to score, embedded by the
same model as the training vectors). Without ``embeddings=``, the student encodes each unit itself with the CLIP its
vectors came from (``config.json``'s ``embeddings_model``): for data no embeddings folder holds, e.g. a bench or
calibration rows. A cheap stage for a cascade ([cascade.md](../../docs/cascade.md)). A ``config.json`` with
``"output": "linear"`` and ``"hidden": 0`` (a cascade's ``learn=`` head, :mod:`halsift.filtering.scoring.cascade_learn`)
scores with the head's raw output instead of ``100 * sigmoid``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from halsift.filtering.detectors.base import Detector, Item, Result

FORMAT = "halsift-student/1"


def features(image: np.ndarray, text: np.ndarray) -> np.ndarray:
    """The head's input per unit: ``[image, text, image * text, cosine]`` (vectors L2-normalised)."""
    img, txt = np.asarray(image, np.float32), np.asarray(text, np.float32)
    prod = img * txt
    return np.concatenate([img, txt, prod, prod.sum(1, keepdims=True)], axis=1)


def head(dim: int, hidden: int):
    """The student's head: ``features`` (``3 * dim + 1``) -> one logit."""
    import torch

    n_in = 3 * dim + 1
    if hidden <= 0:
        return torch.nn.Linear(n_in, 1)
    return torch.nn.Sequential(torch.nn.Linear(n_in, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, 1))


class StudentDetector(Detector):
    """Options: ``path`` (the distilled ``student/`` folder), ``embeddings`` (a ``halsift embed`` folder; without
    it, the units are encoded by the student's CLIP)."""

    family = "student"
    FILE_OPTIONS = ("path",)  # options naming a local file or folder: checked to exist before any work
    needs_image = False

    OPTION_HELP = {
        "path": "the student/ folder `halsift train detector --teacher` wrote (model.safetensors, config.json)",
        "embeddings": "a `halsift embed` folder of the data to score, by the model the student was trained on "
                      "(default: encode each unit with that model, recorded in config.json)",
    }

    def __init__(self, path: str = "", embeddings: str = "") -> None:
        super().__init__()
        import torch
        from halsift.corpus.weights import read_safetensors
        from halsift.filtering.detectors.embedding_lookup import EmbeddingLookup

        folder = Path(path)
        cfg_path = folder / "config.json"
        if not cfg_path.is_file():
            raise ValueError(f"path={path}: no student here (expected config.json and model.safetensors from "
                             "`halsift train detector --teacher`)")
        cfg = json.loads(cfg_path.read_text())
        if cfg.get("format") != FORMAT:
            raise ValueError(f"path={path}: config.json is not a {FORMAT} student")
        self.lookup = self.encoder = None
        if embeddings:
            self.lookup = EmbeddingLookup(embeddings, cfg["embeddings_model"], int(cfg["dim"]))
        else:
            self.encoder = _encoder(cfg["embeddings_model"], int(cfg["dim"]), path)
            self.needs_image = True
            self.decode_size, self.image_arrays = self.encoder.decode_size, self.encoder.image_arrays
        self.model = head(int(cfg["dim"]), int(cfg["hidden"]))
        self.model.load_state_dict(read_safetensors(folder / "model.safetensors", "student weights"))
        self.model.eval()
        self.linear = cfg.get("output") == "linear"  # a cascade's learned head (cascade_learn): its raw output
        self._torch = torch

    def to(self, device) -> "StudentDetector":
        if self.encoder is not None:
            self.encoder.to(device)
            self.image_arrays = self.encoder.image_arrays
        return self

    def _vectors(self, items: Sequence[Item]) -> tuple[np.ndarray, np.ndarray, list[bool]]:
        """(image vectors, text vectors, unreadable) per item: stored, or encoded by the student's CLIP (an image
        no decoder read is unreadable, scored as unparsed)."""
        if self.lookup is not None:
            v = self.lookup.vectors(items)
            return v["image_vectors"], v["text_vectors"], [False] * len(items)
        img, txt, rows = (t.cpu() for t in self.encoder.encode(self.encoder.prepare(items)))
        return img[rows].numpy(), txt.numpy(), self.encoder.unread_items(rows) or [False] * len(items)

    def score_batch(self, items: Sequence[Item]) -> list[Result]:
        if not items:
            return []
        img, txt, unread = self._vectors(items)
        x = self._torch.from_numpy(features(img, txt))
        with self._torch.no_grad():
            out = self.model(x)[:, 0]
            p = out.numpy() if self.linear else 100.0 * self._torch.sigmoid(out).numpy()
        return [Result(50.0, parsed=False) if bad else Result(float(s)) for s, bad in zip(p, unread)]


def _encoder(model: str, dim: int, path: str):
    """The CLIP detector of a student's ``embeddings_model`` spec, checked to give ``dim``-wide vectors."""
    from halsift.filtering.detectors.spec import load_detector

    try:
        encoder = load_detector(model)
    except (OSError, ValueError) as e:
        raise ValueError(f"path={path}: cannot load the CLIP its vectors came from ({model}): {e}; give "
                         "embeddings=") from None
    if not hasattr(encoder, "encode") or encoder.embed_dim() != dim:
        raise ValueError(f"path={path}: {model} does not make the student's {dim}-dimensional vectors; give "
                         "embeddings=")
    return encoder
