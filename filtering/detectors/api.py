"""``api`` detector: a judge behind an OpenAI-compatible chat-completions endpoint (a vLLM server, a hosted model).

Each item is one request: the image as a base64 PNG data URL (each distinct image encoded once per batch), then
the seeds' 0–100 prompt (AlignBench E.1, ``cot``/``context`` as in the ``vlm`` family). ``per_caption=true``
(with ``mode=prompt``) sends one request per caption instead, asking for every numbered sentence's score as one
JSON list (:data:`~halsift.filtering.detectors.vlm_prompts.PER_CAPTION_PROMPT`): n sentences cost one request, not n; a
reply without a usable list is rescored one request per sentence (``caption_fallbacks``). One connection pool
serves the detector's life (keep-alive). Requests run in a thread pool of ``concurrency`` workers; HTTP 429,
5xx, timeouts and connection errors are retried ``max_retries`` times with exponential backoff
(``backoff · 2^attempt`` seconds, or the server's ``Retry-After`` if larger, capped at 60 s); other 4xx errors
raise :class:`~halsift.filtering.detectors.base.DetectorError` at once with the server's message.

Modes:

* ``logprobs`` (default): asks for ``logprobs`` + ``top_logprobs`` (greedy, temperature 0). In the reply's
  token list the first token that starts with a digit after ``score`` (or at the start) is the number's first token; its
  ``top_logprobs`` alternatives give the score as an expected value. Alternatives count if they spell a
  number: when the reply's number is a single token (Llama-3-style vocabularies), an alternative spelling
  ``0``..``100`` counts as that number; when the server's tokenizer splits numbers into digits, the greedy
  first digit counts as the number actually written and another digit ``d`` as ``10d + 4.5`` (``0`` as 0).
  Probabilities are renormalised over the counted alternatives. A reply without logprobs (the server does
  not offer them) or without a number token falls back to the prompt protocol.
* ``prompt``: the seeds' protocol: parse the reply with
  :func:`~halsift.filtering.detectors.vlm_prompts.parse_score`; unparseable -> 50 with ``parsed=False``.

Requests go through ``httpx`` with redirects refused: a 3xx reply is an error naming its ``Location`` (set
``base_url`` to the final address), so the ``Authorization`` header never follows a redirect to another host.
The API key is read from the environment variable named by ``api_key_env`` (default ``OPENAI_API_KEY``; none is
sent if it is unset, e.g. for a local vLLM server). A file that a detector loads (a YAML spec file, an adapter's
``detector.yaml``) may not name another variable (a shared file could otherwise send any secret of the environment
to its ``base_url``): give ``api_key_env`` in your own spec (:mod:`~halsift.filtering.detectors.trust`).
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import re
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import httpx

from halsift.filtering.detectors import vlm_prompts as P
from halsift.filtering.detectors.base import Detector, DetectorError, Item, Result, distinct_images

_RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


def image_data_url(image) -> str:
    """A PIL image as a ``data:image/png;base64,...`` URL."""
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _canon_int(s: str) -> int | None:
    s = s.strip()
    if s.isascii() and s.isdigit() and s == str(int(s)) and int(s) <= 100:
        return int(s)
    return None


def score_from_logprobs(content: list[dict]) -> float | None:
    """Expected score from a chat-completions ``logprobs.content`` list, or ``None`` if no number token is found."""
    text_so_far = ""
    for i, tok in enumerate(content):
        t = tok.get("token", "")
        if t.strip()[:1].isdigit() and ("score" in text_so_far.lower() or text_so_far.strip() in ("", "{")):
            digits = ""  # the number as written greedily, possibly over several tokens
            for nxt in content[i:]:
                s = nxt.get("token", "")
                s = s.strip() if not digits else s
                if s and s.isdigit() and len(digits + s) <= 3:
                    digits += s
                else:
                    break
            written = _canon_int(digits) if digits else None
            single = written is not None and _canon_int(t) == written
            alts = tok.get("top_logprobs") or [{"token": t, "logprob": tok.get("logprob", 0.0)}]
            num = den = 0.0
            for alt in alts:
                a, lp = alt.get("token", ""), alt.get("logprob")
                if lp is None:
                    continue
                if single:
                    v = _canon_int(a)
                else:
                    d = _canon_int(a)
                    v = None if d is None or d > 9 else (written if a.strip() == t.strip() and written is not None
                                                         else 0.0 if d == 0 else 10 * d + 4.5)
                if v is None:
                    continue
                p = math.exp(lp)
                num, den = num + p * v, den + p
            return num / den if den > 0 else None
        text_so_far += t
    return None


class ApiDetector(Detector):
    """Judge through an OpenAI-compatible ``/chat/completions`` endpoint (see the module docstring)."""

    family = "api"
    CALLS_JUDGE = True  # a judge asked about every unit it scores (filtering/scoring/judge_spend.py)

    # one line of help per spec option (docs/config.md, --describe); a test keeps it in step with __init__
    OPTION_HELP = {
        "base_url": "the OpenAI-compatible server, e.g. http://localhost:8000/v1",
        "model": "the model name the server serves",
        "api_key_env": "environment variable holding the API key (only from your own spec, never from a file a "
                       "detector loads)",
        "mode": "logprobs (expected value of the score from top_logprobs) | prompt (parse the reply)",
        "concurrency": "requests in flight at once",
        "max_retries": "retries of a 429/5xx/timeout/connection error, with exponential backoff",
        "timeout": "seconds per request",
        "backoff": "first retry delay in seconds (doubled each attempt, or the server's Retry-After; at most 60 s)",
        "top_logprobs": "mode=logprobs: alternatives asked for per token",
        "max_tokens": "reply length cap (default: enough for the prompt's answer)",
        "cot": "the chain-of-thought prompt",
        "context": "put the caption's preceding sentences before the target",
        "per_caption": "mode=prompt: one request per caption asking for every sentence's score as a JSON list",
    }

    # the options' ranges, declared once: the dry run (check_spec), --describe and the build check them
    OPTION_RANGES = {"concurrency": "[1, inf)", "max_retries": "[0, inf)", "timeout": "(0, inf)",
                     "backoff": "[0, inf)", "top_logprobs": "[1, inf)", "max_tokens": "[1, inf)"}

    def __init__(self, base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY", mode: str = "logprobs",
                 concurrency: int = 8, max_retries: int = 5, timeout: float = 60, backoff: float = 1.0,
                 top_logprobs: int = 20, max_tokens: int | None = None, cot: bool = False,
                 context: bool = False, per_caption: bool = False) -> None:
        super().__init__()
        if mode not in ("logprobs", "prompt"):
            raise ValueError(f"mode={mode!r}: expected 'logprobs' or 'prompt'")
        if not str(base_url).startswith(("http://", "https://")):
            raise ValueError(f"base_url={base_url!r}: expected an http(s) URL like http://localhost:8000/v1")
        if int(concurrency) < 1 or int(max_retries) < 0:
            raise ValueError(f"concurrency={concurrency!r}, max_retries={max_retries!r}: expected >= 1 and >= 0")
        if cot and mode != "prompt":
            raise ValueError("cot=true needs mode=prompt: the score follows the reasoning")
        if per_caption and (mode != "prompt" or cot or context):
            raise ValueError("per_caption=true needs mode=prompt without cot/context: one JSON list of scores per "
                             "caption is parsed from the reply")
        if api_key_env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(api_key_env)):
            raise ValueError(f"api_key_env={api_key_env!r}: expected an environment variable name")
        self.url = str(base_url).rstrip("/") + "/chat/completions"
        self.model, self.mode, self.api_key_env = model, mode, api_key_env
        self.concurrency, self.max_retries = int(concurrency), int(max_retries)
        self.timeout, self.backoff, self.top_logprobs = float(timeout), float(backoff), int(top_logprobs)
        self.max_tokens = int(max_tokens or (256 if cot else 16 if mode == "logprobs" else 64))
        self.cot, self.context, self.per_caption = bool(cot), bool(context), bool(per_caption)
        if per_caption and not max_tokens:
            self.max_tokens = 256
        self.retries = 0  # retried requests so far (for logs and tests)
        self.caption_fallbacks = 0  # per-caption replies without a usable list: rescored one request per sentence
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None

    def _payload(self, item: Item, url: str) -> dict:
        prompt = P.COT_PROMPT if self.cot else P.SCORE_PROMPT
        text = prompt + P.CAPTION_LEAD + " " + P.caption_text(item.sentence, item.context if self.context else None)
        body = {"model": self.model, "temperature": 0, "max_tokens": self.max_tokens,
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                          {"type": "text", "text": text}]}]}
        if self.mode == "logprobs":
            body.update(logprobs=True, top_logprobs=self.top_logprobs)
        return body

    def _post(self, client: httpx.Client, body: dict) -> dict:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        for attempt in range(self.max_retries + 1):
            wait = self.backoff * 2 ** attempt
            try:
                resp = client.post(self.url, json=body, headers=headers)
            except httpx.TransportError as e:  # connect / read errors and timeouts
                if attempt == self.max_retries:
                    raise DetectorError(f"api detector: POST {self.url} failed after {attempt + 1} attempt(s): "
                                        f"{type(e).__name__}: {e}") from None
            else:
                if resp.is_redirect:
                    raise DetectorError(f"api detector: POST {self.url} -> HTTP {resp.status_code} redirect to "
                                        f"{resp.headers.get('location', '?')!r} refused (credentials never follow a "
                                        "redirect); set base_url to the final address")
                if resp.status_code < 300:
                    try:
                        return resp.json()
                    except ValueError as e:
                        raise DetectorError(f"api detector: POST {self.url} returned invalid JSON ({e})") from None
                if resp.status_code not in _RETRY_STATUS or attempt == self.max_retries:
                    raise DetectorError(f"api detector: POST {self.url} -> HTTP {resp.status_code} after "
                                        f"{attempt + 1} attempt(s): {resp.text[:300]}")
                try:
                    wait = max(wait, float(resp.headers.get("Retry-After", 0)))
                except (TypeError, ValueError):
                    pass
            with self._lock:
                self.retries += 1
            time.sleep(min(wait, 60.0))
        raise AssertionError("unreachable")

    def _result(self, reply: dict) -> Result:
        choice = self._choice(reply)
        text = choice["message"].get("content") or ""
        if self.mode == "logprobs":
            content = (choice.get("logprobs") or {}).get("content") or []
            s = score_from_logprobs(content) if content else None
            if s is not None:
                return Result(s)
        v = P.parse_score(text)
        return Result(v) if v is not None else Result(50.0, parsed=False)

    def score_batch(self, items: Sequence[Item]) -> list[Result]:
        if not items:
            return []
        for it in items:
            if it.image is None:
                raise DetectorError(f"api detector: item {it.key}/{it.sentence_index} has no image")
        images, idx = distinct_images(items)
        urls = [image_data_url(im) for im in images]  # each image encoded once per batch
        url_of = [urls[i] for i in idx]
        if self.per_caption:
            return self._score_per_caption(items, url_of)
        replies = self._post_all([self._payload(it, u) for it, u in zip(items, url_of)])
        return [self._result(r) for r in replies]

    def _post_all(self, bodies: list[dict]) -> list[dict]:
        client = self._connection()
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(bodies))) as pool:
            return list(pool.map(lambda body: self._post(client, body), bodies))

    def _score_per_caption(self, items: Sequence[Item], url_of: list[str]) -> list[Result]:
        """One request per caption: items whose context continues the previous item's caption (same image) share
        it; the reply's JSON list gives every sentence's score. A reply without a list of the right length is
        rescored one request per sentence (counted in ``caption_fallbacks``)."""
        groups: list[tuple[list[str], list[tuple[int, int]], str]] = []  # sentences, (item, position), image url
        for i, it in enumerate(items):
            g = groups[-1] if groups else None
            ctx = [c.strip() for c in it.context]
            if g is None or g[2] != url_of[i] or g[0] != ctx:
                g = (ctx, [], url_of[i])
                groups.append(g)
            g[1].append((i, len(g[0])))
            g[0].append(it.sentence.strip())
        bodies = [self._caption_payload(sents, url) for sents, _, url in groups]
        out: list[Result | None] = [None] * len(items)
        retry = []
        for (sents, members, _), reply in zip(groups, self._post_all(bodies)):
            scores = P.parse_score_list(self._choice(reply)["message"].get("content") or "", len(sents))
            if scores is None:
                retry += [i for i, _ in members]
                self.caption_fallbacks += 1
                continue
            for i, pos in members:
                out[i] = Result(scores[pos])
        if retry:
            replies = self._post_all([self._payload(items[i], url_of[i]) for i in retry])
            for i, r in zip(retry, replies):
                out[i] = self._result(r)
        return out

    def _caption_payload(self, sentences: list[str], url: str) -> dict:
        text = P.PER_CAPTION_PROMPT + P.CAPTION_LEAD + "\n" + P.numbered_sentences(sentences)
        return {"model": self.model, "temperature": 0, "max_tokens": self.max_tokens,
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                          {"type": "text", "text": text}]}]}

    def _choice(self, reply: dict) -> dict:
        """``choices[0]`` of a reply, checked to hold a message."""
        try:
            choice = reply["choices"][0]
            choice["message"].get("content")
            return choice
        except (KeyError, IndexError, TypeError, AttributeError):
            raise DetectorError(f"api detector: reply from {self.url} has no choices[0].message: "
                                f"{json.dumps(reply)[:300]}") from None

    def _connection(self) -> httpx.Client:
        """One client for the detector's life: its connection pool (keep-alive, TLS sessions) serves every batch."""
        if self._client is None:
            limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
            self._client = httpx.Client(timeout=self.timeout, follow_redirects=False, limits=limits)
        return self._client

    def close(self) -> None:
        """Close the connection pool (also done when the detector is garbage-collected)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def __del__(self) -> None:
        client = getattr(self, "_client", None)
        if client is not None:
            client.close()


__all__ = ["ApiDetector", "image_data_url", "score_from_logprobs"]
