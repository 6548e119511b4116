"""``VlmJudge``: one loaded transformers VLM and its processor, lent to everything that reads a VLM's next-token
distribution: the ``vlm`` detector's modes (:mod:`halsift.filtering.detectors.vlm`), its LoRA training collator
(:mod:`halsift.training.lora_vlm`), PMI and likelihoods (:mod:`halsift.filtering.detectors.vlm_likelihood`) and the I-HallA
multiple-choice answerer (:func:`halsift.eval.metrics.ihalla.vlm_answerer`). A detector lends it through the ``vlm-judge``
capability (:meth:`halsift.filtering.detectors.base.Detector.vlm_judge`); a ``lora:`` adapter on a ``vlm`` base forwards
its judge, so a LoRA-tuned judge answers I-HallA and ``eval bench --likelihood`` too.

It owns: loading (``AutoModelForImageTextToText`` + ``AutoProcessor``, ``trust_remote_code`` off unless asked),
the device, the ``max_pixels`` cap (:func:`cap_pixels`), chat prompts (``[image, text]`` user turns, a template
split at a placeholder), the processor features of a prompt (on CPU: what a detector's ``prepare`` step builds
in worker processes), left-padded full-sequence batches (:meth:`VlmJudge.full_batch`) and **KV-prefix reuse**:
:meth:`VlmJudge.encode_prefix` runs prefixes (image + prompt) once with a cache (:class:`EncodedPrefix`) and
:meth:`VlmJudge.continue_prefix` runs many continuations on it. Continuations are padded in the middle (pads
between prefix and continuation are masked, real tokens get explicit position ids ``prefix_len + j``, so every row
ends at the last column) or on the right; Qwen2-VL's M-RoPE offsets (``rope_deltas``) are gathered per row and
passed as 3-D position ids. :meth:`VlmJudge.packed_logits` runs an image's prefix and all its continuations as one
sequence under a block mask instead (one pass, no cache; Qwen2-VL's vision attention batched over equal-size images,
:mod:`~halsift.filtering.detectors.vlm_vision`); :meth:`VlmJudge.deferred_features` /
:meth:`VlmJudge.resolve_images` run the processor's image half on the model's device.

Free-form use: :meth:`VlmJudge.letter_logprobs` / :meth:`VlmJudge.choice_logprobs` give the next-token
log-probabilities of the answer letters after a multiple-choice prompt (one forward pass; a letter counts every
token that decodes to it up to whitespace, e.g. ``"A"`` and ``" A"``), :meth:`VlmJudge.generate_text` a greedy
reply.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from halsift.filtering.detectors import vlm_prompts as P
from halsift.filtering.detectors.base import Detector, DetectorError

DEFAULT_MAX_PIXELS = 512 * 28 * 28
DTYPES = ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16")


def cap_pixels(image, max_pixels: int):
    """``image`` downscaled (aspect kept, bicubic) so that width x height <= ``max_pixels``; as is when it fits or
    ``max_pixels`` is 0. Visual tokens grow with pixels in dynamic-resolution VLMs (Qwen2-VL: one per 28x28 px)."""
    if not max_pixels or image is None or image.width * image.height <= max_pixels:
        return image
    from PIL import Image

    f = (max_pixels / (image.width * image.height)) ** 0.5
    return image.resize((max(1, int(image.width * f)), max(1, int(image.height * f))), Image.BICUBIC)


def chat_text(processor, prompt: str, prefill: str = "") -> str:
    """One ``[image, prompt]`` user turn in the processor's chat template, the generation prompt and ``prefill``."""
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    return processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) + prefill


def text_features(processor, text: str, image) -> dict:
    """Processor features (``input_ids``, pixel tensors ...) of ``text`` (holding the image placeholder) and
    ``image``, on CPU; no special tokens are added (the chat template has them)."""
    return dict(processor(text=[text], images=[image], return_tensors="pt", add_special_tokens=False))


def cache_argument(model: Any) -> str:
    """The name of ``model``'s KV-cache argument: ``cache`` from transformers 5.2x on (where ``past_key_values`` is
    deprecated, with a warning per call, and goes in 5.40), else ``past_key_values``."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


class EncodedPrefix:
    """Prefixes (a batch of processor features: image + prompt) run through the model once: their KV cache, their
    common length, the log-probabilities of the token after each, and their M-RoPE offsets (Qwen2-VL; else
    ``None``). :meth:`VlmJudge.continue_prefix` reuses the cache instead of re-encoding the images and prompts."""

    def __init__(self, judge: "VlmJudge | Detector", prefix: dict) -> None:
        import torch

        judge = as_judge(judge)
        feats = judge.on_device(prefix)
        with torch.inference_mode():
            out = judge.model(**feats, use_cache=True, logits_to_keep=1)
        self.cache = out["cache"] if "cache" in out else out.past_key_values  # named cache from transformers 5.2x
        self.next_logprobs = out.logits[:, -1].float().log_softmax(-1)  # [prefixes, vocab]
        self.first = self.next_logprobs[0]  # the first (or only) prefix's
        self.length = int(feats["input_ids"].shape[1])
        deltas = getattr(getattr(judge.model, "model", None), "rope_deltas", None)
        self.rope_deltas = None if deltas is None else deltas.reshape(-1)[:len(feats["input_ids"])].clone()


class VlmJudge:
    """A loaded VLM + processor (see the module docstring). ``model`` and ``device`` may be reassigned (a LoRA
    wrapper, a training loop's device); the tokenizer tables stay valid."""

    def __init__(self, model: Any, processor: Any, max_pixels: int = DEFAULT_MAX_PIXELS) -> None:
        if not isinstance(max_pixels, int) or max_pixels < 0:
            raise ValueError(f"max_pixels={max_pixels!r}: expected an integer >= 0 (0: no cap)")
        self.model, self.processor, self.max_pixels = model.eval(), processor, int(max_pixels)
        self.device = next(model.parameters()).device
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.tokenizer.eos_token_id or 0
        self.max_new_tokens = 32  # generate_text's default reply length (a vlm detector sets its own)
        self._vocab: list[str] | None = None
        self._letters: dict[tuple, dict[str, list[int]]] = {}
        self._text_feats: dict[tuple, dict] = {}  # (prompt text, image size) -> the text half of its features
        self._halves: dict[tuple, dict | bool] = {}  # the same for :meth:`features` (False: not separable)

    @classmethod
    def load(cls, model: str, *, dtype: str = "auto", device: str = "auto", device_map: str | None = None,
             attn_implementation: str | None = None, trust_remote_code: bool = False,
             max_pixels: int = DEFAULT_MAX_PIXELS) -> "VlmJudge":
        """Load ``model`` (a local path or hub name); ``device`` auto|cpu|cuda|cuda:N (ignored with
        ``device_map``). A model that cannot be loaded raises ValueError naming it."""
        import torch

        from halsift.filtering.models.hf_vlm import load_vlm

        net, processor = load_vlm(model, dtype=dtype, device_map=device_map, attn_implementation=attn_implementation,
                                  trust_remote_code=trust_remote_code)
        judge = cls(net, processor, max_pixels)
        if device_map is None:
            judge.to("cuda" if device == "auto" and torch.cuda.is_available() else
                     "cpu" if device == "auto" else device)
        return judge

    # ------------------------------------------------------------------------------------------ model
    def to(self, device: Any) -> "VlmJudge":
        if getattr(self.model, "hf_device_map", None):  # placed by device_map: moving it would undo that
            return self
        self.model.to(device)
        self.device = next(self.model.parameters()).device
        return self

    @property
    def sliding_window(self) -> bool:
        """Whether the language model has sliding-window layers (Gemma 3): they count cache slots, so pads inside
        the window would shift it, and continuations after a cached prefix are right-padded instead."""
        tc = getattr(self.model.config, "text_config", self.model.config)
        return any("sliding" in str(t) for t in (getattr(tc, "layer_types", None) or [])) or \
            bool(getattr(tc, "use_sliding_window", False))

    def on_device(self, feats: dict) -> dict:
        """``feats`` on the model's device, floating tensors in its dtype."""
        return {k: v.to(self.device) if not v.is_floating_point() else v.to(self.device, self.model.dtype)
                for k, v in feats.items()}

    # ------------------------------------------------------------------------------------------ vocabulary
    def vocab_strings(self) -> list[str]:
        """The decoded text of every token id (computed once)."""
        if self._vocab is None:
            self._vocab = self.tokenizer.batch_decode([[i] for i in range(len(self.tokenizer))])
        return self._vocab

    def ids_where(self, pred: Callable[[str], bool]) -> list[int]:
        """Token ids whose decoded text, stripped of whitespace, satisfies ``pred``."""
        return [i for i, s in enumerate(self.vocab_strings()) if pred(s.strip())]

    def letter_ids(self, letters: Sequence[str]) -> dict[str, list[int]]:
        """Token ids that count for each answer letter: every token whose decoded text, stripped of whitespace,
        is exactly the letter (case-sensitive): ``"A"``, ``" A"``, ``"\\nA"``; not ``"a"``, ``"A)"`` or ``"AB"``."""
        key = tuple(letters)
        if key not in self._letters:
            ids: dict[str, list[int]] = {l: [] for l in key}
            for i, t in enumerate(self.vocab_strings()):
                if t.strip() in ids:
                    ids[t.strip()].append(i)
            empty = [l for l in key if not ids[l]]
            if empty:
                raise ValueError(f"letters {empty}: no token of the vocabulary spells them")
            self._letters[key] = ids
        return self._letters[key]

    # ------------------------------------------------------------------------------------------ inputs
    def fit_image(self, image):
        """The image as the processor sees it: :func:`cap_pixels` to ``max_pixels``."""
        return cap_pixels(image, self.max_pixels)

    def split_prompt(self, prompt: str, placeholder: str) -> tuple[str, str]:
        """The chat-templated ``prompt`` split at ``placeholder`` (which it holds once): (head, tail)."""
        text = chat_text(self.processor, prompt)
        if text.count(placeholder) != 1:
            raise ValueError("the processor's chat template does not keep the user text verbatim")
        head, tail = text.split(placeholder)
        return head, tail

    def features(self, text: str, image) -> dict:
        """:func:`text_features` of ``text`` with ``image`` capped to ``max_pixels``, on CPU. The text half (token
        ids, masks) depends only on the prompt and the image size, so after the first image of a size only the
        processor's image half runs (~0.3 of the processor's time on the tiny judge); the split is checked on that
        first image (the image half alone must give the very tensors the whole processor gave), else never used."""
        if image is None:
            raise DetectorError("vlm judge: an item has no image")
        image = self.fit_image(image)
        key = (text, getattr(image, "size", None))
        half = self._halves.get(key)
        if half is None:
            feats = text_features(self.processor, text, image)
            if len(self._halves) >= 1024:
                self._halves.clear()
            self._halves[key] = self._text_half(feats, image)
            return feats
        if half is False:
            return text_features(self.processor, text, image)
        return {**{k: v.clone() for k, v in half.items()}, **self._image_half(image)}  # no row shares a tensor

    def _image_half(self, image) -> dict:
        return dict(self.processor.image_processor(images=[image], return_tensors="pt"))

    def _text_half(self, feats: dict, image) -> dict | bool:
        """The features of ``feats`` the image half does not give, when that half alone gives exactly the rest;
        else ``False`` (a processor whose image features depend on the text)."""
        import torch

        if getattr(self.processor, "image_processor", None) is None or getattr(image, "size", None) is None:
            return False
        try:
            part = self._image_half(image)
        except Exception:  # noqa: BLE001 - a processor that cannot run its image half alone: the whole one, always
            return False
        same = bool(part) and all(k in feats and torch.is_tensor(v) and torch.is_tensor(feats[k])
                                  and v.shape == feats[k].shape and torch.equal(v, feats[k]) for k, v in part.items())
        return {k: v for k, v in feats.items() if k not in part} if same else False

    def images_on_device(self) -> bool:
        """Whether the processor's image half can run batched on the model's device: a torchvision-backed image
        processor (transformers' fast / default v5 processors) that takes ``device=``."""
        ip = getattr(self.processor, "image_processor", None)
        return ip is not None and any(c.__name__ in ("TorchvisionBackend", "BaseImageProcessorFast")
                                      for c in type(ip).__mro__)

    def deferred_features(self, text: str, image) -> dict:
        """:meth:`features` of ``text`` and ``image`` with the image half left to :meth:`resolve_images`: the
        capped image as a uint8 ``[3, H, W]`` tensor under ``"_image"``, the names of the processor's image
        features under ``"_keys"`` and the text half (token ids ...) from a cache keyed by the prompt and the image
        size (the processor's placeholder count depends on nothing else).
        A size not seen before runs the whole processor once, on CPU, and returns its features as they are."""
        import numpy as np
        import torch

        if image is None:
            raise DetectorError("vlm judge: an item has no image")
        image = self.fit_image(image).convert("RGB")
        key = (text, image.width, image.height)
        hit = self._text_feats.get(key)
        if hit is None:
            feats = text_features(self.processor, text, image)
            names = set(getattr(self.processor.image_processor, "model_input_names", ()))
            text_half = {k: v for k, v in feats.items() if k not in names}
            if len(self._text_feats) >= 1024:
                self._text_feats.clear()
            if "pixel_values" in feats:
                self._text_feats[key] = {**text_half, "_keys": tuple(sorted(set(feats) - set(text_half)))}
            return feats
        return {**hit, "_image": torch.from_numpy(np.array(image)).permute(2, 0, 1)}

    def resolve_images(self, prefixes: list[dict]) -> list[dict]:
        """``prefixes`` with every :meth:`deferred_features` entry completed: its image run through the
        processor's image half on the model's device, batched per image size. When any entry was deferred, the
        image features of every entry end on the model's device and the text features stay on the host, so that
        entries made on the host (an image size seen for the first time) and on the device can be concatenated."""
        todo = [i for i, p in enumerate(prefixes) if "_image" in p]
        if not todo:
            return prefixes
        import torch

        out = [self._place(p) if "_image" not in p else p for p in prefixes]
        groups: dict[tuple, list[int]] = {}
        for i in todo:
            groups.setdefault(tuple(prefixes[i]["_image"].shape), []).append(i)
        ip = self.processor.image_processor
        for idx in groups.values():
            imgs = [prefixes[i]["_image"].to(self.device) for i in idx]
            got = dict(ip(images=imgs, return_tensors="pt", device=self.device))
            if "image_grid_thw" in got:  # patches of all images in one tensor: rows per image = t * h * w
                rows = got["image_grid_thw"].prod(-1).tolist()
                parts = [{"pixel_values": pv, "image_grid_thw": g[None]}
                         for pv, g in zip(torch.split(got["pixel_values"], rows), got["image_grid_thw"])]
            elif all(v.shape[0] == len(idx) for v in got.values()):  # one leading row per image
                parts = [{k: v[j:j + 1] for k, v in got.items()} for j in range(len(idx))]
            else:  # images nested per sample (Idefics3: [1, images, ...]): one call per image
                parts = [dict(ip(images=[im], return_tensors="pt", device=self.device)) for im in imgs]
            for i, part in zip(idx, parts):  # only the features the processor gives (not e.g. Gemma 3's num_crops)
                keys = prefixes[i]["_keys"]
                out[i] = self._place({**{k: v for k, v in prefixes[i].items() if k not in ("_image", "_keys")},
                                      **{k: v for k, v in part.items() if k in keys}})
        return out

    def _place(self, feats: dict) -> dict:
        """Text features (token ids, masks, type ids) on the host, every other tensor on the model's device."""
        text = set(self._text_keys(feats))
        return {k: v.cpu() if k in text else v.to(self.device) for k, v in feats.items()}

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
        return self.on_device(batch)

    # ------------------------------------------------------------------------------------------ KV-prefix reuse
    def encode_prefix(self, prefix: dict) -> EncodedPrefix:
        """Run ``prefix`` (features of one or more prefixes of one length and image shape) once, with a cache."""
        return EncodedPrefix(self, prefix)

    def continue_prefix(self, prefix: EncodedPrefix, slots: Sequence[int], conts: Sequence[Sequence[int]], *,
                        mid_pad: bool, logits_to_keep: Any = 0, keep_prefix: bool = False):
        """Logits of continuation ``conts[r]`` after prefix ``slots[r]`` of ``prefix``, all rows in one forward
        pass. ``mid_pad``: pads between prefix and continuation (every row ends at the last column); else on the
        right. ``logits_to_keep`` as in transformers (0: every position). ``keep_prefix``: the cache is copied, so
        ``prefix`` can be continued again (else it is consumed)."""
        import torch

        cache = copy.deepcopy(prefix.cache) if keep_prefix else prefix.cache  # a forward appends to its cache
        idx = torch.tensor(list(slots), dtype=torch.long, device=self.device)
        cache.reorder_cache(idx)
        plen, lens = prefix.length, [len(c) for c in conts]
        n = max(lens)
        ids = torch.full((len(conts), n), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(conts), plen + n), dtype=torch.long)
        mask[:, :plen] = 1
        pos = torch.arange(plen, plen + n).repeat(len(conts), 1)  # pads after a right-padded row continue on
        for r, c in enumerate(conts):
            m = n - lens[r] if mid_pad else 0
            ids[r, m:m + lens[r]] = torch.tensor(list(c), dtype=torch.long)
            mask[r, plen + m:plen + m + lens[r]] = 1
            pos[r, :m] = plen
            pos[r, m:m + lens[r]] = torch.arange(plen, plen + lens[r])
        pos = pos.to(self.device)
        if prefix.rope_deltas is not None:  # M-RoPE: text positions continue from the image's rope offset
            pos = (pos + prefix.rope_deltas.to(self.device)[idx].view(-1, 1)).unsqueeze(0).expand(3, -1, -1)
        with torch.inference_mode():
            return self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), position_ids=pos,
                              use_cache=True, logits_to_keep=logits_to_keep,
                              **{cache_argument(self.model): cache}).logits

    # ------------------------------------------------------------------------------------------ packed sentences
    def _base(self) -> Any:
        """The transformers model under any adapter wrapper (PEFT's ``get_base_model``; LoRA layers stay active)."""
        return self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model

    def packing_blocker(self) -> str | None:
        """Why :meth:`packed_logits` cannot serve this model (``None`` when it can): sliding-window layers (Gemma 3:
        windows and bidirectional image attention live in transformers' own masks), an attention implementation
        that takes no 4-D mask, a model without the ``model`` + output-embedding layout, logit soft-capping."""
        base = self._base()
        cfg = base.config
        tc = getattr(cfg, "text_config", cfg)
        impl = getattr(tc, "_attn_implementation", None) or getattr(cfg, "_attn_implementation", None)
        if self.sliding_window:
            return "sliding-window layers"
        if impl not in ("sdpa", "eager"):
            return f"attn_implementation={impl} takes no 4-D attention mask (sdpa or eager do)"
        if getattr(tc, "final_logit_softcapping", None) or getattr(cfg, "final_logit_softcapping", None):
            return "logit soft-capping"
        if getattr(base, "model", None) is None or base.get_output_embeddings() is None:
            return f"{type(base).__name__} has no .model + output embeddings"
        return None

    def _prefix_positions(self, feats: dict, same: bool = False):
        """Position ids of the prefix rows ``feats`` (on device) and the offset of the text after them: M-RoPE
        ``([3, B, P], deltas [B])`` from the model's own ``get_rope_index`` (Qwen2-VL), else ``([B, P], None)``.
        ``same``: every row has the same tokens and image grid (one prompt, images of one size), so the first
        row's positions serve all (``get_rope_index`` walks the rows in Python, reading each back from the GPU)."""
        import inspect

        import torch

        ids = feats["input_ids"]
        inner = self._base().model
        rope = getattr(inner, "get_rope_index", None)
        if rope is None:
            return torch.arange(ids.shape[1], device=ids.device).expand(ids.shape[0], -1), None
        params = inspect.signature(rope).parameters
        kw = {k: feats[k] for k in ("image_grid_thw", "mm_token_type_ids") if k in params and k in feats}
        rows = 1 if same else ids.shape[0]
        kw = {k: v[:rows] for k, v in kw.items()}
        pos, deltas = rope(input_ids=ids[:rows], attention_mask=torch.ones_like(ids[:rows]), **kw)
        return pos.expand(-1, ids.shape[0], -1), deltas.reshape(-1).expand(ids.shape[0])

    def packed_logits(self, prefix: dict, groups: Sequence[Sequence[Sequence[int]]], k: int):
        """Last ``k`` logits of every continuation in ``groups`` (``groups[b]``: the continuations after prefix row
        ``b`` of ``prefix``, features of prefixes of one length and image shape), in one forward pass and with no
        cache: row ``b`` is ``prefix_b + cont_1 + cont_2 + ...``, right-padded, under a block mask (prefix tokens
        causal; a continuation's tokens see the prefix and its own earlier tokens only; rows padded to a multiple of
        32 tokens) with each continuation's
        positions restarting after the prefix (M-RoPE offsets as :meth:`continue_prefix` gives them). The same
        numbers as :meth:`continue_prefix` on an encoded prefix, for one pass instead of two and no cache copy.
        Returns ``[sum of len(groups[b]), k, vocab]`` in order. See :meth:`packing_blocker` for the models it serves."""
        import torch

        feats = self.on_device(prefix)
        B, plen = feats["input_ids"].shape
        lens = [plen + sum(len(c) for c in g) for g in groups]
        L = -(-max(lens) // 32) * 32  # rounded up: fewer distinct shapes for the GPU's kernel plans
        ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        seg = torch.full((B, L), -1, dtype=torch.long)  # 0: prefix, s >= 1: continuation s, -1: pad
        step = torch.zeros((B, L), dtype=torch.long)  # position after the prefix (continuations)
        ends: list[tuple[int, int]] = []  # (row, column of a continuation's last token)
        for b, g in enumerate(groups):
            seg[b, :plen] = 0
            at = plen
            for s, c in enumerate(g, 1):
                ids[b, at:at + len(c)] = torch.tensor(list(c), dtype=torch.long)
                seg[b, at:at + len(c)] = s
                step[b, at:at + len(c)] = torch.arange(len(c))
                at += len(c)
                ends.append((b, at - 1))
        dev = self.device
        ids, seg, step = ids.to(dev), seg.to(dev), step.to(dev)
        ids[:, :plen] = feats["input_ids"]
        col = torch.arange(L, device=dev)
        q, kk = seg[:, :, None], seg[:, None, :]
        # key kk is visible from query q: causal, and kk in the prefix or in q's own continuation; a pad sees
        # itself only (no empty row: an all-masked row would give NaN)
        allowed = (col[:, None] >= col[None, :]) & ((kk == 0) | (kk == q))
        grid = prefix["image_grid_thw"].tolist() if "image_grid_thw" in prefix else None
        same = all(torch.equal(prefix[k][:1].cpu().expand_as(prefix[k]), prefix[k].cpu())
                   for k in ("input_ids", "mm_token_type_ids") if k in prefix) and \
            (grid is None or all(g == grid[0] for g in grid))
        pre_pos, deltas = self._prefix_positions(feats, same)
        text_pos = torch.where(seg > 0, plen + step, torch.zeros_like(step))
        if deltas is not None:  # M-RoPE: 3 rows; text after the image continues from the image's rope offset
            pos = (text_pos + deltas.view(-1, 1))[None].repeat(3, 1, 1)
            pos[:, :, :plen] = pre_pos
        else:
            pos = text_pos
            pos[:, :plen] = pre_pos
        base = self._base()
        # an additive float mask: eager adds it as is, and SDPA would turn a boolean one into this in every layer.
        # With one continuation per row the block mask is the causal one (pads only follow real tokens): no mask
        # lets transformers run its causal kernels.
        mask = None if all(len(g) == 1 for g in groups) else \
            torch.zeros((B, 1, L, L), dtype=self.model.dtype, device=dev).masked_fill_(
                ~allowed[:, None], torch.finfo(self.model.dtype).min)
        extra = {n: v for n, v in feats.items() if n not in self._text_keys(feats)}
        for n in self._text_keys(feats):  # per-token type ids: the continuations are text (0)
            if n not in ("input_ids", "attention_mask"):
                t = torch.zeros((B, L), dtype=feats[n].dtype, device=dev)
                t[:, :plen] = feats[n]
                extra[n] = t
        from halsift.filtering.detectors.vlm_vision import equal_patches, equal_size_attention

        with torch.inference_mode(), equal_size_attention(base, equal_patches(grid)):
            hidden = base.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                                **extra).last_hidden_state
            rows = torch.tensor([r for r, _ in ends], device=dev)
            cols = torch.tensor([c for _, c in ends], device=dev)
            at = cols[:, None] - torch.arange(k - 1, -1, -1, device=dev)[None]  # [n, k]: the last k columns
            return base.get_output_embeddings()(hidden[rows[:, None], at])

    # ------------------------------------------------------------------------------------------ free-form use
    def chat_inputs(self, image, prompt: str, prefill: str = "") -> dict:
        """Features of one chat turn (``[image, prompt]`` as the user, generation prompt + ``prefill``), on the
        model's device."""
        if image is None:
            raise DetectorError("vlm judge: no image given")
        return self.on_device(self.features(chat_text(self.processor, prompt, prefill), image))

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
        feats = self.chat_inputs(image, prompt, prefill)
        with torch.inference_mode():
            logits = self.model(**feats, use_cache=False, logits_to_keep=1).logits[0, -1].float()
        logp = logits.log_softmax(-1)
        return {l: float(torch.logsumexp(logp[ids[l]], 0)) for l in letters}

    def choice_logprobs(self, image, question: str, choices: Sequence[str]) -> dict[str, float]:
        """Multiple-choice VQA: log-probabilities of the letters A.. (one per choice) after
        :func:`~halsift.filtering.detectors.vlm_prompts.choice_prompt` (see :meth:`letter_logprobs`)."""
        return self.letter_logprobs(image, P.choice_prompt(question, tuple(choices)),
                                    P.CHOICE_LETTERS[:len(choices)])

    def generate_text(self, image, prompt: str, max_new_tokens: int | None = None) -> str:
        """Greedy reply to ``[image, prompt]`` (special tokens stripped); ``max_new_tokens`` defaults to
        :attr:`max_new_tokens`."""
        import torch

        feats = self.chat_inputs(image, prompt)
        with torch.inference_mode():
            out = self.model.generate(**feats, max_new_tokens=int(max_new_tokens or self.max_new_tokens),
                                      do_sample=False, temperature=None, top_p=None, top_k=None,
                                      pad_token_id=self.pad_id)
        return self.tokenizer.decode(out[0, feats["input_ids"].shape[1]:], skip_special_tokens=True)


def as_judge(obj: "VlmJudge | Detector", purpose: str = "") -> VlmJudge:
    """``obj`` itself when it is a :class:`VlmJudge`, else the judge a detector lends (capability ``vlm-judge``;
    :class:`~halsift.filtering.detectors.base.MissingCapability` naming the detector when it has none)."""
    if isinstance(obj, VlmJudge):
        return obj
    if isinstance(obj, Detector):
        return obj.vlm_judge(purpose)
    raise TypeError(f"expected a VlmJudge or a detector, got {type(obj).__name__}")


__all__ = ["DEFAULT_MAX_PIXELS", "EncodedPrefix", "VlmJudge", "as_judge", "cap_pixels", "chat_text",
           "text_features"]
