"""Image preprocessing split at the tensor conversion: per-image geometry on the CPU, then one batched
``to float / normalize`` where the model runs.

open_clip's preprocessing (``Resize -> CenterCrop -> convert mode -> ToTensor -> Normalize``) converts and normalizes
each image on its own: ~0.1 ms of per-image tensor work on a CPU, 4 bytes per pixel channel to copy between
processes and to the GPU. :class:`PixelBatcher` runs the leading PIL transforms per image as they are, stacks the
resulting 8-bit images into one ``uint8 [N, H, W, C]`` tensor (what input workers hand over and what is copied to
the device), and :meth:`PixelBatcher.finish` converts and normalizes the whole batch with the same float32 operations
(``permute -> float -> /255``, then torchvision's ``normalize``): the pixels equal the per-image ones bit for bit
(tested). A preprocessing of any other shape, or images that do not all end the same size and 3 channels, keep the
per-image path (``float [N, C, H, W]``, already final). Hand-written because torchvision's transforms convert one
image at a time and open_clip does not expose its pipeline's parts.

**Decoding on the model's device** (a detector's ``decode=gpu``, the default on CUDA): plain JPEGs reach the batcher
undecoded (:class:`~halsift.corpus.images.EncodedJpeg`, header and bomb limit checked by the reader); the batch
carries their bytes (one ``uint8`` buffer and its offsets) next to the host-decoded rest, and :meth:`PixelBatcher.finish`
decodes them in one ``torchvision.io.decode_jpeg`` call on the model's device (nvJPEG on CUDA, libjpeg on a CPU,
which is what CPU tests check), then runs the same ``Resize`` and ``CenterCrop`` modules on the ``uint8`` tensors
(grouped by size), converts and normalizes. A JPEG the device decoder refuses is decoded on the host
(:func:`~halsift.corpus.images.decode_pixels`) and counted (``fallback``); one neither reads is counted
(``unreadable``) and its rows reported by :attr:`PixelBatcher.unreadable` (the detector scores them as unparsed).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

DECODE_MODES = ("auto", "cpu", "gpu")


def _split(preprocess: Any) -> tuple[list[Callable], Any] | None:
    """(the PIL transforms before the tensor conversion, the final ``Normalize``) when ``preprocess`` is a
    ``Compose`` of PIL-level steps, then ``ToTensor`` (or open_clip's ``MaybeToTensor``), then ``Normalize``."""
    from torchvision import transforms as T

    steps = list(getattr(preprocess, "transforms", None) or ())
    if len(steps) < 2 or type(steps[-1]) is not T.Normalize or not isinstance(steps[-2], T.ToTensor):
        return None
    head = steps[:-2]
    pil_level = (T.Resize, T.CenterCrop)
    for s in head:  # PIL resizes/crops, and mode conversions (open_clip's MaybeConvertMode, _convert_to_rgb)
        if not (isinstance(s, pil_level) or "convert" in getattr(type(s), "__name__", getattr(s, "__name__", ""))
                .lower()):
            return None
    return head, steps[-1]


def _pil(im: Any) -> Any:
    """A PIL image of ``im``: an RGB ``uint8 [H, W, 3]`` array converted, anything else as it is."""
    import numpy as np
    from PIL import Image

    return Image.fromarray(im, "RGB") if isinstance(im, np.ndarray) else im


class PixelBatcher:
    """``batcher(images)`` -> a batch tensor for :meth:`finish`; built from a detector's ``preprocess``."""

    def __init__(self, preprocess: Any) -> None:
        self.preprocess = preprocess
        split = _split(preprocess)
        self.head, self.normalize = split if split else (None, None)
        self._stats: dict = {}  # device -> Normalize's (mean, std) as [C, 1, 1] float32 tensors, made once
        self._identity: dict = {}  # (size, mode) -> whether the PIL steps leave such an image as it is
        self.geometry = _tensor_geometry(self.head)  # the Resize/CenterCrop modules, when they end at a fixed size
        self.counts: Counter = Counter()  # images decoded on the device / host / fallback / unreadable
        self.unreadable: list[int] = []  # rows (distinct images) of the last finish() that no decoder read
        self.on_device = False  # set by the detector where JPEGs are decoded on its device: host images counted

    def take_counts(self) -> dict:
        """The decode counts since the last call (``device``, ``host``, ``fallback``, ``unreadable``), reset."""
        out, self.counts = dict(self.counts), Counter()
        return out

    def _is_identity(self, key: tuple) -> bool:
        """Whether :attr:`head` returns an image of ``key``'s (size, mode) unchanged (e.g. a 64 px square JPEG
        decoded at 1/4 scale for ``Resize(64) -> CenterCrop(64)``): each step keeps the size (a same-size
        ``Resize`` or ``CenterCrop`` returns the pixels as they are) and the mode stays RGB, checked once per
        (size, mode) on a random probe image, whose pixels must come back equal."""
        import numpy as np
        from PIL import Image

        if key not in self._identity:
            size, mode = key
            same = mode == "RGB"
            if same:
                probe = np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
                out = Image.fromarray(probe, "RGB")
                for step in self.head:
                    out = step(out)
                    same = same and getattr(out, "size", None) == size and getattr(out, "mode", None) == "RGB"
                same = same and np.array_equal(np.asarray(out), probe)
            self._identity[key] = same
        return self._identity[key]

    def __call__(self, images: Sequence[Any]):
        """``uint8 [N, H, W, 3]`` where the preprocessing splits and every image ends the same size, otherwise the
        per-image preprocessing stacked (``float [N, C, H, W]``). Images are PIL images or ``uint8 [H, W, 3]`` RGB
        arrays (:func:`~halsift.corpus.images.decode_pixels`)."""
        from halsift.corpus.images import EncodedJpeg

        jpeg = [i for i, im in enumerate(images) if isinstance(im, EncodedJpeg)]
        if jpeg:
            return self._with_jpeg(images, jpeg)
        return self._host(images)

    def _with_jpeg(self, images: Sequence[Any], jpeg: list[int]) -> dict:
        """The batch of a mix of undecoded JPEGs and host-decoded images: ``{"jpeg"`` (their bytes, concatenated),
        ``"offsets"`` (``[K + 1]``), ``"host"`` (the rest, as :meth:`_host` makes them; absent when none),
        ``"order"}`` (the image rows: the JPEGs', then the rest's)."""
        import numpy as np
        import torch

        taken = set(jpeg)
        rest = [i for i in range(len(images)) if i not in taken]
        blobs = [images[i].data for i in jpeg]
        out = {"jpeg": torch.frombuffer(bytearray().join(blobs), dtype=torch.uint8),
               "offsets": torch.from_numpy(np.cumsum([0] + [len(b) for b in blobs], dtype=np.int64)),
               "order": torch.as_tensor(jpeg + rest, dtype=torch.int64)}
        if rest:
            out["host"] = self._host([images[i] for i in rest])
        return out

    def _host(self, images: Sequence[Any]):
        """:meth:`__call__` of host-decoded images (PIL images or arrays)."""
        import numpy as np
        import torch

        if self.head is not None:
            arrays = []
            for im in images:
                is_array = isinstance(im, np.ndarray)
                key = ((im.shape[1], im.shape[0]), "RGB") if is_array else (im.size, im.mode)
                if self._is_identity(key):  # skips ~25 us of PIL copies per image where nothing changes
                    arrays.append(im if is_array else np.asarray(im))
                    continue
                im = _pil(im)
                for step in self.head:
                    im = step(im)
                if getattr(im, "mode", None) != "RGB":
                    break
                arrays.append(np.asarray(im))
            else:
                if arrays and all(a.shape == arrays[0].shape for a in arrays):
                    return torch.from_numpy(np.stack(arrays))
        return torch.stack([self.preprocess(_pil(im)) for im in images])

    def finish(self, pixels, device: Any = "cpu", dtype=None):
        """The model's input on ``device`` in ``dtype``: a ``uint8`` batch is copied as bytes, then converted and
        normalized there; a float batch is only moved; a batch with undecoded JPEGs (a dict) is decoded there."""
        import torch

        self.unreadable = []
        if isinstance(pixels, dict):
            return self._finish_jpeg(pixels, device, dtype)
        if self.on_device:  # a batch without a plain JPEG
            self.counts["host"] += len(pixels)
        return self._finish_host(pixels, device, dtype)

    def _finish_host(self, pixels, device: Any, dtype):
        import torch

        if pixels.dtype != torch.uint8:
            return pixels.to(device, dtype=dtype, non_blocking=True)
        return self._normalized(pixels.to(device, non_blocking=True).permute(0, 3, 1, 2), dtype)

    def _finish_jpeg(self, pixels: dict, device: Any, dtype):
        import torch

        buf, off = pixels["jpeg"], pixels["offsets"].tolist()
        blobs = [buf[a:b] for a, b in zip(off, off[1:])]
        decoded = _decode_jpegs(blobs, torch.device(device))
        parts, bad = [], []
        fixed = [(i, im) for i, im in enumerate(decoded) if im is not None]
        if fixed:
            parts.append(self._geometry([im for _, im in fixed]))
        self.counts["device"] += len(fixed)
        for i, im in enumerate(decoded):  # refused by the device decoder: decoded on the host, or unreadable
            if im is None:
                host = self._host_fallback(bytes(blobs[i].cpu().numpy()))
                if host is None:
                    bad.append(i)
                    self.counts["unreadable"] += 1
                    host = torch.zeros(1, 3, *self.geometry.out_size, dtype=torch.uint8)
                else:
                    self.counts["fallback"] += 1
                parts.append(host.to(device))
                fixed.append((i, None))
        x = self._normalized(torch.cat(parts), dtype) if parts else None
        rows = [i for i, _ in fixed]  # row of each of x's images among the JPEGs
        if "host" in pixels:
            self.counts["host"] += len(pixels["host"])
            rest = self._finish_host(pixels["host"], device, x.dtype if x is not None else dtype)
            x = rest if x is None else torch.cat([x, rest])
            rows += range(len(blobs), len(blobs) + len(rest))
        order = pixels["order"].tolist()
        self.unreadable = [order[i] for i in bad]
        out = torch.empty_like(x)
        out[torch.as_tensor([order[r] for r in rows], device=x.device)] = x
        return out

    def _host_fallback(self, data: bytes):
        """``uint8 [1, C, H, W]`` of a JPEG the device decoder refused, decoded and resized on the host as the CPU
        path does; None when the host cannot read it either."""
        import torch

        from halsift.corpus.images import ImageDecodeError, decode_pixels

        try:
            host = self._host([decode_pixels(data)])
        except ImageDecodeError:
            return None
        return host.permute(0, 3, 1, 2) if host.dtype == torch.uint8 else None

    def _geometry(self, images: list):
        """``uint8 [N, C, H, W]``: :attr:`geometry`'s modules on each decoded ``[C, H, W]`` image, images of one
        size resized together."""
        import torch

        by_size: dict = {}
        for i, im in enumerate(images):
            by_size.setdefault(tuple(im.shape), []).append(i)
        out = [None] * len(images)
        for idx in by_size.values():
            batch = torch.stack([images[i] for i in idx])
            for step in self.geometry.steps:
                batch = step(batch)
            for j, i in enumerate(idx):
                out[i] = batch[j]
        return torch.stack(out)

    def _normalized(self, x, dtype):
        """``uint8 [N, C, H, W]`` -> ToTensor's float32 ``/255`` and torchvision's normalize, then ``dtype``."""
        import torch

        x = x.to(torch.float32, memory_format=torch.contiguous_format).div_(255)  # ToTensor's ops, in place
        if x.device not in self._stats:  # not per batch: on a GPU each would be a small synchronous copy
            self._stats[x.device] = tuple(torch.as_tensor(v, dtype=torch.float32, device=x.device).view(-1, 1, 1)
                                          for v in (self.normalize.mean, self.normalize.std))
        mean, std = self._stats[x.device]
        x.sub_(mean).div_(std)  # torchvision's normalize, batched
        return x if dtype is None else x.to(dtype)


class _Geometry:
    __slots__ = ("steps", "out_size")

    def __init__(self, steps: list, out_size: tuple[int, int]) -> None:
        self.steps, self.out_size = steps, out_size


def _tensor_geometry(head: list | None) -> _Geometry | None:
    """The ``Resize``/``CenterCrop`` modules of a split preprocessing (they run on ``uint8`` tensors as on PIL
    images; the mode conversions are the decoder's RGB output), when the last fixes the output size; else None."""
    from torchvision import transforms as T

    if head is None:
        return None
    steps = [s for s in head if isinstance(s, (T.Resize, T.CenterCrop))]
    last = steps[-1] if steps else None
    size = getattr(last, "size", None)
    if isinstance(last, T.Resize):
        size = tuple(size) if isinstance(size, (list, tuple)) and len(size) == 2 else None
    elif isinstance(last, T.CenterCrop):
        size = tuple(size) if len(size) == 2 else (size[0], size[0])
    return _Geometry(steps, (int(size[0]), int(size[1]))) if size else None


def _decode_jpegs(blobs: list, device: Any) -> list:
    """``uint8 [3, H, W]`` RGB tensors on ``device`` (one batched ``torchvision.io.decode_jpeg`` call; on a failure,
    one call per image), None where the decoder refuses an image."""
    import warnings

    from torchvision.io import ImageReadMode, decode_jpeg

    if not blobs:
        return []
    with warnings.catch_warnings():  # torchvision >= 0.29 points to TorchCodec; its decode_jpeg is what we want
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return list(decode_jpeg(blobs, mode=ImageReadMode.RGB, device=device))
        except RuntimeError:
            pass
        out = []
        for b in blobs:
            try:
                out.append(decode_jpeg(b, mode=ImageReadMode.RGB, device=device))
            except RuntimeError:
                out.append(None)
    return out


def device_decoding(decode: str, device: Any, batcher: PixelBatcher, who: str) -> bool:
    """Whether ``decode`` (``auto``: on CUDA | ``cpu`` | ``gpu``) decodes JPEGs on the model's ``device`` (a CPU
    model: torchvision's CPU decoder, the same tensor path). ``gpu`` with a preprocessing that does not end at a
    fixed size through Resize/CenterCrop is a ``ValueError`` naming ``who``; ``auto`` then decodes on the host.
    Sets ``batcher.on_device`` (which then counts the images decoded on the host too)."""
    import torch

    if decode not in DECODE_MODES:
        raise ValueError(f"{who}: decode={decode!r}: expected auto, cpu or gpu")
    if decode == "cpu":
        on = False
    elif batcher.geometry is None:
        if decode == "gpu":
            raise ValueError(f"{who}: decode=gpu needs a preprocessing of Resize/CenterCrop to a fixed size, then "
                             "ToTensor and Normalize; this model's is not (use decode=cpu)")
        on = False
    else:
        on = decode == "gpu" or torch.device(device).type == "cuda"
    batcher.on_device = on
    return on


def image_text_inputs(items: Sequence[Any], batcher: PixelBatcher, tokenizer: Callable, who: str,
                      device: Any = "cpu") -> dict:
    """The CPU half of a CLIP-style scorer: ``{"pixels"`` (each distinct image once, see :class:`PixelBatcher`),
    ``"rows"`` (each item's image row), ``"tokens"}`` (the items' sentences). Raises ``ValueError`` naming ``who``
    and the item when one has no image. Pinned when the model is on CUDA and this is not an input worker (there
    the DataLoader pins them in the model's process: CUDA cannot start in a forked worker)."""
    import torch

    from halsift.filtering.detectors.base import distinct_images

    for it in items:
        if it.image is None:
            raise ValueError(f"{who}: item {it.key}/{it.sentence_index} has no image")
    images, idx = distinct_images(items)  # bench rows of one image: distinct keys, one image
    out = {"pixels": batcher(images), "rows": torch.as_tensor(idx), "tokens": tokenizer([it.sentence for it in items])}
    if torch.device(device).type == "cuda" and torch.utils.data.get_worker_info() is None:
        out = {k: ({n: t.pin_memory() for n, t in v.items()} if isinstance(v, dict) else v.pin_memory())
               for k, v in out.items()}  # page-locked: copies to the GPU run asynchronously
    return out


__all__ = ["DECODE_MODES", "PixelBatcher", "device_decoding", "image_text_inputs"]
