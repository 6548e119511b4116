"""Image decoding that never crashes a run, and the counter that reports what was skipped.

:func:`decode_image` turns the bytes of any image Pillow reads into an RGB ``PIL.Image`` (EXIF orientation
applied, alpha composited on white, 16-bit greyscale scaled to 8 bits) or raises :class:`ImageDecodeError`
with the sample key and a reason: zero bytes, not an image, truncated/corrupt, or a decompression bomb
(more pixels than ``max_pixels``, checked from the header before any pixel is decoded).

Scoring and selection runs catch the error, count it in a :class:`SkipCounter` and go on; the counter's
``to_json()`` goes into the run's outputs so that skipped samples are reported with key and reason.
"""

from __future__ import annotations

import io
import os
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

try:  # libjpeg-turbo without Pillow's row conversions (see _turbo_pixels); Pillow alone where it has no wheel
    import simplejpeg as _simplejpeg
except ImportError:  # pragma: no cover - depends on the platform
    _simplejpeg = None

# Refuse images above this many pixels (Pillow's own bomb limit is ~89 MP; web corpora rarely need more
# than 8k x 8k for CLIP-sized training, and a bomb can allocate gigabytes).
DEFAULT_MAX_PIXELS = 8192 * 8192

SKIP_KINDS = ("empty", "not_image", "truncated", "corrupt", "bomb", "empty_caption", "missing_image",
              "corrupt_shard", "bad_sample", "duplicate", "bad_caption")


class ImageDecodeError(ValueError):
    """An image could not be decoded; ``key`` names the sample, ``reason`` says why, ``kind`` is the category
    (one of :data:`SKIP_KINDS`) used for counting."""

    def __init__(self, key: str, reason: str, kind: str = "corrupt") -> None:
        super().__init__(f"image {key or '(no key)'}: {reason}")
        self.key = key
        self.reason = reason
        self.kind = kind


def _to_rgb(img: Image.Image) -> Image.Image:
    """Convert any Pillow mode to RGB: alpha over white, 16/32-bit and float greyscale scaled to 8 bits."""
    mode = img.mode
    if mode == "RGB":
        return img
    if mode.startswith("I;16") or mode in ("I", "F"):
        arr = np.asarray(img, dtype=np.float64)
        lo, hi = float(arr.min(initial=0.0)), float(arr.max(initial=0.0))
        if mode.startswith("I;16") or (mode == "I" and lo >= 0 and 255 < hi <= 65535):
            arr = arr / 257.0  # 16-bit range: 65535 -> 255 (Pillow may open 16-bit PNGs as "I")
        elif lo < 0 or hi > 255:  # other wide ranges: stretch the used range onto 0..255
            arr = (arr - lo) * (255.0 / (hi - lo))
        grey = Image.fromarray(np.clip(np.rint(arr), 0, 255).astype(np.uint8), "L")
        return grey.convert("RGB")
    has_alpha = mode in ("RGBA", "LA", "PA", "RGBa", "La") or (mode == "P" and "transparency" in img.info)
    if has_alpha:
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")  # L, 1, P, CMYK, YCbCr, LAB, HSV


def _draft_factor(size: tuple[int, int], draft: int) -> int:
    """Pillow's ``JpegImageFile.draft`` rule: the largest of 8, 4, 2, 1 that keeps both sides >= ``draft``."""
    scale = min(size[0] // draft, size[1] // draft)
    return next(a for a in (8, 4, 2, 1) if scale >= a or a == 1)


def _plain_jpeg_size(data: bytes, max_pixels: int) -> tuple[int, int] | None:
    """(width, height) of a JPEG that :func:`_turbo_pixels` may decode without Pillow parsing its header first
    (~40 us of Python per image): it starts as Pillow requires, libjpeg reads its header, it is greyscale or
    3-channel, it holds no Exif or XMP block (an orientation needs Pillow) nor MPO index (Pillow opens those as
    MPO), and it is within both size limits. None for anything else: Pillow opens it and judges it as before."""
    if _simplejpeg is None or data[:3] != b"\xff\xd8\xff":
        return None
    try:
        h, w, colorspace, _ = _simplejpeg.decode_jpeg_header(data)
    except Exception:  # noqa: BLE001 - any header libjpeg-turbo does not read: Pillow's path reports it
        return None
    limit = min(max_pixels, Image.MAX_IMAGE_PIXELS or max_pixels)  # Pillow's bomb check, then ours, raise there
    if colorspace not in ("YCbCr", "Gray", "RGB") or not 0 < w * h <= limit:
        return None
    return (w, h) if _plain_segments(data) else None


def _plain_segments(data: bytes) -> bool:
    """Whether the marker segments before the first scan hold no APP1 block (Exif, XMP) and no MPO index, walked
    by length (a few segments: ~1 us, where searching the whole file cost ~10). Anything unexpected is False."""
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return False
        marker = data[i + 1]
        if marker == 0xFF:  # a fill byte before a marker
            i += 1
            continue
        if marker == 0xDA:  # start of scan: the header is over
            return True
        if marker == 0xE1:  # Exif or XMP: either may hold an orientation Pillow applies
            return False
        if marker == 0xE2 and data[i + 4:i + 8] == b"MPF\x00":
            return False
        i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
    return False


def _turbo_eligible(img: Image.Image) -> bool:
    """Whether a JPEG Pillow opened may take :func:`_turbo_pixels`: RGB/greyscale, no rotation to apply (Pillow reads
    the orientation from the Exif block, or else from XMP's ``tiff:Orientation``)."""
    if _simplejpeg is None or img.format != "JPEG" or img.mode not in ("RGB", "L"):
        return False
    if "exif" in img.info or "xmp" in img.info:
        try:
            return img.getexif().get(0x0112, 1) == 1  # an orientation to apply: Pillow transposes
        except Exception:  # noqa: BLE001 - a broken EXIF block: Pillow's path keeps the pixels as before
            return False
    return True


def _turbo_pixels(data: bytes, size: tuple[int, int], draft: int | None) -> np.ndarray | None:
    """An RGB/greyscale JPEG of ``size`` decoded by simplejpeg (libjpeg-turbo straight into an RGB array, without
    Pillow's per-row conversions): the pixels of Pillow's decode, draft scale included (tested bit-equal), at ~30%
    less CPU. None when libjpeg reports any problem (strict mode): Pillow then decodes, and reports damage, as
    before."""
    w, h = size
    a = _draft_factor(size, int(draft)) if draft else 1
    out_w, out_h = -(-w // a), -(-h // a)
    # libjpeg-turbo picks the most reduced scale that keeps these sides: 1/a, as Pillow's draft does
    kw = {"min_width": out_w, "min_height": out_h} if a > 1 else {}
    try:
        pixels = _simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True, **kw)
    except Exception:  # noqa: BLE001 - any libjpeg error or warning: Pillow decodes and judges the file
        return None
    return pixels if pixels.shape[:2] == (out_h, out_w) else None


def header_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the image header, without decoding the pixels and whatever the size (a 20000x20000
    JPEG too: Pillow's bomb check would refuse to open it); ``None`` when the header is unreadable. Stages that
    decode judge the size against :data:`DEFAULT_MAX_PIXELS` (:func:`check_size`); ``basic`` records it."""
    if not data:
        return None
    if data[:3] == b"\xff\xd8\xff" and _simplejpeg is not None:
        try:
            h, w, _, _ = _simplejpeg.decode_jpeg_header(data)
            return (int(w), int(h)) if w > 0 and h > 0 else None
        except Exception:  # noqa: BLE001 - a header libjpeg-turbo does not read: Pillow below
            pass
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and len(data) >= 24:
        w, h = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        return (w, h) if w > 0 and h > 0 else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:  # lazy: reads the header, not the pixels
                w, h = im.size
    except Exception:  # noqa: BLE001 - any parser failure of a hostile file: unreadable
        return None
    return (int(w), int(h)) if w > 0 and h > 0 else None


def check_size(data: bytes, key: str = "", max_pixels: int = DEFAULT_MAX_PIXELS) -> None:
    """The one image-size rule of every stage that reads shards, for a reader that does not decode (a text-only
    detector): :class:`ImageDecodeError` of kind ``bomb`` when the header says more than ``max_pixels`` pixels, as
    decoding would (an unreadable header is left to the decoder, where there is one)."""
    size = header_size(data)
    if size is not None and size[0] * size[1] > max_pixels:
        w, h = size
        raise ImageDecodeError(key, f"decompression bomb refused: {w}x{h} = {w * h} pixels > limit {max_pixels}",
                               "bomb")


def decode_image(data: bytes, key: str = "", max_pixels: int = DEFAULT_MAX_PIXELS,
                 draft: int | None = None) -> Image.Image:
    """Decode image bytes to an RGB image, or raise :class:`ImageDecodeError` naming ``key`` and the reason.

    ``draft``: a JPEG is decoded at the smallest DCT scale (1/2, 1/4 or 1/8) whose both sides stay >= ``draft``
    (libjpeg's reduced-size decoding: less inverse-DCT and colour work, and a smaller image to resize). Pixels
    differ slightly from a full decode followed by a resize; other formats decode in full."""
    out = _decode(data, key, max_pixels, draft)
    return Image.fromarray(out, "RGB") if isinstance(out, np.ndarray) else out


def decode_pixels(data: bytes, key: str = "", max_pixels: int = DEFAULT_MAX_PIXELS,
                  draft: int | None = None) -> np.ndarray:
    """:func:`decode_image`'s pixels as a ``uint8 [H, W, 3]`` RGB array, the same errors; where libjpeg-turbo
    decodes, no PIL image is built (for a consumer that batches arrays: ~20 µs per image less)."""
    out = _decode(data, key, max_pixels, draft)
    return out if isinstance(out, np.ndarray) else np.asarray(out)


class EncodedJpeg:
    """A JPEG kept undecoded for a batched decoder on the model's device (``decode=gpu``): its bytes and
    ``(width, height)``, read from a header that passed the checks of :func:`_plain_jpeg_size` (libjpeg reads it,
    3-channel or greyscale, no Exif/XMP orientation nor MPO index, within the decompression-bomb limit)."""

    __slots__ = ("data", "size")

    def __init__(self, data: bytes, size: tuple[int, int]) -> None:
        self.data, self.size = data, size


def _ends_whole(data: bytes) -> bool:
    """Whether a JPEG ends with its end-of-image marker (trailing padding allowed): a cut file does not."""
    return data.rstrip(b"\x00").endswith(b"\xff\xd9")


def jpeg_or_pixels(data: bytes, key: str = "", max_pixels: int = DEFAULT_MAX_PIXELS,
                   draft: int | None = None) -> EncodedJpeg | np.ndarray:
    """An :class:`EncodedJpeg` for a plain, whole JPEG (its header checked, the bomb limit included, nothing decoded:
    ~2 us), else :func:`decode_pixels` (other formats, oriented or cut JPEGs), with its errors."""
    if data:
        size = _plain_jpeg_size(data, max_pixels)
        if size is not None and _ends_whole(data):
            return EncodedJpeg(data, size)
    return decode_pixels(data, key, max_pixels, draft)


def _decode(data: bytes, key: str, max_pixels: int, draft: int | None) -> np.ndarray | Image.Image:
    """:func:`decode_image`'s work: libjpeg-turbo's RGB array, or else Pillow's RGB image."""
    if not data:
        raise ImageDecodeError(key, "zero-byte image", "empty")
    size = _plain_jpeg_size(data, max_pixels)
    if size is not None:
        pixels = _turbo_pixels(data, size, draft)
        if pixels is not None:
            return pixels
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise ImageDecodeError(key, f"not an image ({len(data)} bytes in no format Pillow reads)",
                               "not_image") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageDecodeError(key, f"decompression bomb refused ({e})", "bomb") from None
    except Exception as e:  # noqa: BLE001 - any parser failure of a hostile file is a skip, not a crash
        kind = "truncated" if "truncat" in str(e).lower() else "corrupt"
        raise ImageDecodeError(key, f"{kind} image header ({type(e).__name__}: {e})", kind) from None
    w, h = img.size
    if w * h > max_pixels:
        raise ImageDecodeError(key, f"decompression bomb refused: {w}x{h} = {w * h} pixels > limit {max_pixels}",
                               "bomb")
    if w == 0 or h == 0:
        raise ImageDecodeError(key, f"empty image size {w}x{h}", "corrupt")
    pixels = _turbo_pixels(data, img.size, draft) if size is None and _turbo_eligible(img) else None
    if pixels is not None:
        return pixels
    if draft and img.format == "JPEG":
        img.draft(None, (int(draft), int(draft)))  # sizes round up: both sides stay >= draft
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img.load()
    except OSError as e:
        kind = "truncated" if "truncat" in str(e).lower() else "corrupt"
        raise ImageDecodeError(key, f"{kind} image data ({e})", kind) from None
    except Exception as e:  # noqa: BLE001
        raise ImageDecodeError(key, f"corrupt image data ({type(e).__name__}: {e})", "corrupt") from None
    try:
        img = ImageOps.exif_transpose(img)
    except Exception:  # noqa: BLE001 - a broken EXIF block should not lose the pixels
        pass
    return _to_rgb(img)


def load_image_file(path: str | os.PathLike, key: str = "", max_pixels: int = DEFAULT_MAX_PIXELS,
                    draft: int | None = None) -> Image.Image:
    """:func:`decode_image` of a file (a bench or retrieval image); a missing path, a folder or a FIFO/device (whose
    read would block) is an :class:`ImageDecodeError` of kind ``missing_image`` naming the path."""
    path = Path(path)
    key = key or str(path)
    if not path.is_file():
        raise ImageDecodeError(key, f"{path} is missing or not a regular file", "missing_image")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ImageDecodeError(key, f"cannot read {path} ({e})", "missing_image") from None
    return decode_image(data, key, max_pixels, draft)


class SkipCounter:
    """Counts skipped samples by kind and keeps up to ``max_examples`` (key, kind, reason) records."""

    def __init__(self, max_examples: int = 10_000) -> None:
        self.max_examples = max_examples
        self.counts: Counter = Counter()
        self.examples: list[dict] = []

    def add(self, key: str, reason: str, kind: str | None = None, n: int = 1) -> None:
        """Record one skipped sample (or ``n`` lost together, e.g. the unreadable rest of a shard, under one
        example); ``kind`` defaults to ``reason`` (use a short category for counting)."""
        kind = kind or reason
        self.counts[kind] += n
        if len(self.examples) < self.max_examples:
            self.examples.append({"key": key, "kind": kind, "reason": reason})

    def add_error(self, err: ImageDecodeError) -> None:
        """Record an :class:`ImageDecodeError`."""
        self.add(err.key, err.reason, err.kind)

    def merge(self, other: "SkipCounter") -> None:
        """Add another counter's counts and examples (e.g. from another rank)."""
        self.counts.update(other.counts)
        room = self.max_examples - len(self.examples)
        self.examples.extend(other.examples[:max(room, 0)])

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __len__(self) -> int:
        return self.total

    def to_json(self) -> dict:
        """``{"total", "by_kind", "samples": [{"key", "kind", "reason"}], "samples_omitted"}``."""
        return {"total": self.total, "by_kind": dict(sorted(self.counts.items())),
                "samples": list(self.examples), "samples_omitted": self.total - len(self.examples)}

    @classmethod
    def from_json(cls, obj: dict) -> "SkipCounter":
        c = cls()
        c.counts.update(obj.get("by_kind", {}))
        c.examples = list(obj.get("samples", []))
        return c

    def summary(self) -> str:
        """One line, e.g. ``skipped 3 (truncated=2, empty_caption=1)``."""
        parts = ", ".join(f"{k}={v}" for k, v in self.counts.most_common())
        return f"skipped {self.total}" + (f" ({parts})" if parts else "")

    def write(self, path: str | os.PathLike) -> None:
        """Write :meth:`to_json` atomically."""
        from halsift.corpus.shards import write_json_atomic

        write_json_atomic(path, self.to_json())


def decode_sample(sample, skipped: SkipCounter, max_pixels: int = DEFAULT_MAX_PIXELS,
                  need_caption: bool = True, draft: int | None = None,
                  arrays: bool = False) -> Image.Image | np.ndarray | None:
    """Decode a :class:`~halsift.corpus.shards.Sample`'s image, or count why it is skipped and return None.

    Skips (with kind): no image member (``missing_image``), an empty/whitespace caption when
    ``need_caption`` (``empty_caption``), and every :class:`ImageDecodeError` kind. ``draft``: see
    :func:`decode_image`. ``arrays``: the pixels as :func:`decode_pixels` returns them (``"jpeg"``: as
    :func:`jpeg_or_pixels` does).
    """
    if not sample.image and not sample.ext:
        skipped.add(sample.key, "sample has no image member", "missing_image")
        return None
    if need_caption and not sample.caption.strip():
        skipped.add(sample.key, "empty caption", "empty_caption")
        return None
    try:
        return image_decoder(arrays)(sample.image, sample.key, max_pixels, draft)
    except ImageDecodeError as e:
        skipped.add_error(e)
        return None


def image_decoder(arrays: bool | str = False):
    """The decoder of a detector's ``image_arrays``: False :func:`decode_image` (PIL), True :func:`decode_pixels`
    (uint8 arrays), ``"jpeg"`` :func:`jpeg_or_pixels` (plain JPEGs undecoded, the rest as arrays)."""
    if arrays == "jpeg":
        return jpeg_or_pixels
    return decode_pixels if arrays else decode_image
