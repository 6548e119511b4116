"""VIGIL: hallucination detection in image recontextualization (object mutation, background inconsistency,
object omission), as a pipeline with pluggable stages, its multi-label F1 and the leave-one-category-out search.

Stages (Sec. 4): object extraction from the prompt -> segmentation of reference and generated images
(:class:`Segmenter`; :class:`ColourSegmenter` for the synthetic world, SAM-class models plug in) -> embeddings
(:class:`ImageEncoder`; a colour/shape embedding by default) and Hungarian matching under a cosine threshold tau
(unmatched reference = omission) -> matched-crop comparison (mutation) -> background comparison outside the objects,
whose boxes grow by a margin relative to their size, optionally through difference-guided boxes. The expensive
part (:func:`analyze`) runs once per record; :func:`decide` applies a :class:`VigilConfig` cheaply, which is what
makes the grid search affordable.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from halsift.corpus.errors import InputError
from halsift.corpus.percent import percent

TYPES = ("objects", "background", "object_omission")


class VigilFormatError(InputError):
    """An annotation file that does not follow the VIGIL layout."""


@dataclass
class VigilRecord:
    """One recontextualization: background, 1-2 reference objects, prompt, generated image and labels per type.
    Images are HxWx3 uint8 arrays or paths (loaded on first use)."""

    id: str
    category: str
    prompt: str
    background: Any
    references: list[Any]
    generated: Any
    labels: dict[str, bool]
    notes: dict[str, str] = field(default_factory=dict)  # the annotators' explanation per type, if any


def load_rgb(img: Any) -> np.ndarray:
    """An HxWx3 uint8 array from an array, a PIL image or a path."""
    if isinstance(img, np.ndarray):
        return img
    if isinstance(img, (str, os.PathLike)):
        if not Path(img).is_file():
            raise FileNotFoundError(f"{img}: image not found")
        from halsift.corpus.images import load_image_file

        return np.asarray(load_image_file(img))
    return np.asarray(img.convert("RGB"))


def read_vigil(path: str | os.PathLike, root: str | os.PathLike | None = None) -> list[VigilRecord]:
    """Read the VIGIL annotation layout: a JSON list of ``{generated_photo, hallucination: {objects, background,
    object_omission}}`` (a non-empty string = present), with ``background_photo``, ``object_photos`` (list or one
    path), ``prompt`` and ``category`` where given. Paths are relative to ``root`` (default: the file's folder)."""
    from halsift.corpus.jsonl import read_json

    p = Path(path)
    data = read_json(p, VigilFormatError, "VIGIL annotations", expect=list)
    base = Path(root) if root else p.parent
    out = []
    for i, r in enumerate(data):
        where = f"{p}: record {i}"
        if not isinstance(r, dict) or "generated_photo" not in r or not isinstance(r.get("hallucination"), dict):
            raise VigilFormatError(f"{where}: needs 'generated_photo' and a 'hallucination' object")
        h = r["hallucination"]
        missing = [t for t in TYPES if t not in h]
        if missing:
            raise VigilFormatError(f"{where}: 'hallucination' lacks {', '.join(missing)} (expected {', '.join(TYPES)})")
        refs = r.get("object_photos", r.get("objects_photos", r.get("reference_photos", [])))
        refs = [refs] if isinstance(refs, str) else list(refs)
        bg = r.get("background_photo", r.get("background"))
        gen = str(r["generated_photo"])
        cat = r.get("category") or (Path(gen).parts[0] if len(Path(gen).parts) > 1 else "all")
        out.append(VigilRecord(Path(gen).stem, str(cat), str(r.get("prompt", "")),
                               base / bg if bg else None, [base / x for x in refs], base / gen,
                               {t: bool(str(h[t] or "").strip()) for t in TYPES},
                               {t: str(h[t] or "") for t in TYPES}))
    return out


# --------------------------------------------------------------------------------------------------- stages

@dataclass
class Segment:
    """One object instance: boolean mask, box (x0, y0, x1, y1; exclusive ends) and class label (None = unknown)."""

    mask: np.ndarray
    box: tuple[int, int, int, int]
    label: str | None = None


class Segmenter(Protocol):
    """Finds object instances in an image, optionally prompted with the object names (SAM 3-style)."""

    def segment(self, image: np.ndarray, names: Sequence[str] = ()) -> list[Segment]: ...


class ImageEncoder(Protocol):
    """Embeds masked object crops: (n, d) array, one row per segment."""

    def embed(self, image: np.ndarray, segments: Sequence[Segment]) -> np.ndarray: ...


def _box(mask: np.ndarray) -> tuple[int, int, int, int]:
    ys, xs = np.nonzero(mask)
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


class ColourSegmenter:
    """Instances = connected components (scipy.ndimage.label) of saturated pixels; muted backgrounds, grey shadows
    and isolated noise pixels are ignored. Class-agnostic (labels None)."""

    def __init__(self, min_saturation: float = 0.35, min_area: int = 20) -> None:
        self.min_saturation, self.min_area = min_saturation, min_area

    def segment(self, image: np.ndarray, names: Sequence[str] = ()) -> list[Segment]:
        from scipy import ndimage

        rgb = image.astype(np.float32) / 255.0
        mx, mn = rgb.max(axis=2), rgb.min(axis=2)
        sat = np.where(mx > 0, (mx - mn) / np.maximum(mx, 1e-6), 0.0)
        fg = ndimage.binary_closing((sat > self.min_saturation) & (mx > 0.2), iterations=1)
        lab, n = ndimage.label(fg)
        segs = []
        for k in range(1, n + 1):
            m = lab == k
            if m.sum() >= self.min_area:
                segs.append(Segment(m, _box(m)))
        segs.sort(key=lambda s: (s.box[0], s.box[1]))
        return segs


def _crop(image: np.ndarray, seg: Segment, size: int) -> tuple[np.ndarray, np.ndarray]:
    from PIL import Image

    x0, y0, x1, y1 = seg.box
    rgb = Image.fromarray(image[y0:y1, x0:x1]).resize((size, size), Image.NEAREST)
    m = Image.fromarray(seg.mask[y0:y1, x0:x1].astype(np.uint8) * 255).resize((size, size), Image.NEAREST)
    return np.asarray(rgb).astype(np.float32), np.asarray(m) > 0


class ColourShapeEncoder:
    """A cheap embedding for flat-coloured objects: a 4x4x4 colour histogram of the masked pixels (sqrt) joined
    with the 8x8 mask silhouette, each half L2-normalised."""

    def embed(self, image: np.ndarray, segments: Sequence[Segment]) -> np.ndarray:
        rows = []
        for s in segments:
            px = image[s.mask].astype(np.int64) // 64
            hist = np.bincount(px[:, 0] * 16 + px[:, 1] * 4 + px[:, 2], minlength=64).astype(np.float64)
            hist = np.sqrt(hist / max(1.0, hist.sum()))
            _, sil = _crop(image, s, 8)
            sil = sil.astype(np.float64).ravel()
            parts = [v / (np.linalg.norm(v) or 1.0) for v in (hist, sil)]
            rows.append(np.concatenate(parts) / np.sqrt(2))
        return np.asarray(rows, dtype=np.float64).reshape(len(rows), -1)


class OpenClipEncoder:
    """An open_clip image tower as :class:`ImageEncoder` (masked crops on white, the model's preprocessing)."""

    def __init__(self, model: Any, preprocess: Any, device: str = "cpu") -> None:
        self.model, self.preprocess, self.device = model, preprocess, device

    def embed(self, image: np.ndarray, segments: Sequence[Segment]) -> np.ndarray:
        import torch
        from PIL import Image

        crops = []
        for s in segments:
            x0, y0, x1, y1 = s.box
            c = np.where(s.mask[y0:y1, x0:x1, None], image[y0:y1, x0:x1], 255).astype(np.uint8)
            crops.append(self.preprocess(Image.fromarray(c)))
        if not crops:
            return np.zeros((0, 1))
        with torch.no_grad():
            f = self.model.encode_image(torch.stack(crops).to(self.device)).float()
        return torch.nn.functional.normalize(f, dim=-1).cpu().numpy()


def crop_difference(a_img: np.ndarray, a: Segment, b_img: np.ndarray, b: Segment, size: int = 16) -> float:
    """Matched-crop comparison: mean absolute colour difference (0-1) of the two crops, resized alike, over the
    union of their masks (the VLM's visual comparison in the paper)."""
    ca, ma = _crop(a_img, a, size)
    cb, mb = _crop(b_img, b, size)
    union = ma | mb
    if not union.any():
        return 0.0
    return float(np.abs(ca - cb).mean(axis=2)[union].mean() / 255.0)


_STOP = {"the", "a", "an", "and", "of", "on", "in", "to", "with", "at", "into", "place", "put", "scene", "image"}


def extract_objects(prompt: str, vocabulary: Iterable[str] = ()) -> list[str]:
    """Objects named by the prompt: known vocabulary words in order of mention (the paper asks a VLM)."""
    vocab = {v.lower() for v in vocabulary}
    words = re.findall(r"[a-z]+", prompt.lower())
    return [w for w in words if w in vocab] if vocab else [w for w in words if w not in _STOP]


# --------------------------------------------------------------------------------------------------- pipeline

@dataclass(frozen=True)
class VigilConfig:
    """Decision parameters: the grid searches tau, margin and boxes."""

    tau: float = 0.4  # cosine similarity needed for a reference/generated match
    margin: float = 0.2  # object box growth on each side, relative to the box width/height
    boxes: bool = True  # difference-guided boxes (else: share of changed background pixels)
    mutation: float = 0.12  # crop difference above which a matched object counts as mutated
    diff: float = 40.0  # per-pixel change (0-255, max over channels) that counts as changed
    bg_fraction: float = 0.01  # without boxes: share of changed background pixels that flags the background
    min_box_area: int = 40  # with boxes: smallest changed region (pixels) that flags the background


@dataclass
class Analysis:
    """Config-independent intermediate results of one record."""

    record_id: str
    names: list[str]
    ref_segments: list[Segment | None]
    gen_segments: list[Segment]
    similarity: np.ndarray  # (n_ref, n_gen) cosine similarities
    crop_diff: np.ndarray  # (n_ref, n_gen) matched-crop differences
    change: np.ndarray | None  # HxW per-pixel change between background and generated image


@dataclass
class Findings:
    """Structured output of one record: a flag per type and one explanation per finding."""

    record_id: str
    flags: dict[str, bool]
    explanations: list[str]

    def to_json(self) -> dict:
        return asdict(self)


def analyze(record: VigilRecord, segmenter: Segmenter, encoder: ImageEncoder,
            vocabulary: Iterable[str] = ()) -> Analysis:
    """Run extraction, segmentation, embeddings, crop comparison and the background difference for one record."""
    gen = load_rgb(record.generated)
    names = extract_objects(record.prompt, vocabulary)
    refs = []
    for i, ref in enumerate(record.references):
        img = load_rgb(ref)
        segs = segmenter.segment(img, names[i:i + 1])
        best = max(segs, key=lambda s: int(s.mask.sum()), default=None)  # a reference photo shows one object
        refs.append((img, best))
    gsegs = segmenter.segment(gen, names)
    ref_ok = [(img, s) for img, s in refs if s is not None]
    sim = np.full((len(refs), len(gsegs)), -1.0)
    cdiff = np.ones((len(refs), len(gsegs)))
    if ref_ok and gsegs:
        ge = encoder.embed(gen, gsegs)
        for i, (img, s) in enumerate(refs):
            if s is None:
                continue
            re_ = encoder.embed(img, [s])[0]
            for j, g in enumerate(gsegs):
                if s.label is not None and g.label is not None and s.label != g.label:
                    continue  # only same-class pairs may match
                sim[i, j] = float(re_ @ ge[j] / ((np.linalg.norm(re_) * np.linalg.norm(ge[j])) or 1.0))
                cdiff[i, j] = crop_difference(img, s, gen, g)
    change = None
    if record.background is not None:
        bg = load_rgb(record.background)
        if bg.shape != gen.shape:
            from PIL import Image

            bg = np.asarray(Image.fromarray(bg).resize((gen.shape[1], gen.shape[0]), Image.BILINEAR))
        change = np.abs(gen.astype(np.int16) - bg.astype(np.int16)).max(axis=2).astype(np.float32)
    return Analysis(record.id, names, [s for _, s in refs], gsegs, sim, cdiff, change)


def _name(a: Analysis, i: int) -> str:
    return f"reference object {i + 1}" + (f" ({a.names[i]})" if i < len(a.names) else "")


def decide(a: Analysis, cfg: VigilConfig) -> Findings:
    """Apply ``cfg`` to an :class:`Analysis`: Hungarian matching, mutation check and background check."""
    from scipy import ndimage
    from scipy.optimize import linear_sum_assignment

    flags = {t: False for t in TYPES}
    why: list[str] = []
    n_ref, n_gen = a.similarity.shape
    matched: dict[int, int] = {}
    if n_ref and n_gen:
        rows, cols = linear_sum_assignment(-a.similarity)
        matched = {int(r): int(c) for r, c in zip(rows, cols) if a.similarity[r, c] >= cfg.tau}
    for i in range(n_ref):
        if i not in matched:
            flags["object_omission"] = True
            best = float(a.similarity[i].max()) if n_gen else float("nan")
            why.append(f"object_omission: {_name(a, i)} has no match in the generated image "
                       f"(best similarity {best:.2f} < tau {cfg.tau:.2f})")
        elif a.crop_diff[i, matched[i]] > cfg.mutation:
            flags["objects"] = True
            g = a.gen_segments[matched[i]]
            why.append(f"objects: {_name(a, i)} is matched to the object at {g.box} (similarity "
                       f"{a.similarity[i, matched[i]]:.2f}) but its crop differs by {a.crop_diff[i, matched[i]]:.2f} "
                       f"> {cfg.mutation:.2f} (mutation)")
    if a.change is not None:
        keep = np.ones(a.change.shape, dtype=bool)
        h, w = keep.shape
        for s in a.gen_segments:
            x0, y0, x1, y1 = s.box
            mx, my = cfg.margin * (x1 - x0), cfg.margin * (y1 - y0)
            keep[max(0, int(y0 - my)):min(h, int(np.ceil(y1 + my))), max(0, int(x0 - mx)):min(w, int(np.ceil(x1 + mx)))] = False
        changed = (a.change > cfg.diff) & keep
        if cfg.boxes:
            lab, n = ndimage.label(changed)
            for k, sl in enumerate(ndimage.find_objects(lab), 1):
                area = int((lab[sl] == k).sum())
                if area >= cfg.min_box_area:
                    flags["background"] = True
                    why.append(f"background: changed region at (x {sl[1].start}-{sl[1].stop}, y {sl[0].start}-"
                               f"{sl[0].stop}), {area} px outside the objects")
        else:
            frac = float(changed.sum() / max(1, keep.sum()))
            if frac > cfg.bg_fraction:
                flags["background"] = True
                why.append(f"background: {100 * frac:.1f}% of the background outside the objects changed "
                           f"(> {100 * cfg.bg_fraction:.1f}%)")
    return Findings(a.record_id, flags, why)


# --------------------------------------------------------------------------------------------------- metrics

def label_matrix(items: Sequence[dict[str, bool]]) -> np.ndarray:
    """(n, 3) 0/1 matrix in TYPES order."""
    return np.array([[int(bool(x[t])) for t in TYPES] for x in items], dtype=int).reshape(len(items), len(TYPES))


def multilabel_f1(y_true: np.ndarray, y_pred: np.ndarray, categories: Sequence[str] | None = None) -> dict[str, float]:
    """F1 per type (sklearn, zero_division=0, in % like the paper's tables: 0–100) and its macro over types; with
    ``categories`` also the macro per category and the macro over categories."""
    from sklearn.metrics import f1_score

    def per_type(t: np.ndarray, p: np.ndarray) -> dict[str, float]:
        f = {ty: percent(f1_score(t[:, k], p[:, k], zero_division=0)) for k, ty in enumerate(TYPES)}
        f["macro"] = float(np.mean([f[ty] for ty in TYPES]))
        return f

    out = {f"f1/{k}": v for k, v in per_type(y_true, y_pred).items()}
    if categories is not None:
        cats = np.asarray(categories)
        macros = []
        for c in sorted(set(cats)):
            sel = cats == c
            f = per_type(y_true[sel], y_pred[sel])
            out.update({f"f1/{c}/{k}": v for k, v in f.items()})
            macros.append(f["macro"])
        out["f1/macro_categories"] = float(np.mean(macros))
    return out


def default_grid() -> list[VigilConfig]:
    """tau x margin x boxes, as in the paper's Appendix A."""
    return [VigilConfig(tau=t, margin=m, boxes=b) for t, m, b in
            itertools.product((0.2, 0.4, 0.6, 0.8), (0.0, 0.1, 0.2, 0.3), (False, True))]


def loco_search(analyses: Sequence[Analysis], labels: np.ndarray, categories: Sequence[str],
                grid: Sequence[VigilConfig] | None = None) -> tuple[np.ndarray, list[dict]]:
    """Leave-one-category-out: for each category pick the config with the best macro F1 (over types) on the other
    categories and predict the held-out one with it. Returns the held-out predictions and one row per split."""
    grid = list(grid or default_grid())
    preds = np.stack([label_matrix([decide(a, c).flags for a in analyses]) for c in grid])  # (configs, n, 3)
    cats = np.asarray(categories)
    out = np.zeros_like(labels)
    splits = []
    for c in sorted(set(cats)):
        train = cats != c
        if not train.any():
            train = np.ones_like(train)
        scores = [multilabel_f1(labels[train], p[train])["f1/macro"] for p in preds]
        best = int(np.argmax(scores))
        out[cats == c] = preds[best][cats == c]
        held = multilabel_f1(labels[cats == c], preds[best][cats == c])["f1/macro"]
        splits.append({"category": c, "config": asdict(grid[best]), "train_f1": scores[best], "test_f1": held})
    return out, splits


__all__ = ["TYPES", "VigilFormatError", "VigilRecord", "read_vigil", "load_rgb", "Segment", "Segmenter",
           "ImageEncoder", "ColourSegmenter", "ColourShapeEncoder", "OpenClipEncoder", "crop_difference",
           "extract_objects", "VigilConfig", "Analysis", "Findings", "analyze", "decide", "label_matrix",
           "multilabel_f1", "default_grid", "loco_search"]
