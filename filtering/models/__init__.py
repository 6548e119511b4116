"""The model-loading layer: models built from names, paths and checkpoints in one place, for detectors, training and
evaluation alike (:mod:`.clip_models` open_clip, :mod:`.hf_vlm` Hugging Face vision-language models,
:mod:`.lora_adapters` halsift's LoRA adapter folders). Weights come only from safetensors
(:mod:`halsift.corpus.weights`)."""
