"""``vlm`` detector: a vision-language model on transformers judges each (image, sentence).

Modes (option ``mode``):

* ``logits`` (default): one forward pass, no generation. The assistant turn is prefilled with ``{"score": `` and
  the score is the expected value of the number under the next-token distribution. Which tokens count:

  - *single-token vocabularies* (every number 0..100 is one token, e.g. Llama-3 style): all tokens whose decoded
    text, stripped of whitespace, is a canonical number 0..100 (``"85"``, ``" 85"``; not ``"085"``). Their
    probabilities are summed per number, renormalised over 0..100, and averaged.
  - *digit vocabularies* (Qwen2, Gemma, Llama-2 split numbers into digits): the continuation is teacher-forced
    with ``"1"``, ``"0"`` in the same forward pass, giving three next-token distributions: P1 (first digit, over
    the ten digit tokens, renormalised), Q (after ``"1"``) and R (after ``"10"``). The first digit 1 is resolved
    exactly into 1, 10–19 and 100: ``v(1) = Q(end)·1 + Σ_{e=1..9} Q(e)(10+e) + Q(0)(R(0)·100 + (1-R(0))·10)``
    (``end`` = all non-digit mass). Other first digits are valued at the middle of their decade,
    ``v(d) = 10d + 4.5`` (d = 2..9), and ``v(0) = 0``. Score = ``Σ_d P1(d) v(d)``. This resolves the
    ambiguity that matters (a confident "100" would otherwise read as "1") at no extra pass; the price is a
    within-decade resolution of ±4.5 for 20..99. (A mixed vocabulary, with some but not all of 10..100 as
    single tokens, takes the digit path and warns: the mass on its multi-digit tokens is ignored.)

  Never fails to parse.
* ``yes_prob``: VQAScore-style, ``Does this figure show "<sentence>"? Please answer yes or no.``; score =
  ``100 · P(yes) / (P(yes) + P(no))`` summing tokens that decode to yes / no (any case, any leading space).
* ``prompt``: the seeds' protocol: greedy generation, :func:`~halsift.filtering.vlm_prompts.parse_score`,
  unparseable -> 50 with ``parsed=False``. ``cot=true`` uses the chain-of-thought prompt; ``self_ensemble=N``
  samples N replies at temperature 1.5, top_p 0.9 and averages the parsed scores.
* ``pmi``: no judging prompt; the model is read as a captioner. ``[image, "Describe this image in detail."]``,
  then the caption's preceding sentences and the sentence in the assistant turn; score ``100 · sigmoid(PMI)``
  with PMI = ``Σ_t log p(t | image) − log mean_k p(t | reference_k)`` over the sentence's tokens
  (:func:`halsift.filtering.vlm_likelihood.image_pmi`): positive when the image supports the sentence more than
  typical images do. ``references`` names a folder of images or of WebDataset shards whose first
  ``n_references`` (default 8) decodable images are the references. Each reference's prefix (image + prompt) is
  encoded once per run and its KV cache reused for every caption (``reuse_prefix=true``, the default), so a caption
  costs one full forward pass (its own image) plus ``n_references`` passes over its tokens alone; the sentences of
  a caption share those passes. Always conditions on the preceding sentences. Useful with a captioner the
  ``yes_prob``/``logits`` judges cannot be, and as an image-grounded ensemble member next to a text-leaning judge.
* ``localize``: the seeds' localization prompt; the ``**[...]**`` segments become ``Result.spans`` (word ranges,
  :func:`halsift.filtering.marked_spans.parse_marked`); score = 0 if any segment is marked, else 100.

``context=true`` puts the preceding sentences before the target (AlignBench Table D).

**Image-prefix reuse** (``logits``/``yes_prob``, ``reuse_prefix=true``, the default): the chat-templated prompt
is split at the caption into a prefix (system text, image, instruction up to ``Caption:``) and a continuation
(the sentence, the end of the turn, the prefill). Prefixes are encoded once per image (images with the same
prefix length in one batch) with a KV cache, the cache rows are gathered per sentence, and all sentences run
as one batch of continuations, padded in the middle (pads between prefix and continuation are masked out and
the real tokens get explicit position ids ``prefix_len + j``), so that only the last ``k`` logits are computed.
Models with sliding-window layers (Gemma 3) count the window in cache slots, so for them the continuations are
right-padded instead and the logits are computed at the union of the rows' last ``k`` positions. Both paths
tokenize prefix and continuation separately, so their token sequences are identical and their scores agree to
fp tolerance. The templates put the image before the
instruction text (the user content is ``[image, text]``), so the image is always in the shared prefix. Qwen2-VL's
M-RoPE offsets (``rope_deltas``) are gathered per row and passed as explicit 3-D position ids.

Without reuse, full sequences are left-padded into one batch (``batch_size`` rows per forward/generate call).

**Free-form use** (any mode; I-HallA's multiple-choice answerer, :func:`halsift.eval.ihalla.vlm_answerer`):
:meth:`VlmDetector.letter_logprobs` / :meth:`VlmDetector.choice_logprobs` give the next-token log-probabilities
of the answer letters after a multiple-choice prompt (one forward pass; a letter counts every token that
decodes to it up to whitespace, e.g. ``"A"`` and ``" A"``), and :meth:`VlmDetector.generate_text` a greedy reply.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from halsift.filtering import vlm_prompts as P
from halsift.filtering.base import Detector, DetectorError, Item, Result

MODES = ("logits", "yes_prob", "prompt", "localize", "pmi")
_SENTINEL = "\u241fCAPTION\u241f"


DEFAULT_MAX_PIXELS = 512 * 28 * 28


def cap_pixels(image, max_pixels: int):
    """``image`` downscaled (aspect kept, bicubic) so that width x height <= ``max_pixels``; as is when it fits or
    ``max_pixels`` is 0. Visual tokens grow with pixels in dynamic-resolution VLMs (Qwen2-VL: one per 28x28 px)."""
    if not max_pixels or image is None or image.width * image.height <= max_pixels:
        return image
    from PIL import Image

    f = (max_pixels / (image.width * image.height)) ** 0.5
    return image.resize((max(1, int(image.width * f)), max(1, int(image.height * f))), Image.BICUBIC)


def caption_chunks(items: Sequence[Item], size: int) -> list[list[Item]]:
    """Consecutive items in chunks of at most ``size`` that never split a run of items sharing an image (a
    caption's sentences), unless that run alone is longer than ``size``: a split caption re-encodes its image."""
    runs: list[list[Item]] = []
    for it in items:
        if runs and _group_key(runs[-1][0]) == _group_key(it):
            runs[-1].append(it)
        else:
            runs.append([it])
    chunks: list[list[Item]] = []
    cur: list[Item] = []
    for run in runs:
        if len(cur) + len(run) > size and cur:
            chunks.append(cur)
            cur = []
        if len(run) > size:  # longer than a chunk: split, on its own
            chunks += [run[k:k + size] for k in range(0, len(run), size)]
        else:
            cur += run
    return chunks + ([cur] if cur else [])


def _group_key(it: Item) -> tuple:
    """Items that share an image: the same image object with the same ``image_id``. (Not the ``key``: bench rows
    of one caption have distinct keys, their row ids, but one decoded image.)"""
    return (it.image_id, id(it.image))


class VlmDetector(Detector):
    """Judge (image, sentence) pairs with a transformers VLM; see the module docstring for the modes.

    ``model`` is a local path or hub name (loaded with ``AutoModelForImageTextToText`` + ``AutoProcessor``);
    ``dtype`` (auto|float32|bfloat16|float16), ``device`` (auto|cpu|cuda|cuda:N), ``device_map`` (e.g. auto,
    for models larger than one GPU; then ``device`` is ignored), ``attn_implementation`` (eager|sdpa|
    flash_attention_2), ``trust_remote_code`` (off unless set), ``max_new_tokens`` (default 32; 256 with
    ``cot``; 128 for ``localize``), ``seed`` (sampling for ``self_ensemble``), ``references`` /
    ``n_references`` (``mode=pmi``), ``max_pixels`` (images with more pixels are downscaled, aspect kept, before
    the processor: default 401408 = 512 Qwen2-VL visual tokens of 28x28 px, where an uncapped 1024x768 photo
    takes ~1000; 0 = no cap).
    """

    family = "vlm"

    def __init__(self, model: str, mode: str = "logits", cot: bool = False, self_ensemble: int = 0,
                 context: bool = False, reuse_prefix: bool = True, batch_size: int = 16, dtype: str = "auto",
                 device: str = "auto", device_map: str | None = None, attn_implementation: str | None = None,
                 trust_remote_code: bool = False, max_new_tokens: int | None = None, seed: int = 0,
                 references: str | None = None, n_references: int = 8, temperature: float | None = None,
                 max_pixels: int = DEFAULT_MAX_PIXELS) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}: expected one of {MODES}")
        if cot and mode != "prompt":
            raise ValueError(f"cot=true needs mode=prompt (got mode={mode!r}): a chain of thought is generated")
        if int(self_ensemble) < 0 or (self_ensemble and mode != "prompt"):
            raise ValueError(f"self_ensemble={self_ensemble!r}: expected 0, or N >= 1 with mode=prompt")
        if int(batch_size) < 1:
            raise ValueError(f"batch_size={batch_size!r}: expected an integer >= 1")
        if not isinstance(max_pixels, int) or max_pixels < 0:
            raise ValueError(f"max_pixels={max_pixels!r}: expected an integer >= 0 (0: no cap)")
        if mode == "pmi" and not references:
            raise ValueError("mode=pmi needs references=DIR (a folder of images or WebDataset shards)")
        if references and mode != "pmi":
            raise ValueError(f"references={references!r}: only used with mode=pmi (got mode={mode!r})")
        if temperature is not None and mode != "pmi":
            raise ValueError(f"temperature={temperature!r}: only used with mode=pmi (got mode={mode!r})")
        temperature = 8.0 if temperature is None else temperature
        if not isinstance(temperature, (int, float)) or temperature <= 0:
            raise ValueError(f"temperature={temperature!r}: expected a number > 0 (nats)")
        import torch
        from transformers import AutoModelForImageTextToText, AutoProcessor

        dtypes = {"auto": "auto", "float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                  "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
        if dtype not in dtypes:
            raise ValueError(f"dtype={dtype!r}: expected one of {sorted(dtypes)}")
        self.max_new_tokens = int(max_new_tokens or (256 if cot else 128 if mode == "localize" else 32))
        kw: dict[str, Any] = {"dtype": dtypes[dtype], "trust_remote_code": bool(trust_remote_code)}
        if device_map:
            kw["device_map"] = device_map
        if attn_implementation:
            kw["attn_implementation"] = attn_implementation
        try:
            processor = AutoProcessor.from_pretrained(model, trust_remote_code=bool(trust_remote_code))
            net = AutoModelForImageTextToText.from_pretrained(model, **kw)
        except (OSError, ValueError) as e:
            raise ValueError(f"model={model!r}: cannot load a vision-language model and processor ({e})") from e
        self._setup(net, processor, mode=mode, cot=cot, self_ensemble=self_ensemble, context=context,
                    reuse_prefix=reuse_prefix, batch_size=batch_size, max_new_tokens=self.max_new_tokens, seed=seed,
                    references=references, n_references=n_references, temperature=temperature,
                    max_pixels=max_pixels)
        if device_map is None:
            self.to("cuda" if device == "auto" and torch.cuda.is_available() else
                    "cpu" if device == "auto" else device)

    @classmethod
    def from_model(cls, model: Any, processor: Any, *, mode: str = "logits", name: str = "vlm:in-memory",
                   **opts: Any) -> "VlmDetector":
        """Wrap an in-memory model + processor (benchmarks, training loops); options as in ``__init__``."""
        self = cls.__new__(cls)
        Detector.__init__(self, name)
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}: expected one of {MODES}")
        opts.setdefault("max_new_tokens", 32)
        self._setup(model, processor, mode=mode, **{"cot": False, "self_ensemble": 0, "context": False,
                                                     "reuse_prefix": True, "batch_size": 16, "seed": 0, **opts})
        self.device = next(model.parameters()).device
        return self

    def _setup(self, model, processor, *, mode: str, cot: bool, self_ensemble: int, context: bool,
               reuse_prefix: bool, batch_size: int, max_new_tokens: int, seed: int, references: str | None = None,
               n_references: int = 8, temperature: float = 8.0, max_pixels: int = DEFAULT_MAX_PIXELS) -> None:
        self.model, self.processor = model.eval(), processor
        self.max_pixels = int(max_pixels)
        self.mode, self.cot, self.self_ensemble, self.context = mode, bool(cot), int(self_ensemble), bool(context)
        self.reuse_prefix, self.batch_size, self.seed = bool(reuse_prefix), int(batch_size), int(seed)
        self.max_new_tokens = int(max_new_tokens)
        self.localizes = mode == "localize"
        self.device = next(model.parameters()).device
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.tokenizer.eos_token_id or 0
        if mode == "pmi":
            from halsift.filtering.vlm_likelihood import describe_prefix, reference_images

            self._refs = [describe_prefix(processor, self.fit_image(im))
                          for im in reference_images(references, n_references)]
            self._encoded_refs = None  # their KV caches, made at the first batch (reuse_prefix)
            self.temperature = float(temperature)
            return
        self._head, self._tail = self._split_template()
        tc = getattr(model.config, "text_config", model.config)
        sliding = any("sliding" in str(t) for t in (getattr(tc, "layer_types", None) or [])) or \
            bool(getattr(tc, "use_sliding_window", False))
        self._mid_pad = not sliding  # sliding windows count cache slots, so pads inside the window would shift it
        if mode == "logits":
            self._number_tables()
        elif mode == "yes_prob":
            self._yes_ids = self._ids_where(lambda s: s.lower() == "yes")
            self._no_ids = self._ids_where(lambda s: s.lower() == "no")
            if not self._yes_ids or not self._no_ids:
                raise ValueError("mode=yes_prob needs tokens spelling 'yes' and 'no' in the vocabulary")

    # ------------------------------------------------------------------------------------------ setup
    def fit_image(self, image):
        """The image as the processor sees it: :func:`cap_pixels` to ``max_pixels``."""
        return cap_pixels(image, getattr(self, "max_pixels", 0))

    def to(self, device: Any) -> "VlmDetector":
        if getattr(self.model, "hf_device_map", None):  # placed by device_map: moving it would undo that
            return self
        self.model.to(device)
        self.device = next(self.model.parameters()).device
        if self.mode == "pmi":
            self._encoded_refs = None
        return self

    def _instruction(self) -> str:
        if self.mode == "yes_prob":
            return P.YES_NO_PROMPT.replace("{sentence}", _SENTINEL)
        prompt = {"logits": P.SCORE_PROMPT, "prompt": P.COT_PROMPT if self.cot else P.SCORE_PROMPT,
                  "localize": P.LOCALIZE_PROMPT}[self.mode]
        return prompt + P.CAPTION_LEAD + " " + _SENTINEL

    def _split_template(self) -> tuple[str, str]:
        """The chat-templated prompt split at the caption: (prefix text, continuation after the caption)."""
        msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": self._instruction()}]}]
        text = self.processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        if text.count(_SENTINEL) != 1:
            raise ValueError("the processor's chat template does not keep the user text verbatim")
        head, tail = text.split(_SENTINEL)
        if self.mode == "logits":
            tail += P.SCORE_PREFILL
        return head, tail

    def _vocab_strings(self) -> list[str]:
        return self.tokenizer.batch_decode([[i] for i in range(len(self.tokenizer))])

    def _ids_where(self, pred) -> list[int]:
        return [i for i, s in enumerate(self._vocab_strings()) if pred(s.strip())]

    def _number_tables(self) -> None:
        """Which token ids spell which number (see the module docstring)."""
        ids: dict[int, list[int]] = {n: [] for n in range(101)}
        for i, s in enumerate(self._vocab_strings()):
            s = s.strip()
            if s.isascii() and s.isdigit() and s == str(int(s)) and int(s) <= 100:
                ids[int(s)].append(i)
        if all(ids[n] for n in range(101)):
            self.number_mode = "single"
        elif all(ids[d] for d in range(10)):
            self.number_mode = "digits"
            if any(ids[n] for n in range(10, 101)):
                import warnings

                warnings.warn("mode=logits: the vocabulary has some multi-digit number tokens but not all of 0..100; "
                              "scoring by digits, so the mass on multi-digit tokens is ignored", stacklevel=3)
            enc = lambda s: self.tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
            one, zero = enc("1"), enc("0")
            if len(one) != 1 or len(zero) != 1:
                raise ValueError("mode=logits: the tokenizer does not encode '1' and '0' as single tokens")
            self._force = [one[0], zero[0]]
        else:
            raise ValueError("mode=logits: the vocabulary has neither single tokens for 0..100 nor for the digits")
        self._num_ids = ids

    # ------------------------------------------------------------------------------------------ inputs
    def continuation_ids(self, it: Item) -> list[int]:
        """Token ids after the prefix: the sentence (with context when set), the prompt's tail and any prefill."""
        text = " " + P.caption_text(it.sentence, it.context if self.context else None)
        if self.mode == "yes_prob":
            text = it.sentence.strip()
        ids = self.tokenizer(text + self._tail, add_special_tokens=False)["input_ids"]
        if self.mode == "logits" and self.number_mode == "digits":
            ids = ids + self._force
        return ids

    def prefix_inputs(self, image) -> dict:
        """Processor features (``input_ids``, pixel tensors ...) of the prompt up to the sentence, on CPU."""
        if image is None:
            raise DetectorError("vlm detector: an item has no image")
        head = self._head.rstrip(" ") if self.mode != "yes_prob" else self._head
        feats = self.processor(text=[head], images=[self.fit_image(image)], return_tensors="pt",
                               add_special_tokens=False)
        return dict(feats)

    def _text_keys(self, feats: dict) -> list[str]:
        return [k for k in ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids") if k in feats]

    def full_batch(self, prefixes: list[dict], conts: list[list[int]]) -> dict:
        """Left-padded full sequences (prefix + continuation) with their image tensors, one row per item, on the
        model's device (floating tensors in its dtype)."""
        import torch

        seqs = [torch.cat([p["input_ids"][0], torch.tensor(c, dtype=torch.long)]) for p, c in zip(prefixes, conts)]
        n = max(len(s) for s in seqs)
        batch = {"input_ids": torch.full((len(seqs), n), self.pad_id, dtype=torch.long),
                 "attention_mask": torch.zeros((len(seqs), n), dtype=torch.long)}
        aligned = [k for k in self._text_keys(prefixes[0]) if k not in ("input_ids", "attention_mask")]
        for k in aligned:  # per-token type ids (images vs text): the continuation is text (0)
            batch[k] = torch.zeros((len(seqs), n), dtype=torch.long)
        for r, (s, p) in enumerate(zip(seqs, prefixes)):
            batch["input_ids"][r, n - len(s):] = s
            batch["attention_mask"][r, n - len(s):] = 1
            for k in aligned:
                batch[k][r, n - len(s):n - len(s) + p["input_ids"].shape[1]] = p[k][0]
        for k in prefixes[0]:
            if k not in self._text_keys(prefixes[0]):
                batch[k] = torch.cat([p[k] for p in prefixes], 0)
        return {k: v.to(self.device) if v.is_floating_point() is False else v.to(self.device, self.model.dtype)
                for k, v in batch.items()}

    @property
    def yes_ids(self) -> list[int]:
        """``yes_prob`` mode: the token ids whose text is "yes" (any case, any surrounding whitespace)."""
        return list(self._yes_ids)

    @property
    def no_ids(self) -> list[int]:
        """``yes_prob`` mode: the token ids whose text is "no"."""
        return list(self._no_ids)

    @property
    def number_ids(self) -> dict[int, list[int]]:
        """``logits`` mode: number (0-100) -> token ids spelling it (in ``digits`` number_mode only 0-9 have any)."""
        return {n: list(v) for n, v in self._num_ids.items()}

    # ------------------------------------------------------------------------------------------ scoring
    def score_batch(self, items: Sequence[Item]) -> list[Result]:
        if not items:
            return []
        if self.mode == "pmi":
            from scipy.special import expit

            from halsift.filtering.vlm_likelihood import image_pmi

            if any(it.image is None for it in items):
                raise DetectorError("vlm detector: an item has no image")
            if self.reuse_prefix and self._encoded_refs is None:  # once per run (and per device)
                from halsift.filtering.vlm_likelihood import EncodedPrefix

                self._encoded_refs = [EncodedPrefix(self, r) for r in self._refs]
            pmi = image_pmi(self, items, self._encoded_refs if self.reuse_prefix else self._refs, self.batch_size)
            return [Result(100.0 * float(expit(v / self.temperature))) for v in pmi]
        prefixes: dict[tuple, dict] = {}
        for it in items:
            k = _group_key(it)
            if k not in prefixes:
                prefixes[k] = self.prefix_inputs(it.image)
        out: list[Result] = []
        for chunk in caption_chunks(items, self.batch_size):
            if self.mode in ("logits", "yes_prob"):
                out += self._score_logits(chunk, prefixes)
            else:
                out += self._score_generate(chunk, prefixes)
        return out

    def _score_logits(self, items: list[Item], prefixes: dict) -> list[Result]:
        import torch

        conts = [self.continuation_ids(it) for it in items]
        k = 3 if self.mode == "logits" and self.number_mode == "digits" else 1
        with torch.inference_mode():
            if self.reuse_prefix:
                logits = self._logits_reuse(items, conts, prefixes, k)
            else:
                batch = self.full_batch([prefixes[_group_key(it)] for it in items], conts)
                logits = self.model(**batch, use_cache=False, logits_to_keep=k).logits[:, -k:]
        return [Result(s) for s in self._scores_from_logits(logits.float())]

    def _logits_reuse(self, items: list[Item], conts: list[list[int]], prefixes: dict, k: int):
        """Last ``k`` logits per item; each distinct image prefix is encoded once (see the module docstring)."""
        import torch

        keys = list(dict.fromkeys(_group_key(it) for it in items))
        buckets: dict[tuple, list[tuple]] = {}  # same prefix length and image tensor shapes -> one prefill
        for key in keys:
            p = prefixes[key]
            sig = tuple((n, tuple(v.shape)) for n, v in p.items() if n not in ("input_ids", "attention_mask",
                                                                            "mm_token_type_ids"))
            buckets.setdefault((p["input_ids"].shape[1], sig), []).append(key)
        result = [None] * len(items)
        for bkeys in buckets.values():
            rows = [i for i, it in enumerate(items) if _group_key(it) in set(bkeys)]
            pre = {n: torch.cat([prefixes[key][n] for key in bkeys], 0) for n in prefixes[bkeys[0]]}
            pre = {n: v.to(self.device) if not v.is_floating_point() else v.to(self.device, self.model.dtype)
                   for n, v in pre.items()}
            out = self.model(**pre, use_cache=True, logits_to_keep=1)
            cache = out.past_key_values
            plen = pre["input_ids"].shape[1]
            slot = {key: j for j, key in enumerate(bkeys)}
            idx = torch.tensor([slot[_group_key(items[i])] for i in rows], device=self.device)
            cache.reorder_cache(idx)
            lens = [len(conts[i]) for i in rows]
            n = max(lens)
            ids = torch.full((len(rows), n), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(rows), plen + n), dtype=torch.long)
            mask[:, :plen] = 1
            pos = torch.full((len(rows), n), plen, dtype=torch.long)
            for r, i in enumerate(rows):
                m = n - lens[r] if self._mid_pad else 0  # pads before (mid padding) or after the continuation
                ids[r, m:m + lens[r]] = torch.tensor(conts[i])
                mask[r, plen + m:plen + m + lens[r]] = 1
                pos[r, m:m + lens[r]] = torch.arange(plen, plen + lens[r])
            pos = pos.to(self.device)
            deltas = getattr(getattr(self.model, "model", None), "rope_deltas", None)
            if deltas is not None:  # M-RoPE: text positions continue from the image's rope offset
                pos = (pos + deltas.to(self.device)[idx].view(-1, 1)).unsqueeze(0).expand(3, -1, -1)
            if self._mid_pad:  # every row ends at the last column: only the last k logits are computed
                keep, at = k, [list(range(-k, 0))] * len(rows)
            else:  # right padding: compute the logits at the union of the rows' last k positions
                cols = sorted({c for L in lens for c in range(L - k, L)})
                keep = torch.tensor(cols, device=self.device)
                at = [[cols.index(c) for c in range(L - k, L)] for L in lens]
            cont = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                              position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=keep).logits
            for r, i in enumerate(rows):
                result[i] = cont[r, at[r]]
        return torch.stack(result)

    def _scores_from_logits(self, logits) -> list[float]:
        """Scores from the last ``k`` next-token logits per item (``[B, k, V]``)."""
        import torch

        probs = logits.softmax(-1)
        if self.mode == "yes_prob":
            py = probs[:, -1, self._yes_ids].sum(-1)
            pn = probs[:, -1, self._no_ids].sum(-1)
            return (100 * py / (py + pn).clamp_min(1e-30)).tolist()
        ids = self._num_ids

        def mass(p, n):  # [B] probability of the tokens spelling number n
            return p[:, ids[n]].sum(-1)

        if self.number_mode == "single":
            m = torch.stack([mass(probs[:, -1], n) for n in range(101)], -1)
            m = m / m.sum(-1, keepdim=True).clamp_min(1e-30)
            return (m * torch.arange(101, dtype=m.dtype, device=m.device)).sum(-1).tolist()
        p1 = torch.stack([mass(probs[:, 0], d) for d in range(10)], -1)
        p1 = p1 / p1.sum(-1, keepdim=True).clamp_min(1e-30)
        q = torch.stack([mass(probs[:, 1], d) for d in range(10)], -1)
        q_end = (1 - q.sum(-1)).clamp_min(0)
        r0 = mass(probs[:, 2], 0)
        v1 = q_end * 1 + (q[:, 1:] * torch.arange(11, 20, dtype=q.dtype, device=q.device)).sum(-1) \
            + q[:, 0] * (r0 * 100 + (1 - r0) * 10)
        v = torch.arange(10, dtype=p1.dtype, device=p1.device) * 10 + 4.5
        v = v.expand_as(p1).clone()
        v[:, 0], v[:, 1] = 0.0, v1
        return (p1 * v).sum(-1).tolist()

    def _score_generate(self, items: list[Item], prefixes: dict) -> list[Result]:
        import torch

        batch = self.full_batch([prefixes[_group_key(it)] for it in items], [self.continuation_ids(it) for it in items])
        n = max(1, self.self_ensemble)
        gen: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "pad_token_id": self.pad_id}
        if self.self_ensemble:
            gen.update(do_sample=True, temperature=1.5, top_p=0.9, top_k=0, num_return_sequences=n)
        else:
            gen.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        with torch.inference_mode(), torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(self.seed)
            out = self.model.generate(**batch, **gen)
        texts = self.tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
        if self.mode == "localize":
            from halsift.filtering.marked_spans import parse_marked, unwrap_output

            res = []
            for it, t in zip(items, texts):
                spans = [list(s) for s in parse_marked(t, it.sentence)]
                found = bool(spans) or unwrap_output(t) != t
                res.append(Result(0.0 if spans else 100.0, parsed=found, spans=spans))
            return res
        res = []
        for i in range(len(items)):
            vals = [v for v in (P.parse_score(t) for t in texts[i * n:(i + 1) * n]) if v is not None]
            res.append(Result(sum(vals) / len(vals), True) if vals else Result(50.0, parsed=False))
        self.last_texts = texts
        return res

    # ------------------------------------------------------------------------------------------ free-form use
    def _chat_inputs(self, image, prompt: str, prefill: str = "") -> dict:
        """Processor features of one chat turn (``[image, prompt]`` as the user, generation prompt + ``prefill``)."""
        if image is None:
            raise DetectorError("vlm detector: no image given")
        msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
        text = self.processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) + prefill
        feats = dict(self.processor(text=[text], images=[self.fit_image(image)], return_tensors="pt",
                                    add_special_tokens=False))
        return {k: v.to(self.device) if not v.is_floating_point() else v.to(self.device, self.model.dtype)
                for k, v in feats.items()}

    def letter_ids(self, letters: Sequence[str]) -> dict[str, list[int]]:
        """Token ids that count for each answer letter: every token whose decoded text, stripped of whitespace,
        is exactly the letter (case-sensitive): ``"A"``, ``" A"``, ``"\\nA"``; not ``"a"``, ``"A)"`` or ``"AB"``."""
        cache = self.__dict__.setdefault("_letter_cache", {})
        key = tuple(letters)
        if key not in cache:
            want = set(key)
            ids: dict[str, list[int]] = {l: [] for l in key}
            for i, t in enumerate(self._vocab_strings()):
                if t.strip() in want:
                    ids[t.strip()].append(i)
            empty = [l for l in key if not ids[l]]
            if empty:
                raise ValueError(f"letters {empty}: no token of the vocabulary spells them")
            cache[key] = ids
        return cache[key]

    def letter_logprobs(self, image, prompt: str, letters: Sequence[str] = P.CHOICE_LETTERS,
                        prefill: str = "") -> dict[str, float]:
        """Log-probability of each answer letter as the next token, in one forward pass.

        The user turn is ``[image, prompt]`` in the model's chat template; the assistant turn is prefilled with
        ``prefill`` (default empty: the reply starts at the letter). A letter's probability sums its tokens
        (:meth:`letter_ids`: ``"A"`` and ``" A"`` ...) under the full next-token softmax, so the values are not
        renormalised over the letters.
        """
        import torch

        ids = self.letter_ids(letters)
        feats = self._chat_inputs(image, prompt, prefill)
        with torch.inference_mode():
            logits = self.model(**feats, use_cache=False, logits_to_keep=1).logits[0, -1].float()
        logp = logits.log_softmax(-1)
        return {l: float(torch.logsumexp(logp[ids[l]], 0)) for l in letters}

    def choice_logprobs(self, image, question: str, choices: Sequence[str]) -> dict[str, float]:
        """Multiple-choice VQA: log-probabilities of the letters A.. (one per choice) after
        :func:`~halsift.filtering.vlm_prompts.choice_prompt` (see :meth:`letter_logprobs`)."""
        return self.letter_logprobs(image, P.choice_prompt(question, tuple(choices)),
                                    P.CHOICE_LETTERS[:len(choices)])

    def generate_text(self, image, prompt: str, max_new_tokens: int | None = None) -> str:
        """Greedy reply to ``[image, prompt]`` (special tokens stripped); ``max_new_tokens`` defaults to the
        detector's own."""
        import torch

        feats = self._chat_inputs(image, prompt)
        with torch.inference_mode():
            out = self.model.generate(**feats, max_new_tokens=int(max_new_tokens or self.max_new_tokens),
                                      do_sample=False, temperature=None, top_p=None, top_k=None,
                                      pad_token_id=self.pad_id)
        return self.tokenizer.decode(out[0, feats["input_ids"].shape[1]:], skip_special_tokens=True)


__all__ = ["MODES", "VlmDetector"]
