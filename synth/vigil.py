"""Synthetic VIGIL composites: product-like objects from 5 categories pasted onto muted rooms, with injected
object mutations (recoloured parts), omissions (an object not drawn) and background changes (a repainted patch),
plus benign noise the detector has to tolerate: contact shadows below objects, global brightness jitter and, in
half the records, isolated speckle pixels."""

from __future__ import annotations

import random

import numpy as np
from PIL import Image, ImageDraw

from halsift.eval.metrics.vigil import ColourSegmenter, ColourShapeEncoder, VigilRecord
from halsift.eval.runs.vigil import VigilInputs

CATEGORIES = {"clothing": ("shirt", "dress", "jacket"), "furniture": ("chair", "sofa", "table"),
              "cosmetics": ("lipstick", "bottle", "jar"), "electronics": ("phone", "laptop", "speaker"),
              "cars": ("car", "van", "truck")}
VOCABULARY = tuple(p for ps in CATEGORIES.values() for p in ps)
PALETTE = {"red": (210, 35, 35), "blue": (35, 70, 210), "green": (30, 150, 55), "orange": (240, 120, 20),
           "purple": (130, 40, 170), "yellow": (230, 190, 15), "teal": (20, 150, 150), "pink": (225, 60, 150)}
_WALLS = ((205, 200, 190), (190, 198, 205), (210, 205, 214), (200, 208, 196))
_FLOORS = ((150, 140, 130), (140, 135, 125), (160, 150, 138))
SIZE = 96


def _shape(product: str, x0: float, y0: float, s: float) -> list[list[tuple[float, float]]]:
    """Polygons (unit design scaled to an s x s box at x0, y0) for one product."""
    designs = {
        "shirt": [[(0.1, 0.2), (0.35, 0.05), (0.65, 0.05), (0.9, 0.2), (0.8, 0.4), (0.7, 0.35), (0.7, 0.95),
                   (0.3, 0.95), (0.3, 0.35), (0.2, 0.4)]],
        "dress": [[(0.35, 0.05), (0.65, 0.05), (0.6, 0.4), (0.9, 0.95), (0.1, 0.95), (0.4, 0.4)]],
        "jacket": [[(0.1, 0.15), (0.9, 0.15), (0.95, 0.95), (0.55, 0.95), (0.5, 0.3), (0.45, 0.95), (0.05, 0.95)]],
        "chair": [[(0.2, 0.05), (0.4, 0.05), (0.4, 0.55), (0.85, 0.55), (0.85, 0.95), (0.2, 0.95)]],
        "sofa": [[(0.05, 0.3), (0.95, 0.3), (0.95, 0.85), (0.05, 0.85)]],
        "table": [[(0.05, 0.3), (0.95, 0.3), (0.95, 0.42), (0.85, 0.42), (0.85, 0.95), (0.75, 0.95), (0.75, 0.42),
                   (0.25, 0.42), (0.25, 0.95), (0.15, 0.95), (0.15, 0.42), (0.05, 0.42)]],
        "lipstick": [[(0.35, 0.3), (0.65, 0.3), (0.65, 0.95), (0.35, 0.95)], [(0.4, 0.05), (0.6, 0.15), (0.6, 0.3),
                                                                               (0.4, 0.3)]],
        "bottle": [[(0.42, 0.05), (0.58, 0.05), (0.58, 0.3), (0.8, 0.4), (0.8, 0.95), (0.2, 0.95), (0.2, 0.4),
                    (0.42, 0.3)]],
        "jar": [[(0.15, 0.35), (0.85, 0.35), (0.85, 0.95), (0.15, 0.95)], [(0.2, 0.2), (0.8, 0.2), (0.8, 0.35),
                                                                          (0.2, 0.35)]],
        "phone": [[(0.3, 0.05), (0.7, 0.05), (0.7, 0.95), (0.3, 0.95)]],
        "laptop": [[(0.15, 0.2), (0.85, 0.2), (0.85, 0.7), (0.15, 0.7)], [(0.05, 0.7), (0.95, 0.7), (0.95, 0.8),
                                                                          (0.05, 0.8)]],
        "speaker": [[(0.25, 0.1), (0.75, 0.1), (0.75, 0.95), (0.25, 0.95)]],
        "car": [[(0.05, 0.45), (0.3, 0.45), (0.4, 0.25), (0.7, 0.25), (0.8, 0.45), (0.95, 0.45), (0.95, 0.8),
                 (0.05, 0.8)]],
        "van": [[(0.05, 0.2), (0.75, 0.2), (0.95, 0.5), (0.95, 0.85), (0.05, 0.85)]],
        "truck": [[(0.05, 0.25), (0.6, 0.25), (0.6, 0.85), (0.05, 0.85)], [(0.6, 0.45), (0.8, 0.45), (0.95, 0.6),
                                                                          (0.95, 0.85), (0.6, 0.85)]],
    }
    return [[(x0 + u * s, y0 + v * s) for u, v in poly] for poly in designs[product]]


def _draw_product(draw: ImageDraw.ImageDraw, product: str, colours: tuple[str, str], x0: float, y0: float,
                  s: float) -> None:
    """Main colour for the body, accent colour for the second part (or a band across a single-part design)."""
    polys = _shape(product, x0, y0, s)
    draw.polygon(polys[0], fill=PALETTE[colours[0]])
    if len(polys) > 1:
        draw.polygon(polys[1], fill=PALETTE[colours[1]])
    else:
        ys = [p[1] for p in polys[0]]
        top, bot = min(ys), max(ys)
        band = [(x0 + 0.3 * s, top + 0.55 * (bot - top)), (x0 + 0.7 * s, top + 0.55 * (bot - top)),
                (x0 + 0.7 * s, top + 0.7 * (bot - top)), (x0 + 0.3 * s, top + 0.7 * (bot - top))]
        draw.polygon(band, fill=PALETTE[colours[1]])


def _room(rng: random.Random) -> Image.Image:
    img = Image.new("RGB", (SIZE, SIZE), rng.choice(_WALLS))
    d = ImageDraw.Draw(img)
    horizon = rng.randint(55, 65)
    d.rectangle([0, horizon, SIZE, SIZE], fill=rng.choice(_FLOORS))
    wx = rng.randint(5, 60)
    d.rectangle([wx, 8, wx + 26, 30], fill=(225, 232, 238), outline=(170, 170, 170))
    return img


def synth_record(category: str, index: int, seed: int = 0, p_mutation: float = 0.3, p_omission: float = 0.25,
                 p_background: float = 0.3) -> VigilRecord:
    """One composite of ``category`` with independently injected hallucinations (labels = what was injected)."""
    rng = random.Random(f"{seed}/vigil/{category}/{index}")
    products = rng.sample(CATEGORIES[category], rng.choice((1, 2)))
    colours = [tuple(rng.sample(list(PALETTE), 2)) for _ in products]
    bg = _room(rng)
    refs = []
    for prod, col in zip(products, colours):
        ref = Image.new("RGB", (48, 48), (255, 255, 255))
        _draw_product(ImageDraw.Draw(ref), prod, col, 4, 4, 40)
        refs.append(np.asarray(ref))
    mutate = rng.random() < p_mutation
    omit = rng.random() < p_omission
    change_bg = rng.random() < p_background
    gen = bg.copy()
    d = ImageDraw.Draw(gen)
    slots = [(6, 44), (54, 44)] if len(products) == 2 else [(rng.randint(20, 40), 44)]
    drop = rng.randrange(len(products)) if omit else -1
    mut = rng.randrange(len(products)) if mutate else -1
    placed = []
    for k, (prod, col, (x, y)) in enumerate(zip(products, colours, slots)):
        if k == drop:
            continue
        s = rng.randint(28, 34)
        if k == mut:
            col = (rng.choice([c for c in PALETTE if c not in col]), col[1])
        d.ellipse([x + 2, y + s - 3, x + s - 2, y + s + 4], fill=(95, 92, 88))  # contact shadow
        _draw_product(d, prod, col, x, y, s)
        placed.append((x, y, s))
    if change_bg:  # a repainted patch away from the objects (muted, so it is not taken for an object)
        px, py = rng.randint(0, SIZE - 22), rng.randint(2, 20)
        d.rectangle([px, py, px + 20, py + 14], fill=(rng.randint(90, 130), rng.randint(110, 140), rng.randint(90, 120)))
    arr = np.asarray(gen).astype(np.int16) + rng.randint(-4, 4)  # global brightness jitter
    if rng.random() < 0.5:  # isolated speckle pixels, as left by compression
        nrng = np.random.default_rng(rng.randrange(2**31))
        idx = nrng.random(arr.shape[:2]) < 0.02
        arr[idx] = nrng.integers(0, 256, size=(int(idx.sum()), 1))
    prompt = "Place " + " and ".join(f"the {c[0]} {p}" for p, c in zip(products, colours)) + " in this room."
    labels = {"objects": mutate and mut != drop, "background": change_bg, "object_omission": omit}
    return VigilRecord(f"{category}-{index:04d}", category, prompt, np.asarray(bg), refs,
                       np.clip(arr, 0, 255).astype(np.uint8), labels)


def synthetic_vigil(per_category: int = 30, seed: int = 0) -> list[VigilRecord]:
    """``per_category`` composites in each of the 5 categories."""
    if per_category < 1:
        raise ValueError(f"per_category must be >= 1, got {per_category}")
    return [synth_record(c, i, seed) for c in CATEGORIES for i in range(per_category)]


def synthetic_inputs(cfg) -> VigilInputs:
    """The synthetic composites of ``cfg`` (a :class:`~halsift.eval.runs.vigil.VigilEvalConfig` with
    ``synthetic``) with the stages they are drawn for: this world's vocabulary, the colour segmenter and the
    colour/shape encoder."""
    return VigilInputs(synthetic_vigil(cfg.per_category, cfg.seed), VOCABULARY, ColourSegmenter(),
                       ColourShapeEncoder(), f"synthetic composites (seed {cfg.seed}, {cfg.per_category} per category)")


__all__ = ["CATEGORIES", "VOCABULARY", "PALETTE", "synth_record", "synthetic_vigil", "synthetic_inputs"]
