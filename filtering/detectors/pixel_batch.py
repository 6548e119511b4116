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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


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
        normalized there; a float batch is only moved."""
        import torch

        if pixels.dtype != torch.uint8:
            return pixels.to(device, dtype=dtype, non_blocking=True)
        x = pixels.to(device, non_blocking=True).permute(0, 3, 1, 2)
        x = x.to(torch.float32, memory_format=torch.contiguous_format).div_(255)  # ToTensor's ops, in place
        if x.device not in self._stats:  # not per batch: on a GPU each would be a small synchronous copy
            self._stats[x.device] = tuple(torch.as_tensor(v, dtype=torch.float32, device=x.device).view(-1, 1, 1)
                                          for v in (self.normalize.mean, self.normalize.std))
        mean, std = self._stats[x.device]
        x.sub_(mean).div_(std)  # torchvision's normalize, batched
        return x if dtype is None else x.to(dtype)


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
        out = {k: v.pin_memory() for k, v in out.items()}  # page-locked: copies to the GPU run asynchronously
    return out


__all__ = ["PixelBatcher", "image_text_inputs"]
