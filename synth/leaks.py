"""Planted evaluation leaks and exact copies in a synthetic world's corpus (``WorldSettings.leaks`` /
``exact_copies``; both 0 by default, so a world without them is byte-identical to one made before they existed).

A leak is a near-duplicate of a retrieval image placed in the corpus as a web crawl would hold it: cropped by up
to 10% of each side, resized to 75-150%, colour-jittered (brightness, contrast, saturation within +-10%) and
re-encoded as JPEG at quality 60-95; its caption is written by the corpus captioner from the retrieval image's
scene. An exact copy repeats an earlier corpus sample byte for byte (image and caption) under a new key. Both are
recorded in ``world.json`` (``leaks``: corpus key -> retrieval ``image``; ``exact_copies``: key -> original key).
"""

from __future__ import annotations

import io
import random

from PIL import Image, ImageEnhance

from halsift.corpus.shards import Sample

MAX_CROP = 0.10  # at most this share of each side is cut
SCALE = (0.75, 1.5)
JITTER = 0.10
QUALITY = (60, 95)


def near_copy(data: bytes, rng: random.Random) -> bytes:
    """A re-encoded, cropped, resized, colour-jittered JPEG of image ``data`` (seeded by ``rng``)."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = img.size
    cw, ch = round(w * (1 - rng.uniform(0, MAX_CROP))), round(h * (1 - rng.uniform(0, MAX_CROP)))
    x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
    img = img.crop((x, y, x + cw, y + ch))
    s = rng.uniform(*SCALE)
    img = img.resize((max(8, round(cw * s)), max(8, round(ch * s))), Image.BICUBIC)
    for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
        img = enhance(img).enhance(rng.uniform(1 - JITTER, 1 + JITTER))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=rng.randint(*QUALITY))
    return buf.getvalue()


def plan(seed: int, images: int, retrieval_images: int, leaks: int, exact_copies: int) -> dict[int, list]:
    """Corpus position -> the extra samples written after corpus sample ``position``: ``("leak", j, retrieval
    index)`` and ``("copy", j, source index)`` (a copy always follows its source)."""
    if leaks > retrieval_images:
        raise ValueError(f"leaks: {leaks} exceeds retrieval_images ({retrieval_images}); each leak copies a "
                         "different retrieval image")
    rng = random.Random(f"{seed}/leak-plan")
    at: dict[int, list] = {}
    for j, r in enumerate(rng.sample(range(retrieval_images), leaks)):
        at.setdefault(rng.randrange(images), []).append(("leak", j, r))
    for j in range(exact_copies):
        src = rng.randrange(images)
        at.setdefault(rng.randrange(src, images), []).append(("copy", j, src))
    return at


def leak_key(j: int) -> str:
    return f"l{j:07d}"


def copy_key(j: int) -> str:
    return f"d{j:07d}"


def exact_copy(sample: Sample, j: int) -> Sample:
    """``sample`` under the key of copy ``j`` (image bytes, caption and json otherwise unchanged)."""
    return Sample(copy_key(j), sample.image, sample.caption, dict(sample.meta), ext=sample.ext)
