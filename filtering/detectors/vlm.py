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
* ``prompt``: the seeds' protocol: greedy generation, :func:`~halsift.filtering.detectors.vlm_prompts.parse_score`,
  unparseable -> 50 with ``parsed=False``. ``cot=true`` uses the chain-of-thought prompt; ``self_ensemble=N``
  samples N replies at temperature 1.5, top_p 0.9 and averages the parsed scores.
* ``pmi``: no judging prompt; the model is read as a captioner. ``[image, "Describe this image in detail."]``,
  then the caption's preceding sentences and the sentence in the assistant turn; score ``100 · sigmoid(PMI)``
  with PMI = ``Σ_t log p(t | image) − log mean_k p(t | reference_k)`` over the sentence's tokens
  (:func:`halsift.filtering.detectors.vlm_likelihood.image_pmi`): positive when the image supports the sentence more than
  typical images do. ``references`` names a folder of images or of WebDataset shards whose first
  ``n_references`` (default 8) decodable images are the references. Each reference's prefix (image + prompt) is
  encoded once per run and its KV cache reused for every caption (``reuse_prefix=true``, the default), so a caption
  costs one full forward pass (its own image) plus ``n_references`` passes over its tokens alone; the sentences of
  a caption share those passes. Always conditions on the preceding sentences. Useful with a captioner the
  ``yes_prob``/``logits`` judges cannot be, and as an image-grounded ensemble member next to a text-leaning judge.
* ``localize``: the seeds' localization prompt; the ``**[...]**`` segments become ``Result.spans`` (word ranges,
  :func:`halsift.filtering.detectors.marked_spans.parse_marked`); score = 0 if any segment is marked, else 100.

``context=true`` puts the preceding sentences before the target (AlignBench Table D).

**Image-prefix reuse** (``logits``/``yes_prob``, ``reuse_prefix=true``, the default): the chat-templated prompt
is split at the caption into a prefix (system text, image, instruction up to ``Caption:``) and a continuation
(the sentence, the end of the turn, the prefill). Prefixes are encoded once per image (images with the same
prefix length in one batch) with a KV cache, the cache rows are gathered per sentence, and all sentences run
as one batch of continuations (:meth:`~halsift.filtering.detectors.vlm_judge.VlmJudge.continue_prefix`), padded in the
middle so that only the last ``k`` logits are computed. Models with sliding-window layers (Gemma 3) count the
window in cache slots, so for them the continuations are right-padded instead and the logits are computed at the
union of the rows' last ``k`` positions. Both paths tokenize prefix and continuation separately, so their token
sequences are identical and their scores agree to fp tolerance. The templates put the image before the
instruction text (the user content is ``[image, text]``), so the image is always in the shared prefix.

**Packed sentences** (``pack=true``; unset = on CUDA): instead of copying the prefix's cache per sentence, each
image's prefix and all of its sentences' continuations form **one** sequence, run in one forward pass with no
cache under a block mask: the prefix is causal, a continuation sees the prefix and its own earlier tokens only,
and its positions restart after the prefix (Qwen2-VL's M-RoPE offsets as above)
(:meth:`~halsift.filtering.detectors.vlm_judge.VlmJudge.packed_logits`). The same numbers as the cached path (the
tests hold them to a plain pass per sentence within 1e-3), in one pass instead of two and without the cache
gather: on a GPU, where the judge waits on kernel launches, that counts; on a CPU with a tiny model the masked
attention over the whole row costs more than it saves, so CPU models keep the cached path unless ``pack=true``.
Sliding-window models (Gemma 3) and attention implementations that take no 4-D mask (flash attention) fall back
to the cached path.

Without reuse, full sequences are left-padded into one batch (``forward_batch`` rows per forward/generate call).

**CPU half** (:meth:`VlmDetector.prepare`): the ``max_pixels`` cap, the processor (one prefix per distinct image)
and tokenization (``mode=pmi``: the captions' token plan), on CPU, so that the runner's read-ahead thread or
``score --decode-workers N`` processes run them and the main thread runs only the model
(:meth:`VlmDetector.score_prepared`; the same scores). With ``preprocess=device`` (``auto``: on CUDA, for
torchvision-backed image processors) the processor's image half moves to the scoring step, batched on the model's
device: ``prepare`` keeps the capped image as uint8 pixels and takes the prompt's token ids from a cache keyed by
the image size (a size not seen before runs the whole processor once, on CPU)
(:meth:`~halsift.filtering.detectors.vlm_judge.VlmJudge.deferred_features` /
:meth:`~halsift.filtering.detectors.vlm_judge.VlmJudge.resolve_images`); the continuations of a batch are tokenized
in one call.

The loaded model, processor, prompt building and KV reuse are a :class:`~halsift.filtering.detectors.vlm_judge.VlmJudge`
(``detector.judge``), which the detector lends for free-form use (capability ``vlm-judge``): I-HallA's
multiple-choice answerer (:func:`halsift.eval.metrics.ihalla.vlm_answerer`) and ``eval bench --likelihood``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from halsift.filtering.detectors import vlm_prompts as P
from halsift.filtering.detectors.base import (Detector, DetectorError, Item, PreparedDetector, Result, image_group,
                                              renamed_option)
from halsift.filtering.detectors.vlm_judge import DEFAULT_MAX_PIXELS, DTYPES, VlmJudge, cap_pixels

MODES = ("logits", "yes_prob", "prompt", "localize", "pmi")
PREPROCESS = ("auto", "cpu", "device")
_SENTINEL = "\u241fCAPTION\u241f"


def _chunk_positions(groups: Sequence[Any], size: int) -> list[list[int]]:
    """Positions ``0..len(groups)-1`` in consecutive chunks of at most ``size`` that never split a run of equal
    ``groups`` (a caption's sentences share an image), unless that run alone is longer than ``size``."""
    runs: list[list[int]] = []
    for i, g in enumerate(groups):
        if runs and groups[runs[-1][0]] == g:
            runs[-1].append(i)
        else:
            runs.append([i])
    chunks: list[list[int]] = []
    cur: list[int] = []
    for run in runs:
        if len(cur) + len(run) > size and cur:
            chunks.append(cur)
            cur = []
        if len(run) > size:  # longer than a chunk: split, on its own
            chunks += [run[k:k + size] for k in range(0, len(run), size)]
        else:
            cur += run
    return chunks + ([cur] if cur else [])


def caption_chunks(items: Sequence[Item], size: int) -> list[list[Item]]:
    """Consecutive items in chunks of at most ``size`` that never split a run of items sharing an image (a
    caption's sentences), unless that run alone is longer than ``size``: a split caption re-encodes its image."""
    return [[items[i] for i in c] for c in _chunk_positions([image_group(it) for it in items], size)]


def _check_options(mode: str, cot: bool, self_ensemble: int, batch_size: int, max_pixels: int,
                   references: str | None, temperature: float | None, dtype: str) -> float:
    """Validate the options that need no model; returns the PMI temperature."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: expected one of {MODES}")
    if cot and mode != "prompt":
        raise ValueError(f"cot=true needs mode=prompt (got mode={mode!r}): a chain of thought is generated")
    if int(self_ensemble) < 0 or (self_ensemble and mode != "prompt"):
        raise ValueError(f"self_ensemble={self_ensemble!r}: expected 0, or N >= 1 with mode=prompt")
    if int(batch_size) < 1:
        raise ValueError(f"forward_batch={batch_size!r}: expected an integer >= 1")
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
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: expected one of {sorted(DTYPES)}")
    return float(temperature)


class VlmDetector(PreparedDetector):
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
    CALLS_JUDGE = True  # a judge asked about every unit it scores (filtering/scoring/judge_spend.py)

    # one line of help per spec option (docs/config.md, --describe); a test keeps it in step with __init__
    OPTION_HELP = {
        "model": "a transformers image-text-to-text model: hub name or local folder",
        "mode": "logits | yes_prob | prompt | pmi | localize (the module docstring explains each)",
        "cot": "mode=prompt: the chain-of-thought prompt",
        "self_ensemble": "mode=prompt: sample N replies (temperature 1.5, top_p 0.9) and average their scores",
        "context": "put the caption's preceding sentences before the target (AlignBench Table D)",
        "reuse_prefix": "encode each image's prompt prefix once and share it between the image's sentences",
        "pack": "with reuse_prefix: true = all sentences of an image in one sequence after its prefix (block mask, "
                "one pass); false = the prefix's KV cache copied per sentence; unset = true on CUDA. Models it "
                "cannot serve (sliding windows, flash attention) fall back to false",
        "preprocess": "where the processor's image half runs: cpu (in prepare: read-ahead thread or decode "
                      "workers) | device (batched on the model's device when scoring) | auto (device on CUDA)",
        "forward_batch": "rows per forward/generate call (not score's --batch-size, the items per detector call)",
        "dtype": "auto | float32 | bfloat16 | float16",
        "device": "auto (CUDA when there is one) | cpu | cuda | cuda:1 ...",
        "device_map": "transformers device_map (e.g. auto) for models larger than one device",
        "attn_implementation": "transformers attention implementation (e.g. sdpa, flash_attention_2)",
        "trust_remote_code": "run the model repository's own code (off; only from your own spec, never from a "
                             "file a detector loads)",
        "max_new_tokens": "generation cap for mode=prompt/localize (default 32; 256 with cot; 128 for localize)",
        "seed": "seed of the sampling in self_ensemble",
        "references": "mode=pmi: a folder of images or WebDataset shards holding the reference images",
        "n_references": "mode=pmi: how many reference images (the first decodable ones)",
        "temperature": "mode=pmi: temperature of sigmoid(PMI / temperature)",
        "max_pixels": "images with more pixels are downscaled (aspect kept) before the processor; 0 = no cap",
        "batch_size": "former name of forward_batch (accepted with a warning)",
    }

    # the options' ranges, declared once: the dry run (check_spec), --describe and the build check them
    OPTION_RANGES = {"seed": "[0, inf)", "self_ensemble": "[0, inf)", "forward_batch": "[1, inf)",
                     "batch_size": "[1, inf)", "max_new_tokens": "[1, inf)", "n_references": "[1, inf)",
                     "temperature": "(0, inf)", "max_pixels": "[0, inf)"}

    def __init__(self, model: str, mode: str = "logits", cot: bool = False, self_ensemble: int = 0,
                 context: bool = False, reuse_prefix: bool = True, pack: bool | None = None,
                 preprocess: str = "auto", forward_batch: int = 16, dtype: str = "auto", device: str = "auto",
                 device_map: str | None = None, attn_implementation: str | None = None,
                 trust_remote_code: bool = False, max_new_tokens: int | None = None, seed: int = 0,
                 references: str | None = None, n_references: int = 8, temperature: float | None = None,
                 max_pixels: int = DEFAULT_MAX_PIXELS, batch_size: int | None = None) -> None:
        super().__init__()
        batch_size = renamed_option("vlm", "batch_size", batch_size, "forward_batch", forward_batch, 16)
        temperature = _check_options(mode, cot, self_ensemble, batch_size, max_pixels, references, temperature, dtype)
        judge = VlmJudge.load(model, dtype=dtype, device=device, device_map=device_map,
                              attn_implementation=attn_implementation, trust_remote_code=trust_remote_code,
                              max_pixels=max_pixels)
        self._setup(judge, mode=mode, cot=cot, self_ensemble=self_ensemble, context=context,
                    reuse_prefix=reuse_prefix, pack=pack, preprocess=preprocess, batch_size=batch_size, seed=seed,
                    references=references, n_references=n_references, temperature=temperature,
                    max_new_tokens=int(max_new_tokens or (256 if cot else 128 if mode == "localize" else 32)))

    @classmethod
    def from_model(cls, model: Any, processor: Any, *, mode: str = "logits", name: str = "vlm:in-memory",
                   **opts: Any) -> "VlmDetector":
        """Wrap an in-memory model + processor (benchmarks, training loops); options as in ``__init__``."""
        self = cls.__new__(cls)
        Detector.__init__(self, name)
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}: expected one of {MODES}")
        judge = VlmJudge(model, processor, opts.pop("max_pixels", DEFAULT_MAX_PIXELS))
        self._setup(judge, mode=mode, **{"cot": False, "self_ensemble": 0, "context": False, "reuse_prefix": True,
                                         "pack": None, "preprocess": "auto", "batch_size": 16, "seed": 0,
                                         "max_new_tokens": 32, **opts})
        return self

    def _setup(self, judge: VlmJudge, *, mode: str, cot: bool, self_ensemble: int, context: bool,
               reuse_prefix: bool, batch_size: int, max_new_tokens: int, seed: int, references: str | None = None,
               n_references: int = 8, temperature: float = 8.0, pack: bool | None = None,
               preprocess: str = "auto") -> None:
        self.judge = judge
        self.mode, self.cot, self.self_ensemble, self.context = mode, bool(cot), int(self_ensemble), bool(context)
        self.reuse_prefix, self.batch_size, self.seed = bool(reuse_prefix), int(batch_size), int(seed)
        self.pack = None if pack is None else bool(pack)
        if preprocess not in PREPROCESS:
            raise ValueError(f"preprocess={preprocess!r}: expected one of {PREPROCESS}")
        if preprocess == "device" and not judge.images_on_device():
            raise ValueError(f"preprocess=device: the processor's image half "
                             f"({type(getattr(judge.processor, 'image_processor', None)).__name__}) is not "
                             "torchvision-backed and cannot run on the model's device; use preprocess=cpu")
        self.preprocess = preprocess
        self.max_new_tokens = judge.max_new_tokens = int(max_new_tokens)
        self.localizes = mode == "localize"
        if mode == "pmi":
            from halsift.filtering.detectors.vlm_likelihood import describe_features, reference_images

            self._refs = [describe_features(judge, im) for im in reference_images(references, n_references)]
            self._encoded_refs = None  # their KV caches, made at the first batch (reuse_prefix)
            self.temperature = float(temperature)
            return
        self._head, self._tail = judge.split_prompt(self._instruction(), _SENTINEL)
        if mode == "logits":
            self._tail += P.SCORE_PREFILL
        self._mid_pad = not judge.sliding_window  # sliding windows count cache slots: pads would shift them
        if mode == "logits":
            self._number_tables()
        elif mode == "yes_prob":
            self._yes_ids = judge.ids_where(lambda s: s.lower() == "yes")
            self._no_ids = judge.ids_where(lambda s: s.lower() == "no")
            if not self._yes_ids or not self._no_ids:
                raise ValueError("mode=yes_prob needs tokens spelling 'yes' and 'no' in the vocabulary")

    # ------------------------------------------------------------------------------------------ the judge
    @property
    def model(self) -> Any:
        return self.judge.model

    @model.setter
    def model(self, value: Any) -> None:  # a LoRA-wrapped or merged model (lora detectors, training)
        self.judge.model = value

    @property
    def device(self) -> Any:
        return self.judge.device

    @device.setter
    def device(self, value: Any) -> None:
        self.judge.device = value

    @property
    def processor(self) -> Any:
        return self.judge.processor

    @property
    def tokenizer(self) -> Any:
        return self.judge.tokenizer

    @property
    def pad_id(self) -> int:
        return self.judge.pad_id

    def fit_image(self, image):
        """The image as the processor sees it: :func:`cap_pixels` to ``max_pixels``."""
        return self.judge.fit_image(image)

    def to(self, device: Any) -> "VlmDetector":
        self.judge.to(device)
        if self.mode == "pmi":
            self._encoded_refs = None
        return self

    # ------------------------------------------------------------------------------------------ setup
    def _instruction(self) -> str:
        if self.mode == "yes_prob":
            return P.YES_NO_PROMPT.replace("{sentence}", _SENTINEL)
        prompt = {"logits": P.SCORE_PROMPT, "prompt": P.COT_PROMPT if self.cot else P.SCORE_PROMPT,
                  "localize": P.LOCALIZE_PROMPT}[self.mode]
        return prompt + P.CAPTION_LEAD + " " + _SENTINEL

    def _number_tables(self) -> None:
        """Which token ids spell which number (see the module docstring)."""
        ids: dict[int, list[int]] = {n: [] for n in range(101)}
        for i, s in enumerate(self.judge.vocab_strings()):
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

    # ------------------------------------------------------------------------------------------ inputs
    def continuation_ids(self, it: Item) -> list[int]:
        """Token ids after the prefix: the sentence (with context when set), the prompt's tail and any prefill."""
        return self.continuations([it])[0]

    def continuations(self, items: Sequence[Item]) -> list[list[int]]:
        """:meth:`continuation_ids` of every item, tokenized in one call."""
        texts = [(it.sentence.strip() if self.mode == "yes_prob" else
                  " " + P.caption_text(it.sentence, it.context if self.context else None)) + self._tail
                 for it in items]
        ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        if self.mode == "logits" and self.number_mode == "digits":
            ids = [list(x) + self._force for x in ids]
        return [list(x) for x in ids]

    def prefix_inputs(self, image) -> dict:
        """Processor features (``input_ids``, pixel tensors ...) of the prompt up to the sentence, on CPU."""
        if image is None:
            raise DetectorError("vlm detector: an item has no image")
        return self.judge.features(self._prefix_text(), image)

    def _prefix_text(self) -> str:
        return self._head.rstrip(" ") if self.mode != "yes_prob" else self._head

    @property
    def defers_images(self) -> bool:
        """Whether :meth:`prepare` leaves the processor's image half to the scoring step (``preprocess``)."""
        if self.preprocess == "auto":
            return self.judge.device.type == "cuda" and self.judge.images_on_device()
        return self.preprocess == "device"

    def prepare(self, items: Sequence[Item]) -> dict:
        """The CPU half of scoring ``items``: the prefix features of each distinct image (processor, ``max_pixels``
        cap), each item's image slot and continuation tokens; for ``mode=pmi`` the captions' token plan
        (:func:`~halsift.filtering.detectors.vlm_likelihood.plan_pmi`). Never touches the model."""
        if any(it.image is None for it in items):
            raise DetectorError("vlm detector: an item has no image")
        if self.mode == "pmi":
            from halsift.filtering.detectors.vlm_likelihood import plan_pmi

            return {"pmi": plan_pmi(self.judge, items)}
        slot: dict[tuple, int] = {}
        for it in items:
            slot.setdefault(image_group(it), len(slot))
        prefixes = [None] * len(slot)
        defer = self.defers_images
        for it in items:
            k = slot[image_group(it)]
            if prefixes[k] is None:
                prefixes[k] = (self.judge.deferred_features(self._prefix_text(), it.image) if defer
                               else self.prefix_inputs(it.image))
        return {"prefixes": prefixes, "slots": [slot[image_group(it)] for it in items],
                "conts": self.continuations(items), "sentences": [it.sentence for it in items]}

    # ------------------------------------------------------------------------------------------ scoring
    def score_prepared(self, items: Sequence[Any], prepared: dict) -> list[Result]:
        """Score from :meth:`prepare`'s output (``items`` are only counted: they may be the runner's row tuples)."""
        if self.mode == "pmi":
            return self._score_pmi(prepared["pmi"])
        prepared = {**prepared, "prefixes": self.judge.resolve_images(prepared["prefixes"])}
        out: list[Result] = []
        for chunk in _chunk_positions(prepared["slots"], self.batch_size):
            slots = [prepared["slots"][i] for i in chunk]
            conts = [prepared["conts"][i] for i in chunk]
            if self.mode in ("logits", "yes_prob"):
                out += self._score_logits(slots, conts, prepared["prefixes"])
            else:
                out += self._score_generate(chunk, slots, conts, prepared)
        return out

    def _score_pmi(self, plan) -> list[Result]:
        from scipy.special import expit

        from halsift.filtering.detectors.vlm_likelihood import EncodedPrefix, planned_pmi

        if self.reuse_prefix and self._encoded_refs is None:  # once per run (and per device)
            self._encoded_refs = [EncodedPrefix(self.judge, r) for r in self._refs]
        pmi = planned_pmi(self.judge, plan, self._encoded_refs if self.reuse_prefix else self._refs,
                          self.batch_size)
        return [Result(100.0 * float(expit(v / self.temperature))) for v in pmi]

    def _score_logits(self, slots: list[int], conts: list[list[int]], prefixes: list[dict]) -> list[Result]:
        import torch

        k = 3 if self.mode == "logits" and self.number_mode == "digits" else 1
        with torch.inference_mode():
            if self.reuse_prefix and self.packs:
                logits = self._logits_packed(slots, conts, prefixes, k)
            elif self.reuse_prefix:
                logits = self._logits_reuse(slots, conts, prefixes, k)
            else:
                batch = self.judge.full_batch([prefixes[s] for s in slots], conts)
                logits = self.model(**batch, use_cache=False, logits_to_keep=k).logits[:, -k:]
        return [Result(s) for s in self._scores_from_logits(logits.float())]

    @property
    def packs(self) -> bool:
        """Whether ``logits``/``yes_prob`` with ``reuse_prefix`` run packed sequences (``pack`` and a model that
        :meth:`~halsift.filtering.detectors.vlm_judge.VlmJudge.packing_blocker` lets through)."""
        wanted = self.judge.device.type == "cuda" if self.pack is None else self.pack
        return wanted and self.judge.packing_blocker() is None

    @staticmethod
    def _prefix_buckets(slots: list[int], prefixes: list[dict]) -> list[list[int]]:
        """The distinct slots, grouped by prefix length and image tensor shapes (one prefill each)."""
        buckets: dict[tuple, list[int]] = {}
        for s in dict.fromkeys(slots):
            p = prefixes[s]
            sig = tuple(sorted((n, tuple(v.shape)) for n, v in p.items() if n not in ("input_ids", "attention_mask",
                                                                                   "mm_token_type_ids")))
            buckets.setdefault((p["input_ids"].shape[1], sig), []).append(s)
        return list(buckets.values())

    def _logits_packed(self, slots: list[int], conts: list[list[int]], prefixes: list[dict], k: int):
        """Last ``k`` logits per item; each distinct image is one row holding all its sentences (see
        :meth:`~halsift.filtering.detectors.vlm_judge.VlmJudge.packed_logits`)."""
        import torch

        result = [None] * len(slots)
        for bslots in self._prefix_buckets(slots, prefixes):
            rows = {s: [i for i, t in enumerate(slots) if t == s] for s in bslots}
            feats = {n: torch.cat([prefixes[s][n] for s in bslots], 0) for n in prefixes[bslots[0]]}
            logits = self.judge.packed_logits(feats, [[conts[i] for i in rows[s]] for s in bslots], k)
            for r, i in enumerate(i for s in bslots for i in rows[s]):
                result[i] = logits[r]
        return torch.stack(result)

    def _logits_reuse(self, slots: list[int], conts: list[list[int]], prefixes: list[dict], k: int):
        """Last ``k`` logits per item; each distinct image prefix is encoded once (see the module docstring)."""
        import torch

        result = [None] * len(slots)
        for bslots in self._prefix_buckets(slots, prefixes):
            rows = [i for i, s in enumerate(slots) if s in set(bslots)]
            enc = self.judge.encode_prefix({n: torch.cat([prefixes[s][n] for s in bslots], 0)
                                            for n in prefixes[bslots[0]]})
            at_slot = {s: j for j, s in enumerate(bslots)}
            lens = [len(conts[i]) for i in rows]
            if self._mid_pad:  # every row ends at the last column: only the last k logits are computed
                keep, at = k, [list(range(-k, 0))] * len(rows)
            else:  # right padding: compute the logits at the union of the rows' last k positions
                cols = sorted({c for L in lens for c in range(L - k, L)})
                keep = torch.tensor(cols, device=self.device)
                at = [[cols.index(c) for c in range(L - k, L)] for L in lens]
            cont = self.judge.continue_prefix(enc, [at_slot[slots[i]] for i in rows], [conts[i] for i in rows],
                                              mid_pad=self._mid_pad, logits_to_keep=keep)
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

    def _score_generate(self, chunk: list[int], slots: list[int], conts: list[list[int]],
                        prepared: dict) -> list[Result]:
        import torch

        batch = self.judge.full_batch([prepared["prefixes"][s] for s in slots], conts)
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
        self.last_texts = texts
        if self.mode == "localize":
            return [_localized(t, prepared["sentences"][i]) for i, t in zip(chunk, texts)]
        res = []
        for i in range(len(chunk)):
            vals = [v for v in (P.parse_score(t) for t in texts[i * n:(i + 1) * n]) if v is not None]
            res.append(Result(sum(vals) / len(vals), True) if vals else Result(50.0, parsed=False))
        return res


def _localized(text: str, sentence: str) -> Result:
    """``mode=localize``: the reply's marked segments as word spans; score 0 if any is marked, else 100."""
    from halsift.filtering.detectors.marked_spans import parse_marked, unwrap_output

    spans = [list(s) for s in parse_marked(text, sentence)]
    found = bool(spans) or unwrap_output(text) != text
    return Result(0.0 if spans else 100.0, parsed=found, spans=spans)


__all__ = ["MODES", "VlmDetector", "caption_chunks", "cap_pixels"]
