"""The fast open_clip tokenizer gives open_clip's ids on every kind of text, and wraps only what it can."""

import pickle
import random

import open_clip
import pytest
import torch

from halsift.filtering.detectors.clip import ClipDetector
from halsift.filtering.models.clip_tokenizer import FastClipTokenizer, fast_tokenizer, get_tokenizer
from halsift.synth.captioners import PROFILES, caption
from halsift.synth.scene import sample_scene


@pytest.fixture(scope="module")
def pair():
    slow = open_clip.get_tokenizer("ViT-B-32")
    return slow, fast_tokenizer(open_clip.get_tokenizer("ViT-B-32"))


TRICKY = [
    "", "   ", "x", "A photo of a dog.", "Hello  World\t!", "a\nb\r\nc", "\x07bell", "It's 3.14159, they'll go",
    "café ’s naïve ﬁsh &amp; chips", "&lt;b&gt;bold&lt;/b&gt;", "AT&T", "Ã©tÃ© mojibake", "日本語のテキスト 123",
    "emoji 😀 ok", "İstanbul ΣΑΣ", "ｆｕｌｌｗｉｄｔｈ", "<start_of_text> x <end_of_text>", "<START_OF_TEXT>",
    "a < b > c", "x" * 500, " ".join(["word"] * 100), "don'T STOP", "e.g. 1,000,000 km/h",
]


def test_same_ids_as_open_clip_on_world_captions_and_tricky_text(pair):
    slow, fast = pair
    assert isinstance(fast, FastClipTokenizer)
    assert fast._ascii_split is not None  # plain text is split by the re pattern, not the regex module's
    rng = random.Random(0)
    texts = [s["text"] for i in range(150)
             for s in caption(sample_scene(rng), PROFILES[i % len(PROFILES)], rng)]
    chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:'\"!?-()[]{}/\\@#$%^*_+=~`|éüñ’“”—…&<>\t"
    texts += ["".join(rng.choice(chars) for _ in range(rng.randint(0, 120))) for _ in range(1500)]
    texts += TRICKY
    assert len(texts) > 2000
    got, want = fast(texts), slow(texts)
    assert got.dtype == want.dtype == torch.long
    bad = [t for t, a, b in zip(texts, got, want) if not torch.equal(a, b)]
    assert bad == []
    for t in TRICKY:
        assert fast.encode(t) == slow.encode(t)
    # twice: ids served from the word cache are the same
    assert torch.equal(fast(texts[:300]), want[:300])


def test_context_length_truncation_and_single_string(pair):
    slow, fast = pair
    long = " ".join(f"word{i}" for i in range(200))
    for n in (5, 16, 77):
        got = fast([long, "short one"], context_length=n)
        assert torch.equal(got, slow([long, "short one"], context_length=n))
        assert got.shape == (2, n) and int(got[0, -1]) == slow.eot_token_id
    assert torch.equal(fast("A red car."), slow("A red car."))
    with pytest.raises(ValueError, match="context_length"):
        FastClipTokenizer(type("T", (), {"context_length": 0, "sot_token_id": 1, "eot_token_id": 2})())(["a"])


def test_other_tokenizers_are_left_alone():
    canon = open_clip.tokenizer.SimpleTokenizer(clean="canonicalize")
    assert fast_tokenizer(canon) is canon
    masked = open_clip.tokenizer.SimpleTokenizer(reduction_mask="random")
    assert fast_tokenizer(masked) is masked
    other = object()
    assert fast_tokenizer(other) is other


def test_delegates_attributes_and_pickles(pair):
    slow, fast = pair
    assert fast.sot_token_id == slow.sot_token_id and fast.vocab_size == slow.vocab_size
    assert fast.decode(fast.encode("a red car")).strip() == "a red car"
    again = pickle.loads(pickle.dumps(fast))
    assert torch.equal(again(["two cats"]), slow(["two cats"]))


def test_clip_detector_and_get_tokenizer_use_it():
    det = ClipDetector(arch="halsift-tiny", pretrained="random")
    assert isinstance(det.tokenizer, FastClipTokenizer)
    assert isinstance(get_tokenizer("ViT-B-32"), FastClipTokenizer)
