"""Every odd image kind is converted to RGB or refused with a key and a reason, and skips are counted."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from halsift.corpus.images import ImageDecodeError, SkipCounter, decode_image, decode_pixels, decode_sample
from halsift.corpus.shards import Sample


def _bytes(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def _rgb(img: Image.Image) -> np.ndarray:
    assert img.mode == "RGB"
    return np.asarray(img)


def test_rgb_png_is_unchanged():
    arr = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    out = decode_image(_bytes(Image.fromarray(arr, "RGB"), "PNG"), "k")
    assert np.array_equal(_rgb(out), arr)


def test_greyscale_L_becomes_three_equal_channels():
    arr = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    out = _rgb(decode_image(_bytes(Image.fromarray(arr, "L"), "PNG")))
    for c in range(3):
        assert np.array_equal(out[..., c], arr)


def test_LA_alpha_is_composited_on_white():
    img = Image.new("LA", (2, 1))
    img.putpixel((0, 0), (0, 0))      # black, fully transparent -> white
    img.putpixel((1, 0), (0, 255))    # black, opaque -> black
    out = _rgb(decode_image(_bytes(img, "PNG")))
    assert out[0, 0].tolist() == [255, 255, 255]
    assert out[0, 1].tolist() == [0, 0, 0]


def test_RGBA_half_transparent_red_over_white():
    img = Image.new("RGBA", (3, 3), (255, 0, 0, 128))
    out = _rgb(decode_image(_bytes(img, "PNG")))
    # alpha 128/255 red over white: G = B = 255 * (1 - 128/255) = 127
    assert out[1, 1].tolist() == [255, 127, 127]


def test_palette_P_and_transparent_palette():
    img = Image.new("P", (2, 2))
    img.putpalette([10, 20, 30, 200, 100, 50] + [0] * 762)
    img.putpixel((0, 0), 1)
    out = _rgb(decode_image(_bytes(img, "PNG")))
    assert out[0, 0].tolist() == [200, 100, 50] and out[1, 1].tolist() == [10, 20, 30]
    img.info["transparency"] = 0  # index 0 transparent -> white
    out = _rgb(decode_image(_bytes(img, "PNG", transparency=0)))
    assert out[1, 1].tolist() == [255, 255, 255] and out[0, 0].tolist() == [200, 100, 50]


def test_CMYK_jpeg_to_rgb():
    img = Image.new("CMYK", (8, 8), (0, 255, 255, 0))  # pure red in CMYK
    out = _rgb(decode_image(_bytes(img, "JPEG", quality=100)))
    r, g, b = out[4, 4].tolist()
    assert r > 230 and g < 25 and b < 25


def test_I16_scaled_to_8_bits():
    arr = np.array([[0, 257, 65535]], dtype=np.uint16)
    img = Image.frombytes("I;16", (3, 1), arr.astype("<u2").tobytes())
    assert img.mode == "I;16"
    out = _rgb(decode_image(_bytes(img, "PNG")))
    assert out[0, :, 0].tolist() == [0, 1, 255]


def test_exif_orientation_is_applied():
    # 4 wide x 2 high, left half black, right half white; EXIF 6 = "rotate 90 CW to display"
    arr = np.zeros((2, 4, 3), dtype=np.uint8)
    arr[:, 2:] = 255
    img = Image.fromarray(arr, "RGB")
    exif = Image.Exif()
    exif[0x0112] = 6
    out = decode_image(_bytes(img, "JPEG", quality=100, exif=exif.tobytes()))
    assert out.size == (2, 4)  # rotated: 2 wide x 4 high
    a = _rgb(out)
    # rotating 90 clockwise moves the left (black) half to the top
    assert a[0].mean() < 60 and a[-1].mean() > 200


def test_truncated_jpeg_is_refused_with_reason():
    data = _bytes(Image.new("RGB", (64, 64), (1, 2, 3)), "JPEG")
    for cut in (len(data) // 2, len(data) - 10):  # cut in the header tables / in the scan data
        with pytest.raises(ImageDecodeError, match=r"^image cut: truncated image (data|header) \(") as ei:
            decode_image(data[:cut], "cut")
        assert ei.value.key == "cut" and ei.value.kind == "truncated" and "truncated" in ei.value.reason
        assert "cut" in str(ei.value)


def test_zero_bytes_and_text_bytes_are_refused():
    with pytest.raises(ImageDecodeError, match="^image z: zero-byte image$") as ei:
        decode_image(b"", "z")
    assert ei.value.kind == "empty" and ei.value.key == "z"
    with pytest.raises(ImageDecodeError, match=r"^image t: not an image \(32 bytes in no format Pillow reads\)$") as ei:
        decode_image(b"this is a caption, not an image\n", "t")
    assert ei.value.kind == "not_image" and "not an image" in ei.value.reason


def test_decompression_bomb_refused_before_decoding():
    data = _bytes(Image.new("L", (100, 100)), "PNG")
    assert decode_image(data, "ok", max_pixels=10_000).size == (100, 100)
    with pytest.raises(ImageDecodeError,
                       match=r"^image bomb: decompression bomb refused: 100x100 = 10000 pixels > limit 9999$") as ei:
        decode_image(data, "bomb", max_pixels=9_999)
    assert ei.value.kind == "bomb" and "10000 pixels" in ei.value.reason


def test_skip_counter_counts_and_reports(tmp_path):
    good = _bytes(Image.new("RGB", (4, 4)), "PNG")
    samples = [
        Sample("a", good, "a caption"),
        Sample("b", b"", "a caption"),
        Sample("c", b"not an image", "x"),
        Sample("d", good, "   "),
        Sample("e", b"", "cap", ext=""),
        Sample("f", good[:40], "cap", ext="png"),
    ]
    skipped = SkipCounter()
    decoded = [decode_sample(s, skipped) for s in samples]
    assert [d is not None for d in decoded] == [True, False, False, False, False, False]
    js = skipped.to_json()
    assert js["total"] == 5 and len(skipped) == 5
    # a 40-byte PNG prefix holds no complete header chunk: Pillow does not recognise it at all
    assert js["by_kind"] == {"empty": 1, "not_image": 2, "empty_caption": 1, "missing_image": 1}
    assert [s["key"] for s in js["samples"]] == ["b", "c", "d", "e", "f"]
    skipped.write(tmp_path / "skipped.json")
    again = SkipCounter.from_json(json.loads((tmp_path / "skipped.json").read_text()))
    assert again.to_json() == js
    other = SkipCounter()
    other.add("g", "too dark", "other")
    skipped.merge(other)
    assert skipped.total == 6 and "skipped 6" in skipped.summary()


def test_skip_counter_bounds_examples():
    c = SkipCounter(max_examples=2)
    for i in range(5):
        c.add(str(i), "bad", "corrupt")
    js = c.to_json()
    assert js["total"] == 5 and len(js["samples"]) == 2 and js["samples_omitted"] == 3


def test_load_image_file_names_a_missing_or_special_path(tmp_path):
    import os

    from halsift.corpus.images import load_image_file

    good = tmp_path / "a.png"
    Image.new("RGB", (4, 3), (10, 20, 30)).save(good)
    assert load_image_file(good).size == (4, 3)
    for bad in (tmp_path / "missing.png", tmp_path):
        with pytest.raises(ImageDecodeError, match="is missing or not a regular file") as e:
            load_image_file(bad, "row-1")
        assert e.value.kind == "missing_image" and e.value.key == "row-1"
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)  # reading it would block forever
    with pytest.raises(ImageDecodeError, match="pipe.png is missing or not a regular file"):
        load_image_file(fifo)
    (tmp_path / "text.png").write_text("not an image")
    with pytest.raises(ImageDecodeError, match="not an image") as e:
        load_image_file(tmp_path / "text.png")
    assert e.value.kind == "not_image"


def test_draft_decodes_a_jpeg_at_the_smallest_scale_that_keeps_the_side():
    x = np.linspace(0, 255, 256)
    arr = np.stack([np.add.outer(x[:192], x) / 2, np.tile(x, (192, 1)), np.full((192, 256), 90.0)], -1)
    jpeg = _bytes(Image.fromarray(arr.astype(np.uint8), "RGB"), "JPEG", quality=90)
    assert decode_image(jpeg, "k").size == (256, 192)
    assert decode_image(jpeg, "k", draft=24).size == (32, 24)  # 1/8: both sides still >= 24
    assert decode_image(jpeg, "k", draft=64).size == (128, 96)  # 1/4 would give a 48-pixel side
    assert decode_image(jpeg, "k", draft=500).size == (256, 192)  # never upscales
    small = np.asarray(decode_image(jpeg, "k", draft=64).resize((64, 48), Image.BICUBIC), dtype=float)
    full = np.asarray(decode_image(jpeg, "k").resize((64, 48), Image.BICUBIC), dtype=float)
    assert np.abs(small - full).mean() < 2.0  # the same picture after the model's resize
    png = _bytes(Image.fromarray(arr.astype(np.uint8), "RGB"), "PNG")
    assert decode_image(png, "k", draft=24).size == (256, 192)  # only JPEGs have reduced-scale decoding
    sample = Sample("s", jpeg, "a caption.", ext="jpg")
    assert decode_sample(sample, SkipCounter(), draft=64).size == (128, 96)


def _photo(h: int, w: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    y, x = np.linspace(0, 1, h), np.linspace(0, 1, w)
    grad = np.stack([np.add.outer(y, x) * 110, np.outer(1 - y, x) * 255, np.outer(y, 1 - x) * 255], -1)
    return Image.fromarray(np.clip(grad + rng.normal(0, 10, grad.shape), 0, 255).astype(np.uint8))


def _pillow_only(monkeypatch):
    import halsift.corpus.images as images

    monkeypatch.setattr(images, "_simplejpeg", None)


@pytest.fixture
def turbo_calls(monkeypatch):
    import halsift.corpus.images as images

    if images._simplejpeg is None:
        pytest.skip("simplejpeg is not installed")
    calls = []
    real = images._simplejpeg

    class Spy:
        decode_jpeg_header = staticmethod(real.decode_jpeg_header)

        @staticmethod
        def decode_jpeg(*a, **kw):
            out = real.decode_jpeg(*a, **kw)
            calls.append(out.shape)
            return out

    monkeypatch.setattr(images, "_simplejpeg", Spy)
    return calls


def test_libjpeg_turbo_path_gives_pillows_pixels(turbo_calls, monkeypatch):
    blobs = []
    for i, (h, w) in enumerate([(375, 500), (333, 517), (64, 64), (17, 23), (480, 640)]):
        im = _photo(h, w, i)
        blobs += [_bytes(im, "JPEG", quality=85), _bytes(im, "JPEG", quality=95, subsampling="4:4:4"),
                  _bytes(im, "JPEG", progressive=True), _bytes(im.convert("L"), "JPEG")]
    fast = [np.asarray(decode_image(b, "k", draft=d)) for b in blobs for d in (None, 64, 100)]
    assert len(turbo_calls) == len(fast)  # every one of them took the libjpeg-turbo path
    assert any(s[:2] == (94, 125) for s in turbo_calls)  # 500x375 at 1/4 scale for draft=64
    _pillow_only(monkeypatch)
    slow = [np.asarray(decode_image(b, "k", draft=d)) for b in blobs for d in (None, 64, 100)]
    assert all(a.shape == b.shape and np.array_equal(a, b) for a, b in zip(fast, slow))


def test_rotated_cmyk_and_damaged_jpegs_are_left_to_pillow(turbo_calls, monkeypatch):
    im = _photo(40, 60)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees
    rotated = _bytes(im, "JPEG", exif=exif)
    cmyk = _bytes(im.convert("CMYK"), "JPEG")
    whole = _bytes(im, "JPEG")
    cut = whole[: len(whole) * 2 // 3]
    out = decode_image(rotated, "k")
    assert out.size == (40, 60) and turbo_calls == []
    assert decode_image(cmyk, "k").mode == "RGB" and turbo_calls == []
    upright = Image.Exif()
    upright[0x0112] = 1
    decode_image(_bytes(im, "JPEG", exif=upright), "k")
    assert len(turbo_calls) == 1  # orientation 1: nothing to transpose
    with pytest.raises(ImageDecodeError, match=r"^image k: truncated image data \(") as fast_err:
        decode_image(cut, "k")
    _pillow_only(monkeypatch)
    with pytest.raises(ImageDecodeError, match=r"^image k: truncated image data \(") as slow_err:
        decode_image(cut, "k")
    assert (fast_err.value.kind, fast_err.value.reason) == (slow_err.value.kind, slow_err.value.reason)
    assert np.array_equal(np.asarray(decode_image(rotated, "k")), np.asarray(out))


@pytest.fixture
def pillow_opens(monkeypatch):
    """The sizes of the images Pillow's ``Image.open`` parsed inside ``decode_image``."""
    import halsift.corpus.images as images

    opened, real = [], images.Image.open

    def spy(*a, **kw):
        im = real(*a, **kw)
        opened.append(im.size)
        return im

    monkeypatch.setattr(images.Image, "open", spy)
    return opened


def _with_segment(jpeg: bytes, marker: int, payload: bytes) -> bytes:
    """``jpeg`` with one more marker segment right after its start-of-image marker."""
    return jpeg[:2] + bytes([0xFF, marker]) + (len(payload) + 2).to_bytes(2, "big") + payload + jpeg[2:]


def test_plain_jpegs_skip_pillows_header_parse_and_decode_the_same(turbo_calls, pillow_opens, monkeypatch):
    im = _photo(48, 72, 3)
    plain = [_bytes(im, "JPEG"), _bytes(im.convert("L"), "JPEG"), _bytes(im, "JPEG", progressive=True),
             _bytes(im, "JPEG", keep_rgb=True), _with_segment(_bytes(im, "JPEG"), 0xFE, b"a comment"),
             _bytes(im, "JPEG")[:2] + b"\xff" + _bytes(im, "JPEG")[2:]]  # a fill byte before the first marker
    fast = [np.asarray(decode_image(b, "k", draft=d)) for b in plain for d in (None, 24)]
    assert pillow_opens == [] and len(turbo_calls) == len(fast)
    _pillow_only(monkeypatch)
    slow = [np.asarray(decode_image(b, "k", draft=d)) for b in plain for d in (None, 24)]
    assert len(pillow_opens) == len(slow)
    assert all(np.array_equal(a, b) for a, b in zip(fast, slow))


@pytest.mark.filterwarnings("ignore:Image appears to be a malformed MPO file")
def test_jpegs_that_need_pillows_judgement_are_opened_by_it(turbo_calls, pillow_opens, monkeypatch):
    im = _photo(40, 60)
    upright, rotated = Image.Exif(), Image.Exif()
    upright[0x0112], rotated[0x0112] = 1, 6
    whole = _bytes(im, "JPEG")
    cases = {
        "exif upright": _bytes(im, "JPEG", exif=upright),
        "exif rotated": _bytes(im, "JPEG", exif=rotated),
        "xmp rotated": _with_segment(whole, 0xE1, b"http://ns.adobe.com/xap/1.0/\x00<x:xmpmeta><rdf:Description "
                                                  b'tiff:Orientation="6"/></x:xmpmeta>'),
        "mpo index": _with_segment(whole, 0xE2, b"MPF\x00" + bytes(8)),
        "cmyk": _bytes(im.convert("CMYK"), "JPEG"),
        "a stray byte between segments": whole[:2] + b"\x00" + whole[2:],
        "damaged": whole[: len(whole) * 2 // 3],
        "over the pixel limit": whole,
    }

    def outcome(blob, limit):
        before = len(pillow_opens)
        try:
            out = np.asarray(decode_image(blob, "k", max_pixels=limit))
        except ImageDecodeError as e:
            out = (e.kind, e.reason)
        return out, len(pillow_opens) > before

    limits = {name: 40 * 60 - 1 if name == "over the pixel limit" else 10**8 for name in cases}
    fast = {name: outcome(blob, limits[name]) for name, blob in cases.items()}
    # Pillow opened each (the stray byte: its open failed, so the spy saw nothing), the damaged file after libjpeg
    assert [name for name, (_, opened) in fast.items() if not opened] == ["a stray byte between segments"]
    assert fast["over the pixel limit"][0][0] == "bomb" and fast["damaged"][0][0] in ("truncated", "corrupt")
    assert fast["xmp rotated"][0].shape == fast["exif rotated"][0].shape == (60, 40, 3)  # both turned upright
    assert fast["a stray byte between segments"][0][0] in ("not_image", "corrupt")
    _pillow_only(monkeypatch)
    slow = {name: outcome(blob, limits[name]) for name, blob in cases.items()}
    for name in cases:
        a, b = fast[name][0], slow[name][0]
        assert (np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b), name


def test_decode_pixels_is_decode_images_pixels_with_the_same_errors():
    im = _photo(48, 72, 5)
    rotated = Image.Exif()
    rotated[0x0112] = 6
    rgba = Image.fromarray(np.random.default_rng(1).integers(0, 256, (9, 11, 4), dtype=np.uint8), "RGBA")
    blobs = [_bytes(im, "JPEG"), _bytes(im.convert("L"), "JPEG"), _bytes(im, "JPEG", exif=rotated),
             _bytes(rgba, "PNG"), _bytes(im, "WEBP")]
    for blob in blobs:
        for draft in (None, 24):
            got = decode_pixels(blob, "k", draft=draft)
            assert got.dtype == np.uint8 and got.ndim == 3 and got.shape[2] == 3
            assert np.array_equal(got, np.asarray(decode_image(blob, "k", draft=draft)))
    whole = _bytes(im, "JPEG")
    for bad, reason in ((b"", "zero-byte image$"), (b"not an image", r"not an image \(12 bytes"),
                        (whole[: len(whole) // 2], "truncated image header")):
        errors = []
        for fn in (decode_image, decode_pixels):
            with pytest.raises(ImageDecodeError, match=f"^image k: {reason}") as e:
                fn(bad, "k")
            errors.append((e.value.kind, e.value.reason))
        assert errors[0] == errors[1]
    sample = Sample("s", whole, "A caption.", ext="jpg")
    assert isinstance(decode_sample(sample, SkipCounter(), arrays=True), np.ndarray)
    assert isinstance(decode_sample(sample, SkipCounter()), Image.Image)
