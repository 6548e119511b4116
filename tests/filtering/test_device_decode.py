"""decode=gpu's tensor path (JPEG bytes decoded in batches by torchvision on the model's device), checked on the CPU
with torchvision's CPU decoder: the same code that runs nvJPEG on CUDA, against today's host path (simplejpeg).

Tolerance (stated in docs/performance.md): libjpeg's and torch's bicubic resize round differently from Pillow's, so
pixels differ by at most 3/255 and scores (0-100) by at most 0.05; on these photo-like JPEGs the means stay far
below that."""

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T

from halsift.corpus.images import EncodedJpeg, ImageDecodeError, decode_pixels, jpeg_or_pixels
from halsift.corpus.sample import caption_items
from halsift.filtering.detectors import pixel_batch
from halsift.filtering.detectors.clip import ClipDetector
from halsift.filtering.detectors.pixel_batch import PixelBatcher, device_decoding

SPEC = dict(arch="halsift-tiny", pretrained="random", seed=3)


def _photo(w, h, seed=0, grey=False):
    rng = np.random.default_rng(seed)
    x, y = np.linspace(0, 1, w), np.linspace(0, 1, h)
    g = np.stack([np.add.outer(y, x) * 110, np.outer(1 - y, x) * 255, np.outer(y, 1 - x) * 255], -1)
    arr = np.clip(g + rng.normal(0, 6, g.shape), 0, 255).astype(np.uint8)
    im = Image.fromarray(arr).convert("L") if grey else Image.fromarray(arr)
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=85)
    return buf.getvalue()


def _png(w=70, h=50):
    buf = io.BytesIO()
    Image.fromarray(np.full((h, w, 3), 90, np.uint8)).save(buf, "PNG")
    return buf.getvalue()


BLOBS = [_photo(512, 512, 0), _photo(640, 480, 1), _photo(300, 500, 2), _photo(64, 64, 3), _photo(200, 90, 4, True),
         _png()]


def _items(blobs, reader):
    """Two sentences per image; the items of one caption share one image object, as a shard reader's do."""
    return [it for i, b in enumerate(blobs)
            for it in caption_items(f"k{i}", "A red car. Two cats.", ["A red car.", "Two cats sit."], reader(b))]


@pytest.fixture(scope="module")
def cpu():
    return ClipDetector(**SPEC, decode="cpu")


@pytest.fixture(scope="module")
def gpu():
    return ClipDetector(**SPEC, decode="gpu")  # on a CPU model: torchvision's CPU decoder, the same tensor path


def test_the_tensor_path_equals_the_host_path_within_tolerance(cpu, gpu):
    host, dev = _items(BLOBS, decode_pixels), _items(BLOBS, jpeg_or_pixels)
    assert [type(it.image) for it in dev[::2]] == [EncodedJpeg] * 5 + [np.ndarray]
    want = cpu.pixels.finish(cpu.prepare(host)["pixels"])
    got = gpu.pixels.finish(gpu.prepare(dev)["pixels"])
    assert got.shape == want.shape == (6, 3, 64, 64) and got.dtype == torch.float32
    std = torch.tensor(cpu.preprocess.transforms[-1].std).view(1, 3, 1, 1)
    levels = ((got - want) * std * 255).abs()  # in 8-bit levels
    assert levels.max() <= 3 and levels.mean() < 0.5
    assert torch.equal(got[5], want[5])  # the PNG took the host path: bit-equal
    # each image decoded once (the caption's two sentences share it); the PNG counted on the host
    assert gpu.take_decode_counts() == {"device": 5, "host": 1}
    assert gpu.take_decode_counts() == {}
    s_host = np.array([r.score for r in cpu.score_batch(host)])
    s_dev = np.array([r.score for r in gpu.score_prepared(dev, gpu.prepare(dev))])
    assert np.abs(s_host - s_dev).max() <= 0.05
    gpu.take_decode_counts()


def test_non_plain_jpegs_take_the_host_path_and_the_bomb_check_runs_first():
    img = Image.fromarray(np.zeros((40, 60, 3), np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: Pillow applies the orientation, so the host decodes it
    buf = io.BytesIO()
    img.save(buf, "JPEG", exif=exif)
    rotated = jpeg_or_pixels(buf.getvalue())
    assert isinstance(rotated, np.ndarray) and rotated.shape == (60, 40, 3)
    cut = _photo(128, 128)[:-400]  # no end-of-image marker: the host judges it (and reports it)
    with pytest.raises(ImageDecodeError):
        decode_pixels(cut, "k")
    with pytest.raises(ImageDecodeError):
        jpeg_or_pixels(cut, "k")
    assert isinstance(jpeg_or_pixels(_png()), np.ndarray)
    with pytest.raises(ImageDecodeError) as e:  # 512 x 512 over a 1000-pixel limit: refused from the header
        jpeg_or_pixels(BLOBS[0], "big", max_pixels=1000)
    assert e.value.kind == "bomb"
    with pytest.raises(ImageDecodeError) as e:
        jpeg_or_pixels(b"", "empty")
    assert e.value.kind == "empty"


def test_refused_jpegs_fall_back_to_the_host_or_score_unparsed(cpu, gpu, monkeypatch):
    real = pixel_batch._decode_jpegs

    def refuse_first(blobs, device):  # the device decoder refuses the first image
        out = real(blobs, device)
        return [None] + out[1:]

    monkeypatch.setattr(pixel_batch, "_decode_jpegs", refuse_first)
    host, dev = _items(BLOBS[:3], decode_pixels), _items(BLOBS[:3], jpeg_or_pixels)
    got = gpu.pixels.finish(gpu.prepare(dev)["pixels"])
    want = cpu.pixels.finish(cpu.prepare(host)["pixels"])
    assert torch.equal(got[0], want[0])  # decoded on the host as the CPU path does
    assert gpu.take_decode_counts() == {"device": 2, "fallback": 1}
    monkeypatch.setattr(pixel_batch, "_decode_jpegs", real)
    junk = EncodedJpeg(BLOBS[0][:600] + b"\x00" * 4000 + b"\xff\xd9", (512, 512))  # a header, then no image
    items = _items(BLOBS[1:2], jpeg_or_pixels) + caption_items("bad", "A dog.", ["A dog.", "Grass."], junk)
    res = gpu.score_prepared(items, gpu.prepare(items))
    assert [r.parsed for r in res] == [True, True, False, False]
    assert [r.score for r in res[2:]] == [50.0, 50.0]
    counts = gpu.take_decode_counts()
    assert counts["device"] + counts.get("fallback", 0) == 1 and counts["unreadable"] == 1


def test_the_decode_option(cpu, gpu):
    assert "decode=gpu" in gpu.encoder_id and ",decode=" not in cpu.encoder_id
    assert cpu.image_arrays is True and gpu.image_arrays == "jpeg"
    auto = ClipDetector(**SPEC)  # auto on a CPU: the host decodes, ids and fingerprints as before
    assert auto.image_arrays is True and auto.encoder_id == cpu.encoder_id
    assert auto.fingerprint_spec() == auto.spec
    with pytest.raises(ValueError, match="decode='fast'"):
        ClipDetector(**SPEC, decode="fast")
    jitter = PixelBatcher(T.Compose([T.Resize(8), T.ColorJitter(0.1), T.ToTensor(), T.Normalize((0.5,) * 3, (0.2,) * 3)]))
    with pytest.raises(ValueError, match="decode=gpu needs"):
        device_decoding("gpu", "cpu", jitter, "clip detector")
    assert device_decoding("auto", "cuda", jitter, "clip detector") is False  # auto keeps the host path
    assert device_decoding("auto", "cuda", gpu.pixels, "clip detector") is True
    assert "decode" in ClipDetector.OPTION_HELP


def _shards(folder, blobs):
    from halsift.corpus.shards import Sample, ShardWriter

    with ShardWriter(folder, maxcount=3) as w:
        for i, b in enumerate(blobs):
            ext = "png" if b[:4] == b"\x89PNG" else "jpg"
            sents = [{"text": t, "position": j} for j, t in enumerate(["A red car.", "Two cats sit.", "A tree."])]
            w.write(Sample(f"s{i:03d}", b, " ".join(s["text"] for s in sents), ext=ext,
                           meta={"captioner": "t", "source": "i2t", "sentences": sents}))
    return folder


def test_a_score_run_with_decode_workers_ships_jpeg_bytes(tmp_path):
    import pyarrow.parquet as pq

    from halsift.filtering.scoring.runner import score

    data = _shards(tmp_path / "data", BLOBS + [_photo(128, 128)[:-400]])  # a cut JPEG: skipped by both paths
    spec = "clip:arch=halsift-tiny,pretrained=random,seed=3"
    score(spec + ",decode=cpu", str(data), str(tmp_path / "cpu"), batch_size=8, show_progress=False, workers=1)
    score(spec + ",decode=gpu", str(data), str(tmp_path / "gpu"), batch_size=8, show_progress=False, workers=1)
    a, b = (pq.read_table(tmp_path / d).to_pandas().sort_values(["key", "sentence_index"]) for d in ("cpu", "gpu"))
    assert list(a.key) == list(b.key) and len(a) == 18
    assert np.abs(a.score.to_numpy() - b.score.to_numpy()).max() <= 0.05
    m = json.loads((tmp_path / "gpu" / "_manifest.json").read_text())
    assert m["image_decode"] == {"device": 5, "host": 1} and m["skipped"]["total"] == 1
    assert "image_decode" not in json.loads((tmp_path / "cpu" / "_manifest.json").read_text())


def test_dedup_encoder_batches_and_decodes_on_the_device(tmp_path):
    from halsift.filtering.curation.encode import ImageEncoder

    host = ImageEncoder("clip:arch=halsift-tiny,pretrained=random,seed=3,decode=cpu")
    dev = ImageEncoder("clip:arch=halsift-tiny,pretrained=random,seed=3,decode=gpu")
    assert dev.image_arrays == "jpeg"
    want = host([decode_pixels(b) for b in BLOBS])
    got = dev([jpeg_or_pixels(b) for b in BLOBS])
    with torch.inference_mode():  # the per-image preprocessing dedup used before, by hand
        pix = torch.stack([host.det.preprocess(Image.open(io.BytesIO(b)).convert("RGB")) for b in BLOBS])
        ref = torch.nn.functional.normalize(host.det.model.encode_image(pix), dim=-1).numpy()
    assert np.abs(want - ref).max() < 1e-5
    assert np.abs(got - want).max() < 0.02


def test_embed_leaves_out_an_image_no_decoder_reads(tmp_path):
    from halsift.filtering.scoring.embed import embed_part, load_encoder
    from halsift.filtering.scoring.parts import Part

    head = BLOBS[0][:BLOBS[0].index(b"\xff\xda") + 20]  # a whole header: the reader passes it on undecoded
    junk = head + b"\xff\xd8" * 10 + b"\xff\xd9"  # then start-of-image markers where the scan should be
    assert isinstance(jpeg_or_pixels(junk), EncodedJpeg)
    data = _shards(tmp_path / "data", [BLOBS[1], junk, BLOBS[2]])
    enc = load_encoder("clip:arch=halsift-tiny,pretrained=random,seed=3,decode=gpu")
    stats = embed_part(enc, Part("p.parquet", str(next(data.glob("*.tar")))), tmp_path / "p.parquet", 64, {})
    assert stats["images"] == 2 and stats["texts"] == 2 * 4  # 3 sentences + the caption, for the two readable ones
    assert stats["skipped"]["total"] == 1 and stats["skipped"]["samples"][0]["key"] == "s001"
