"""LoRA adapters served on top of the base model, several in one batch (see docs/lora.md)."""
