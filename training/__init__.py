"""CLIP fine-tuning (open_clip + accelerate) and detector fine-tuning (peft LoRA)."""
