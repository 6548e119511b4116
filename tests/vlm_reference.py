"""An independent reference for VLM likelihood tests: a sentence's mean token log-prob from one unpadded Qwen2-VL
sequence (no batching, no cache), to compare halsift's batched and cached paths against."""

from __future__ import annotations

import torch

from halsift.filtering.detectors.vlm_likelihood import DESCRIBE_PROMPT


def reference_loglik(det, image, context: list[str], sentence: str) -> float:
    """Mean log-prob of the sentence tokens: one unpadded sequence, no batching."""
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": DESCRIBE_PROMPT}]}]
    head = det.processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    pre = det.processor(text=[head], images=[image], return_tensors="pt", add_special_tokens=False)
    ctx = det.tokenizer(" ".join(context), add_special_tokens=False)["input_ids"] if context else []
    sent = det.tokenizer((" " if context else "") + sentence, add_special_tokens=False)["input_ids"]
    ids = torch.cat([pre["input_ids"], torch.tensor([ctx + sent])], 1)
    mm = torch.cat([pre["mm_token_type_ids"], torch.zeros((1, len(ctx) + len(sent)), dtype=torch.long)], 1)
    with torch.no_grad():
        lp = det.model(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=mm,
                       pixel_values=pre["pixel_values"], image_grid_thw=pre["image_grid_thw"]).logits[0].log_softmax(-1)
    n = len(sent)
    return float(lp[-n - 1:-1].gather(-1, ids[0, -n:].view(-1, 1)).mean())
