"""Batched preprocessing: 8-bit images handed over, the model's input equal bit for bit to the per-image path."""

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T

from halsift.filtering.detectors.base import Item
from halsift.filtering.detectors.clip import ClipDetector
from halsift.filtering.models.clip_models import encode_text
from halsift.filtering.detectors.pixel_batch import PixelBatcher


def _images(sizes, mode="RGB", seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for h, w in sizes:
        arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        out.append(Image.fromarray(arr).convert(mode))
    return out


@pytest.fixture(scope="module")
def det():
    return ClipDetector(arch="halsift-tiny", pretrained="random", seed=3)


def test_open_clip_preprocessing_is_split_and_equal_bit_for_bit(det):
    images = _images([(80, 100), (64, 64), (200, 90), (33, 70), (300, 300)])
    pixels = det.pixels(images)
    assert pixels.dtype == torch.uint8 and pixels.shape == (5, 64, 64, 3)
    got = det.pixels.finish(pixels)
    want = torch.stack([det.preprocess(im) for im in images])
    assert got.dtype == torch.float32 and got.is_contiguous()
    assert torch.equal(got, want)
    assert det.pixels.finish(pixels, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_scores_equal_the_per_image_path(det):
    images = _images([(90, 120), (64, 80), (128, 64)], seed=1)
    items = [Item(f"k{i}", j, s, [], im, "", {}) for i, im in enumerate(images)
             for j, s in enumerate(["A red car.", "Two small cats on the left."])]
    got = [r.score for r in det.score_batch(items)]
    with torch.inference_mode():  # the cosines computed from per-image preprocessing, by hand
        img = det.model.encode_image(torch.stack([det.preprocess(im) for im in images]))
        txt = encode_text(det.model, det.tokenizer([it.sentence for it in items]))
        img = torch.nn.functional.normalize(img, dim=-1)[[i // 2 for i in range(len(items))]]
        cos = (img * torch.nn.functional.normalize(txt, dim=-1)).sum(-1)
    assert got == [float(s) for s in ((cos + 1) * 50).clamp(0, 100)]


def test_other_preprocessing_keeps_the_per_image_path():
    norm = T.Normalize((0.5, 0.5, 0.5), (0.2, 0.2, 0.2))
    jitter = T.Compose([T.Resize(8), T.CenterCrop(8), T.ColorJitter(0.1), T.ToTensor(), norm])
    assert PixelBatcher(jitter).head is None
    no_norm = T.Compose([T.Resize(8), T.CenterCrop(8), T.ToTensor()])
    assert PixelBatcher(no_norm).head is None
    assert PixelBatcher(lambda im: im).head is None
    images = _images([(20, 30), (16, 16)])
    out = PixelBatcher(no_norm)(images)
    assert out.dtype == torch.float32 and torch.equal(out, torch.stack([no_norm(im) for im in images]))


def test_non_rgb_results_fall_back_to_per_image_preprocessing():
    norm = T.Normalize((0.5,), (0.2,))
    grey = T.Compose([T.Resize(8), T.CenterCrop(8), T.ToTensor(), norm])
    b = PixelBatcher(grey)
    assert b.head is not None
    images = _images([(20, 30), (16, 16)], mode="L")
    out = b(images)
    assert out.dtype == torch.float32 and out.shape == (2, 1, 8, 8)
    assert torch.equal(b.finish(out), torch.stack([grey(im) for im in images]))


def test_images_of_different_final_sizes_fall_back():
    norm = T.Normalize((0.5, 0.5, 0.5), (0.2, 0.2, 0.2))
    no_crop = T.Compose([T.Resize((8, 8)), T.ToTensor(), norm])
    images = _images([(20, 30), (16, 16)])
    assert PixelBatcher(no_crop)(images).dtype == torch.uint8  # a fixed (h, w) resize: one size
    short_side = T.Compose([T.Resize(8), T.ToTensor(), norm])
    # different sizes cannot stack, as with per-image preprocessing
    with pytest.raises(RuntimeError,
                       match="stack expects each tensor to be equal size"):
        PixelBatcher(short_side)(images)


class _Counting:
    """A PIL-level step (its name says "convert", so the batcher accepts it) that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, im):
        self.calls += 1
        return im.convert("RGB")


def test_images_the_steps_leave_unchanged_skip_them_and_stay_equal():
    norm = T.Normalize((0.5, 0.5, 0.5), (0.2, 0.2, 0.2))
    count = _Counting()
    type(count).__name__ = "_CountingConvert"
    pre = T.Compose([T.Resize(16), T.CenterCrop(16), count, T.ToTensor(), norm])
    b = PixelBatcher(pre)
    assert b.head is not None
    squares = _images([(16, 16)] * 5, seed=4)
    out = b(squares)
    assert count.calls == 1  # the probe of the (16x16, RGB) key, none of the five images
    assert torch.equal(b.finish(out), torch.stack([pre(im) for im in squares]))
    count.calls = 0
    others = _images([(16, 20), (24, 24)], seed=5) + [squares[0].convert("L")]
    out = b(others)
    assert count.calls == 2 + 3  # the two RGB keys' probes (an L image needs none), then every image
    assert torch.equal(b.finish(out), torch.stack([pre(im) for im in others]))


def test_a_size_kept_by_resize_then_crop_is_not_taken_for_identity():
    norm = T.Normalize((0.5, 0.5, 0.5), (0.2, 0.2, 0.2))
    pre = T.Compose([T.Resize(20), T.CenterCrop(16), T.ToTensor(), norm])  # 16x16 -> 20x20 -> 16x16
    images = _images([(16, 16)] * 3, seed=6)
    b = PixelBatcher(pre)
    assert torch.equal(b.finish(b(images)), torch.stack([pre(im) for im in images]))
    assert b._identity == {((16, 16), "RGB"): False}


def test_an_item_without_an_image_is_refused_naming_the_detector_and_item(det):
    from halsift.filtering.detectors.pixel_batch import image_text_inputs

    items = [Item("k0", 0, "A red car.", [], _images([(20, 20)])[0], "", {}), Item("k1", 2, "A cat.", [], None, "", {})]
    with pytest.raises(ValueError, match=r"clip detector: item k1/2 has no image"):
        det.prepare(items)
    out = image_text_inputs(items[:1] * 2, det.pixels, det.tokenizer, "x")
    assert out["pixels"].shape[0] == 1 and out["rows"].tolist() == [0, 0] and out["tokens"].shape[0] == 2
    assert not out["pixels"].is_pinned()  # on the CPU nothing is pinned


def test_arrays_and_pil_images_batch_the_same(det):
    images = _images([(64, 64), (80, 100), (64, 64), (33, 70)], seed=7)
    mixed = [np.asarray(im) if i % 2 == 0 else im for i, im in enumerate(images)]
    got = det.pixels(mixed)
    assert torch.equal(got, det.pixels(images))
    assert torch.equal(det.pixels.finish(got), torch.stack([det.preprocess(im) for im in images]))
    no_split = PixelBatcher(T.Compose([T.Resize(8), T.CenterCrop(8), T.ToTensor()]))  # per-image path: PIL again
    assert torch.equal(no_split([np.asarray(im) for im in images]), no_split(images))
