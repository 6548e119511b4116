"""Batched preprocessing: 8-bit images handed over, the model's input equal bit for bit to the per-image path."""

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T

from halsift.filtering.base import Item
from halsift.filtering.clip_detector import ClipDetector, encode_text
from halsift.filtering.pixel_batch import PixelBatcher


def _images(sizes, mode="RGB", seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for h, w in sizes:
        arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        out.append(Image.fromarray(arr).convert(mode))
    return out


@pytest.fixture(scope="module")
def det():
    return ClipDetector(arch="halsift-tiny", seed=3)


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
    with pytest.raises(RuntimeError):  # different sizes cannot stack, as with per-image preprocessing
        PixelBatcher(short_side)(images)
