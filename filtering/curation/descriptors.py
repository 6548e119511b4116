"""Per-image descriptors used to find duplicates without a model.

- ``sha256`` of the image bytes, and of the normalized caption (NFKC, case-folded, whitespace collapsed): exact
  copies.
- ``phash`` (imagehash's DCT perceptual hash, 64 bits): robust to re-encoding, resizing and mild colour changes, the
  standard near-duplicate hash, and imagehash is small and well kept; used for duplicates inside the corpus.
- ``thumbnail``: a 12x12 RGB tiny image (Torralba et al.'s "tiny images" near-duplicate descriptor), compared by
  cosine after each channel is standardized (so brightness/contrast jitter cancels). Evaluation images are
  expanded into :data:`CUTS` crop variants, so a corpus copy cropped by up to 10% of a side lines up with one of
  them within 2.5%: phash is not shift-invariant and missed cropped leaks (docs/curation.md has the numbers).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterator

import numpy as np
from PIL import Image

THUMB = 12  # thumbnail side
THUMB_DIM = THUMB * THUMB * 3
# (left/top cut, right/bottom cut) as shares of a side: every crop of <= 10% is within 2.5% of one of these
CUTS = ((0.0, 0.0), (0.0, 0.05), (0.05, 0.0), (0.0, 0.1), (0.05, 0.05), (0.1, 0.0))
_SPACE = re.compile(r"\s+")


def normalize_caption(text: str) -> str:
    """NFKC, case-folded, whitespace collapsed and stripped: captions that differ only in these are the same."""
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def sha256_hex(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def phash_bytes(img: Image.Image) -> bytes:
    """imagehash's 64-bit phash as 8 bytes (bit order of ``hash.flatten()``, packed big-endian per byte)."""
    import imagehash

    return np.packbits(np.asarray(imagehash.phash(img).hash, bool).reshape(-1)).tobytes()


def thumbnail(img: Image.Image) -> bytes:
    """The 12x12 RGB thumbnail (uint8 bytes, bilinear)."""
    return np.asarray(img.convert("RGB").resize((THUMB, THUMB), Image.BILINEAR), np.uint8).tobytes()


def thumb_vectors(thumbs: np.ndarray) -> np.ndarray:
    """uint8 thumbnails ``[N, THUMB_DIM]`` -> float32 unit vectors (each channel standardized, then L2-normalised;
    the +8 keeps flat images from blowing up)."""
    a = thumbs.reshape(len(thumbs), -1, 3).astype(np.float32)
    a = (a - a.mean(1, keepdims=True)) / (a.std(1, keepdims=True) + 8.0)
    v = a.reshape(len(thumbs), -1)
    return np.ascontiguousarray(v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-6))


def crop_variants(img: Image.Image) -> Iterator[Image.Image]:
    """The image cut by every pair of :data:`CUTS` horizontally and vertically (36 crops, the first uncut)."""
    w, h = img.size
    for a, b in CUTS:
        for c, d in CUTS:
            yield img.crop((round(a * w), round(c * h), w - round(b * w), h - round(d * h)))
