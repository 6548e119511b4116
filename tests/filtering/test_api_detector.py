"""The ``api`` detector against a loopback OpenAI-compatible chat-completions server started by the test."""

from __future__ import annotations

import base64
import io
import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PIL import Image

from halsift.filtering.detectors.api import ApiDetector, score_from_logprobs
from halsift.filtering.detectors.base import DetectorError, Item
from halsift.filtering.detectors.spec import SpecError, load_detector
from halsift.filtering.detectors.vlm_prompts import SCORE_PROMPT


def _lp(p: float) -> float:
    return math.log(p)


def _reply(text: str, logprobs: list | None) -> dict:
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    if logprobs is not None:
        choice["logprobs"] = {"content": logprobs}
    return {"id": "x", "object": "chat.completion", "choices": [choice]}


def _single_token_reply(sentence: str) -> dict:
    """'{"score": N}' with top alternatives whose expected value depends on the sentence (80/60 or 20/40)."""
    hi = "dog" in sentence
    a, b = ("80", "60") if hi else ("20", "40")
    toks = [{"token": '{"', "logprob": -0.01}, {"token": "score", "logprob": -0.01}, {"token": '":', "logprob": 0},
            {"token": " ", "logprob": 0},
            {"token": a, "logprob": _lp(0.5), "top_logprobs": [{"token": a, "logprob": _lp(0.5)},
                                                             {"token": b, "logprob": _lp(0.25)},
                                                             {"token": " because", "logprob": _lp(0.25)}]},
            {"token": "}", "logprob": 0}]
    return _reply('{"score": ' + a + "}", toks)


class _Server:
    """Chat-completions on 127.0.0.1: the first ``fail_first`` requests get ``fail_status``; then ``answer``."""

    def __init__(self, answer, fail_first: int = 0, fail_status: int = 429, delay: float = 0.0,
                 keepalive: bool = False):
        self.requests: list[dict] = []
        self.active = self.max_active = 0
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if keepalive else "HTTP/1.0"

            def log_message(self, *a):  # keep pytest output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    outer.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization"),
                                           "port": self.client_address[1]})
                    n = len(outer.requests)
                    outer.active += 1
                    outer.max_active = max(outer.max_active, outer.active)
                time.sleep(delay)
                if n <= fail_first:
                    status, payload = fail_status, {"error": {"message": "slow down"}}
                else:
                    text = body["messages"][0]["content"][1]["text"]
                    status, payload = 200, answer(text.rsplit("Caption:", 1)[1].lstrip(" "), body)
                data = json.dumps(payload).encode()
                with lock:  # before answering: once the client has the reply it may send the next request at once
                    outer.active -= 1
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if status == 429:
                    self.send_header("Retry-After", "0")
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers = []

    def start(*a, **kw):
        servers.append(_Server(*a, **kw))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def _items():
    img = Image.new("RGB", (16, 12), (255, 0, 0))
    return [Item("k0", 0, "a dog runs.", [], img, "i0"), Item("k0", 1, "a cat sits.", ["a dog runs."], img, "i0"),
            Item("k1", 0, "two dogs.", [], Image.new("RGB", (8, 8), (0, 0, 255)), "i1")]


def test_logprobs_score_with_retry_after_429(serve, monkeypatch):
    monkeypatch.setenv("HALSIFT_TEST_KEY", "sk-test")
    srv = serve(lambda sent, body: _single_token_reply(sent), fail_first=1, fail_status=429)
    det = ApiDetector(srv.url, "judge", api_key_env="HALSIFT_TEST_KEY", backoff=0.01, concurrency=1)
    res = det.score_batch(_items())
    assert det.retries == 1 and len(srv.requests) == 4
    hi, lo = (80 * 0.5 + 60 * 0.25) / 0.75, (20 * 0.5 + 40 * 0.25) / 0.75
    assert [r.score for r in res] == pytest.approx([hi, lo, hi])
    assert all(r.parsed for r in res)
    req = srv.requests[-1]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sk-test"
    body = req["body"]
    assert body["logprobs"] is True and body["top_logprobs"] == 20 and body["model"] == "judge"
    url = body["messages"][0]["content"][0]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    img = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert img.size == (8, 8) and img.getpixel((0, 0)) == (0, 0, 255)
    assert body["messages"][0]["content"][1]["text"] == SCORE_PROMPT + "\n\nCaption: two dogs."


def test_prompt_fallback_without_logprobs_and_5xx_retry(serve):
    texts = {"a dog runs.": "Score: 85/100", "a cat sits.": "I cannot tell.", "two dogs.": '"score": 30'}
    srv = serve(lambda sent, body: _reply(texts[sent], None), fail_first=2, fail_status=503)
    det = ApiDetector(srv.url, "judge", backoff=0.01, concurrency=1)  # logprobs asked for, server has none
    res = det.score_batch(_items())
    assert det.retries == 2
    assert [(r.score, r.parsed) for r in res] == [(85.0, True), (50.0, False), (30.0, True)]


def test_context_and_prompt_mode(serve):
    srv = serve(lambda sent, body: _reply('{"score": 70}', None))
    det = load_detector(f"api:base_url={srv.url},model=judge,mode=prompt,context=true")
    assert [r.score for r in det.score_batch(_items()[:2])] == [70.0, 70.0]
    sent_texts = sorted(r["body"]["messages"][0]["content"][1]["text"].rsplit("Caption: ", 1)[1] for r in srv.requests)
    assert sent_texts[0] == "a dog runs." and sent_texts[1].startswith("a dog runs. a cat sits. Think about")
    assert "logprobs" not in srv.requests[0]["body"]


def test_concurrency_limit(serve):
    srv = serve(lambda sent, body: _reply('{"score": 10}', None), delay=0.15)
    img = Image.new("RGB", (4, 4))
    items = [Item(f"k{i}", 0, "a dog.", [], img, f"i{i}") for i in range(8)]
    det = ApiDetector(srv.url, "judge", concurrency=3)
    t = time.perf_counter()
    assert [r.score for r in det.score_batch(items)] == [10.0] * 8
    assert srv.max_active == 3  # parallel, but never more than the limit
    assert time.perf_counter() - t < 8 * 0.15


def test_connections_are_reused_across_batches(serve):
    """One client for the detector's life: with keep-alive, two batches of requests at concurrency 1 travel over
    one connection (a new client per batch opened a new connection for each batch)."""
    srv = serve(lambda sent, body: _reply('{"score": 10}', None), keepalive=True)
    det = ApiDetector(srv.url, "judge", mode="prompt", concurrency=1)
    det.score_batch(_items())
    det.score_batch(_items())
    assert len(srv.requests) == 6 and len({r["port"] for r in srv.requests}) == 1
    det.close()


def test_client_error_is_not_retried(serve):
    srv = serve(lambda sent, body: _reply("", None), fail_first=10, fail_status=400)
    det = ApiDetector(srv.url, "judge", backoff=0.01)
    with pytest.raises(DetectorError, match="HTTP 400.*slow down"):
        det.score_batch(_items()[:1])
    assert len(srv.requests) == 1 and det.retries == 0


def test_retries_exhausted(serve):
    srv = serve(lambda sent, body: _reply("", None), fail_first=10, fail_status=500)
    det = ApiDetector(srv.url, "judge", backoff=0.001, max_retries=2)
    with pytest.raises(DetectorError, match="HTTP 500 after 3 attempt"):
        det.score_batch(_items()[:1])
    assert len(srv.requests) == 3


def test_score_from_logprobs_digit_tokenizer():
    # Qwen-style digits: the reply wrote "85"; the alternatives for the first digit are 8 (p .6), 9 (p .3), 1 (p .1)
    content = [{"token": '{"score": ', "logprob": 0},
               {"token": "8", "logprob": _lp(0.6), "top_logprobs": [{"token": "8", "logprob": _lp(0.6)},
                                                                   {"token": "9", "logprob": _lp(0.3)},
                                                                   {"token": "1", "logprob": _lp(0.1)}]},
               {"token": "5", "logprob": 0}, {"token": "}", "logprob": 0}]
    assert score_from_logprobs(content) == pytest.approx(0.6 * 85 + 0.3 * 94.5 + 0.1 * 14.5)
    assert score_from_logprobs([{"token": "no", "logprob": 0}]) is None


def test_bad_options():
    with pytest.raises(ValueError, match="base_url"):
        ApiDetector("localhost:8000", "m")
    with pytest.raises(ValueError, match="mode"):
        ApiDetector("http://x/v1", "m", mode="logits")


def test_loopback_server_backed_by_tiny_vlm(serve, tmp_path):
    """A chat-completions server answering with a tiny random LLaVA's next-token distribution after the prefill."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from halsift.synth.tiny_vlm import build_tiny_vlm
    from halsift.filtering.detectors.vlm import VlmDetector

    judge = VlmDetector(str(build_tiny_vlm("llava", tmp_path / "llava", init_std=0.5)), dtype="float32", device="cpu")
    tok = judge.tokenizer

    def top20(image, sentence):
        item = Item("k", 0, sentence, [], image, "i")
        with torch.no_grad():  # one item, image slot 0: its prefix encoded once, the continuation after it
            logits = judge._logits_reuse([0], [judge.continuation_ids(item)], [judge.prefix_inputs(image)], 1)
        lp = logits[0, -1].float().log_softmax(-1)
        vals, ids = lp.topk(20)
        return [(tok.decode([i]), float(v)) for i, v in zip(ids.tolist(), vals.tolist())]

    def answer(sentence, body):
        url = body["messages"][0]["content"][0]["image_url"]["url"]
        image = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")
        alts = top20(image, sentence)
        first = next(a for a in alts if a[0].strip().isdigit())  # the server "writes" its likeliest number
        toks = [{"token": '{"score": ', "logprob": 0.0},
                {"token": first[0], "logprob": first[1],
                 "top_logprobs": [{"token": t, "logprob": v} for t, v in alts]}]
        return _reply('{"score": ' + first[0] + "}", toks)

    srv = serve(answer, fail_first=1)
    items = _items()
    res = ApiDetector(srv.url, "tiny-llava", backoff=0.01, concurrency=2).score_batch(items)
    for it, r in zip(items, res):  # expected value over the top-20 alternatives that spell a number 0..100
        nums = [(int(t.strip()), math.exp(v)) for t, v in top20(it.image, it.sentence)
                if t.strip().isdigit() and int(t.strip()) <= 100 and t.strip() == str(int(t.strip()))]
        assert nums, "the tiny judge should put some top-20 mass on numbers"
        expected = sum(n * p for n, p in nums) / sum(p for _, p in nums)
        assert r.parsed and r.score == pytest.approx(expected, abs=1e-6)
    assert len({round(r.score, 3) for r in res}) > 1


def test_per_caption_sends_one_request_per_caption_and_falls_back_per_sentence(serve):
    """``per_caption=true``: the sentences of a caption (context chains, also a caption split across batches) go
    in one request and its JSON list scores them; a reply without a usable list is rescored per sentence."""
    def answer(text, body):
        if "numbered sentences" not in body["messages"][0]["content"][1]["text"]:
            return _reply('{"score": 33}', None)  # the per-sentence fallback
        lines = body["messages"][0]["content"][1]["text"].split("Caption:\n", 1)[1].splitlines()
        if any("broken" in ln for ln in lines):
            return _reply("I cannot tell.", None)
        return _reply("Scores: " + json.dumps([10 * (i + 1) for i in range(len(lines))]), None)

    srv = serve(answer)
    det = load_detector(f"api:base_url={srv.url},model=judge,mode=prompt,per_caption=true")
    img = Image.new("RGB", (8, 8), (255, 0, 0))
    other = Image.new("RGB", (8, 8), (0, 0, 255))
    items = [Item("k0", 0, "a dog runs.", [], img, "i0"), Item("k0", 1, "a cat sits.", ["a dog runs."], img, "i0"),
             Item("k0", 2, "two birds.", ["a dog runs.", "a cat sits."], img, "i0"),
             Item("k1", 0, "a red car.", [], other, "i1"), Item("k1", 1, "a tree.", ["a red car."], other, "i1")]
    assert [r.score for r in det.score_batch(items)] == [10, 20, 30, 10, 20]
    assert len(srv.requests) == 2 and det.caption_fallbacks == 0
    tail = det.score_batch(items[2:3])  # the rest of a caption in a later batch: its context is sent along
    assert tail[0].score == 30 and "1. a dog runs.\n2. a cat sits.\n3. two birds." in \
        srv.requests[-1]["body"]["messages"][0]["content"][1]["text"]
    broken = [Item("k2", 0, "broken.", [], img, "i2"), Item("k2", 1, "fine.", ["broken."], img, "i2")]
    assert [r.score for r in det.score_batch(broken)] == [33, 33] and det.caption_fallbacks == 1
    with pytest.raises(SpecError, match="per_caption=true needs mode=prompt"):
        load_detector(f"api:base_url={srv.url},model=judge,per_caption=true")
