"""Tiny randomly initialised VLMs built from configs, with processors built locally (no hub access).

:func:`build_tiny_vlm` saves model + processor with ``save_pretrained`` so that
``VlmDetector(model=path)`` (and ``AutoModelForImageTextToText.from_pretrained``) loads them like real ones.
Used by the tests and the throughput benchmark; a later issue pre-trains a tiny judge from them.

Architectures (``arch``):

* ``qwen2-vl``: Qwen2-VL (2 text layers, hidden 64; 2-block vision tower), byte-level BPE that splits numbers
  into single digits like Qwen2's own tokenizer (so the ``logits`` mode takes its digit path).
* ``idefics3``: Idefics3 / SmolVLM layout (tiny SigLIP-style tower, pixel-shuffle connector, tiny Llama),
  no image splitting, byte-level BPE splitting digits like SmolLM2's.
* ``gemma3``: Gemma 3 (tiny SigLIP tower, 4 pooled image tokens, tiny Gemma 3 text model with sliding-window
  layers and bidirectional attention over image tokens), digit-splitting BPE like Gemma's.
* ``llava``: LLaVA-1.5 layout (tiny CLIP vision tower + tiny Llama), byte-level BPE with the numbers
  ``0``–``100`` as single tokens (the ``logits`` mode's single-token path).

``size`` scales the text model (``tiny``: hidden 64, 2 layers; ``small``: hidden 256, 4 layers) for the
throughput benchmark. The tokenizer is trained by ``tokenizers`` on the judge prompts plus a small caption
vocabulary, so every prompt word is a few tokens.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

_WORDS = ("a an the and of in on at to with is are was red green blue yellow white black small large big dog cat "
          "bird car tree house person man woman child kid ball table chair sky grass road left right top bottom "
          "next under above behind front two three four one several sitting standing running park street water "
          "image shows there picture photo sign text reads near holding wearing shirt hat").split()

_SPECIALS = {
    "qwen2-vl": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                 "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"],
    "llava": ["<unk>", "<s>", "</s>", "<pad>", "<image>"],
    "idefics3": ["<|endoftext|>", "<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>",
                 "<global-img>"] + [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)],
    "gemma3": ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
               "<end_of_image>", "<image_soft_token>"],
}

QWEN_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for c in message['content'] %}{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAVA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}USER: {% else %}ASSISTANT: "
    "{% endif %}{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for c in message['content'] %}{% if c['type'] == 'image' %}<image>\n{% elif c['type'] == 'text' %}"
    "{{ c['text'] }}{% endif %}{% endfor %}{% endif %}{% if message['role'] != 'user' %}</s>{% endif %} "
    "{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)

IDEFICS3_TEMPLATE = (  # SmolVLM's layout
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}:"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for c in message['content'] %}{% if c['type'] == 'image' %}<image>{% elif c['type'] == 'text' %}"
    "{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)

GEMMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>{{ 'model' if message['role'] == 'assistant' "
    "else message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for c in message['content'] %}{% if c['type'] == 'image' %}<start_of_image>{% elif c['type'] == 'text' %}"
    "{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

ARCHS = ("qwen2-vl", "llava", "idefics3", "gemma3")


def _corpus(extra_text: Sequence[str] = ()) -> list[str]:
    from halsift.filtering.detectors import vlm_prompts as P

    lines = [P.SCORE_PROMPT, P.COT_PROMPT, P.LOCALIZE_PROMPT, P.YES_NO_PROMPT, P.CONTEXT_TEMPLATE,
             'USER: ASSISTANT: {"score": 85} {"score": 100} Score: 42/100 "output": "**[red]**"']
    lines += ["Yes No yes no"] * 4
    lines += [" ".join(_WORDS[i:i + 12]) + "." for i in range(0, len(_WORDS), 6)]
    lines += [" ".join(str(n) for n in range(k, k + 10)) for k in range(0, 101, 10)]
    return lines * 3 + list(extra_text)


def _tokenizer(arch: str, vocab_size: int, extra_text: Sequence[str] = ()):
    """Train a byte-level BPE on :func:`_corpus` (plus ``extra_text``) and wrap it as a transformers fast tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = _SPECIALS[arch]
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if arch in ("qwen2-vl", "idefics3", "gemma3"):  # Qwen2, SmolLM2 and Gemma split every digit on its own
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(extra_text), trainer)
    if arch == "llava":  # numbers 0..100 as single (non-special) tokens, like Llama-3-style tokenizers
        from tokenizers import AddedToken

        tok.add_tokens([AddedToken(str(n), single_word=False, normalized=False) for n in range(101)])
    if arch == "qwen2-vl":
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                       extra_special_tokens={"image_token": "<|image_pad|>",
                                                             "video_token": "<|video_pad|>"})
    elif arch == "gemma3":
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<end_of_turn>",
                                       pad_token="<pad>", unk_token="<unk>",
                                       extra_special_tokens={"image_token": "<image_soft_token>",
                                                             "boi_token": "<start_of_image>",
                                                             "eoi_token": "<end_of_image>"})
    elif arch == "idefics3":
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<end_of_utterance>",
                                       pad_token="<|endoftext|>", extra_special_tokens={"image_token": "<image>"})
    else:
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                       pad_token="<pad>", extra_special_tokens={"image_token": "<image>"})
    return fast


def _text_dims(size: str) -> dict:
    if size == "tiny":
        return dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2)
    if size == "small":
        return dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2)
    raise ValueError(f"size={size!r}: expected 'tiny' or 'small'")


def _build_qwen2_vl(tokenizer, size: str, init_std: float):
    from transformers import (Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessor,
                              Qwen2VLProcessor, Qwen2VLVideoProcessor)

    dims = _text_dims(size)
    head_dim = dims["hidden_size"] // dims["num_attention_heads"]
    q = head_dim // 2  # mrope sections (temporal, height, width) sum to head_dim / 2
    sections = [q - 2 * (q // 3), q // 3, q // 3]
    ids = tokenizer.convert_tokens_to_ids
    cfg = Qwen2VLConfig(
        text_config=dict(vocab_size=len(tokenizer), max_position_embeddings=4096, tie_word_embeddings=True,
                         initializer_range=init_std, bos_token_id=ids("<|endoftext|>"),
                         eos_token_id=ids("<|im_end|>"), pad_token_id=ids("<|endoftext|>"),
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                          "mrope_section": sections}, **dims),
        vision_config=dict(depth=2, embed_dim=32, hidden_size=dims["hidden_size"], num_heads=2, mlp_ratio=2,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
                           initializer_range=init_std),
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
        bos_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"), pad_token_id=ids("<|endoftext|>"))
    model = Qwen2VLForConditionalGeneration(cfg)
    pixels = dict(size={"shortest_edge": 56 * 56, "longest_edge": 56 * 56 * 4})  # 4..16 merged image tokens (pixels)
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(patch_size=14, merge_size=2, temporal_patch_size=2, **pixels),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(patch_size=14, merge_size=2, temporal_patch_size=2),
        chat_template=QWEN_TEMPLATE)
    return model, processor


# the vision tower shared by the llava, idefics3 and gemma3 builders: 32-pixel images, 8-pixel patches
TINY_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                   patch_size=8)


def _build_llava(tokenizer, size: str, init_std: float):
    from transformers import (CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration, LlavaProcessor)

    dims = _text_dims(size)
    ids = tokenizer.convert_tokens_to_ids
    vision = CLIPVisionConfig(**TINY_VISION, projection_dim=32, initializer_range=init_std)
    text = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=4096, bos_token_id=ids("<s>"),
                       eos_token_id=ids("</s>"), pad_token_id=ids("<pad>"), initializer_range=init_std, **dims)
    cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_id=ids("<image>"),
                      vision_feature_layer=-1, vision_feature_select_strategy="default",
                      projector_hidden_act="gelu", pad_token_id=ids("<pad>"), initializer_range=init_std)
    model = LlavaForConditionalGeneration(cfg)
    improc = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processor = LlavaProcessor(image_processor=improc, tokenizer=tokenizer, patch_size=8,
                               vision_feature_select_strategy="default", num_additional_image_tokens=1,
                               chat_template=LLAVA_TEMPLATE)
    return model, processor


def _build_idefics3(tokenizer, size: str, init_std: float):
    from transformers import (Idefics3Config, Idefics3ForConditionalGeneration, Idefics3ImageProcessor,
                              Idefics3Processor, LlamaConfig)

    dims = _text_dims(size)
    ids = tokenizer.convert_tokens_to_ids
    text = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=4096, bos_token_id=ids("<|im_start|>"),
                       eos_token_id=ids("<end_of_utterance>"), pad_token_id=ids("<|endoftext|>"),
                       initializer_range=init_std, **dims)
    vision = dict(**TINY_VISION, initializer_range=init_std)
    cfg = Idefics3Config(vision_config=vision, text_config=text.to_dict(), image_token_id=ids("<image>"),
                         scale_factor=2, pad_token_id=ids("<|endoftext|>"), initializer_range=init_std)
    model = Idefics3ForConditionalGeneration(cfg)
    improc = Idefics3ImageProcessor(do_image_splitting=False, size={"longest_edge": 32},
                                    max_image_size={"longest_edge": 32})
    processor = Idefics3Processor(image_processor=improc, tokenizer=tokenizer, image_seq_len=4,  # (32/8)^2 / 2^2
                                  chat_template=IDEFICS3_TEMPLATE)
    return model, processor


def _build_gemma3(tokenizer, size: str, init_std: float):
    from transformers import (Gemma3Config, Gemma3ForConditionalGeneration, Gemma3ImageProcessor,
                              Gemma3Processor, Gemma3TextConfig, SiglipVisionConfig)

    dims = _text_dims(size)
    ids = tokenizer.convert_tokens_to_ids
    text = Gemma3TextConfig(vocab_size=len(tokenizer), max_position_embeddings=4096, head_dim=16,
                            sliding_window=64, bos_token_id=ids("<bos>"), eos_token_id=ids("<end_of_turn>"),
                            pad_token_id=ids("<pad>"), initializer_range=init_std, **dims)
    vision = SiglipVisionConfig(**TINY_VISION, vision_use_head=False)
    cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                       boi_token_index=ids("<start_of_image>"), eoi_token_index=ids("<end_of_image>"),
                       image_token_index=ids("<image_soft_token>"), initializer_range=init_std)
    model = Gemma3ForConditionalGeneration(cfg)
    improc = Gemma3ImageProcessor(size={"height": 32, "width": 32}, do_pan_and_scan=False)
    processor = Gemma3Processor(image_processor=improc, tokenizer=tokenizer, image_seq_length=4,
                                chat_template=GEMMA3_TEMPLATE)
    return model, processor


def open_clip_vision_to_hf(visual) -> tuple[object, dict]:
    """An open_clip ``VisionTransformer`` (``model.visual``) as an HF ``CLIPVisionConfig`` plus the
    state dict of the matching ``CLIPVisionTransformer`` (``embeddings.*``, ``encoder.layers.*`` ... keys; load it
    with :func:`load_hf_vision`, which adds a ``vision_model.`` prefix where the HF model has one).

    Supported: the plain ViT layout (class token, learned positions, ``ln_pre``, ``nn.MultiheadAttention`` blocks
    with a ``c_fc``/``c_proj`` GELU MLP and no layer scale, ``ln_post``, CLS pooling), e.g. ``halsift-tiny``. The
    HF tower's ``post_layernorm(last_hidden_state[:, 0]) @ visual.proj`` equals ``encode_image``.
    """
    from torch import nn
    from transformers import CLIPVisionConfig

    blocks = visual.transformer.resblocks
    width = visual.conv1.out_channels
    patch = visual.conv1.kernel_size[0]
    grid = visual.grid_size[0] if hasattr(visual, "grid_size") else \
        int(round((visual.positional_embedding.shape[0] - 1) ** 0.5))
    heads = blocks[0].attn.num_heads
    act = blocks[0].mlp.gelu
    if not isinstance(act, nn.GELU) or getattr(act, "approximate", "none") != "none":
        raise ValueError(f"open_clip_vision_to_hf: activation {act!r} is not exact GELU (quick_gelu unsupported)")
    if getattr(visual, "attn_pool", None) is not None or getattr(visual, "pool_type", "tok") != "tok":
        raise ValueError("open_clip_vision_to_hf: only class-token pooling is supported")
    cfg = CLIPVisionConfig(hidden_size=width, intermediate_size=blocks[0].mlp.c_fc.out_features,
                           num_hidden_layers=len(blocks), num_attention_heads=heads, image_size=patch * grid,
                           patch_size=patch, hidden_act="gelu", layer_norm_eps=visual.ln_pre.eps,
                           projection_dim=visual.proj.shape[1] if visual.proj is not None else width)
    sd = {"embeddings.patch_embedding.weight": visual.conv1.weight,
          "embeddings.class_embedding": visual.class_embedding,
          "embeddings.position_embedding.weight": visual.positional_embedding,
          "pre_layrnorm.weight": visual.ln_pre.weight, "pre_layrnorm.bias": visual.ln_pre.bias,
          "post_layernorm.weight": visual.ln_post.weight, "post_layernorm.bias": visual.ln_post.bias}
    for i, b in enumerate(blocks):
        pre = f"encoder.layers.{i}."
        qw, kw, vw = b.attn.in_proj_weight.chunk(3, dim=0)
        qb, kb, vb = b.attn.in_proj_bias.chunk(3, dim=0)
        sd.update({pre + "layer_norm1.weight": b.ln_1.weight, pre + "layer_norm1.bias": b.ln_1.bias,
                   pre + "self_attn.q_proj.weight": qw, pre + "self_attn.q_proj.bias": qb,
                   pre + "self_attn.k_proj.weight": kw, pre + "self_attn.k_proj.bias": kb,
                   pre + "self_attn.v_proj.weight": vw, pre + "self_attn.v_proj.bias": vb,
                   pre + "self_attn.out_proj.weight": b.attn.out_proj.weight,
                   pre + "self_attn.out_proj.bias": b.attn.out_proj.bias,
                   pre + "layer_norm2.weight": b.ln_2.weight, pre + "layer_norm2.bias": b.ln_2.bias,
                   pre + "mlp.fc1.weight": b.mlp.c_fc.weight, pre + "mlp.fc1.bias": b.mlp.c_fc.bias,
                   pre + "mlp.fc2.weight": b.mlp.c_proj.weight, pre + "mlp.fc2.bias": b.mlp.c_proj.bias})
    return cfg, {k: v.detach().clone().contiguous() for k, v in sd.items()}


def load_hf_vision(tower, sd: dict) -> None:
    """Load :func:`open_clip_vision_to_hf`'s state dict into an HF CLIP vision model (strict but for buffers)."""
    if any(k.startswith("vision_model.") for k in tower.state_dict()):
        sd = {"vision_model." + k: v for k, v in sd.items()}
    missing, unexpected = tower.load_state_dict(sd, strict=False)
    if unexpected or [k for k in missing if not k.endswith("position_ids")]:
        raise RuntimeError(f"load_hf_vision: missing {missing}, unexpected {unexpected}")


def load_open_clip_visual(weights: str | os.PathLike, arch: str = "halsift-tiny"):
    """``(visual, preprocess)`` of an open_clip ``arch`` model with local ``weights`` (no download)."""
    from halsift.filtering.models.clip_models import load_open_clip

    model, _, preprocess = load_open_clip(arch, pretrained=str(weights))
    return model.visual.eval(), preprocess


def llava_with_clip_vision(model_dir: str | os.PathLike, vision_from: str | os.PathLike, arch: str = "halsift-tiny",
                           seed: int = 0, fan_in_projector: bool = True, feature_layer: int = -1,
                           select_strategy: str = "default") -> None:
    """Replace a saved tiny LLaVA's vision tower by an open_clip ``arch`` model's (weights ``vision_from``),
    converted with :func:`open_clip_vision_to_hf`; the processor gets open_clip's image size and mean/std.
    The rest of the model keeps its (seeded) init; ``fan_in_projector``: PyTorch's default Linear init for the
    projector, whose input is now the CLIP features. ``feature_layer``/``select_strategy``: LLaVA's
    ``vision_feature_layer`` and ``vision_feature_select_strategy`` ("default" drops the CLS token, "full" keeps it)."""
    import torch
    from transformers import AutoConfig, AutoProcessor, LlavaForConditionalGeneration

    visual, preprocess = load_open_clip_visual(vision_from, arch)
    vcfg, sd = open_clip_vision_to_hf(visual)
    config = AutoConfig.from_pretrained(str(model_dir))
    config.vision_config = vcfg
    config.vision_feature_layer = int(feature_layer)
    config.vision_feature_select_strategy = select_strategy
    processor = AutoProcessor.from_pretrained(str(model_dir))
    size = vcfg.image_size
    processor.patch_size = vcfg.patch_size
    processor.vision_feature_select_strategy = select_strategy
    ip = processor.image_processor
    ip.size = {"shortest_edge": size}
    ip.crop_size = {"height": size, "width": size}
    norm = [t for t in getattr(preprocess, "transforms", []) if type(t).__name__ == "Normalize"]
    if norm:
        ip.image_mean, ip.image_std = [float(x) for x in norm[0].mean], [float(x) for x in norm[0].std]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = LlavaForConditionalGeneration(config)
        if fan_in_projector:
            for m in model.model.multi_modal_projector.modules():
                if isinstance(m, torch.nn.Linear):
                    m.reset_parameters()
    load_hf_vision(model.model.vision_tower, sd)
    model.save_pretrained(str(model_dir))
    processor.save_pretrained(str(model_dir))


def build_tiny_vlm(arch: str, out_dir: str | os.PathLike, seed: int = 0, size: str = "tiny",
                   vocab_size: int = 600, init_std: float = 0.02, extra_text: Sequence[str] | None = None) -> Path:
    """Build a random ``arch`` VLM + processor, save both to ``out_dir`` (safetensors) and return the path.

    ``extra_text`` (e.g. sample captions of the data the model will see) is added to the tokenizer's training
    text, so that its words become whole tokens instead of byte pieces; give a larger ``vocab_size`` with it.

    ``init_std`` is the weights' init std; tests use a large one (e.g. 0.5) so that the random model's
    next-token distributions are peaked and scores spread over the range instead of sitting near 50.
    """
    import torch

    if arch not in ARCHS:
        raise ValueError(f"arch={arch!r}: expected one of {ARCHS}")
    out = Path(out_dir)
    tokenizer = _tokenizer(arch, vocab_size, extra_text or ())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        builder = {"qwen2-vl": _build_qwen2_vl, "llava": _build_llava, "idefics3": _build_idefics3,
                   "gemma3": _build_gemma3}[arch]
        model, processor = builder(tokenizer, size, init_std)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


__all__ = ["ARCHS", "build_tiny_vlm", "llava_with_clip_vision", "load_hf_vision", "load_open_clip_visual",
           "open_clip_vision_to_hf"]
