"""Trainers: SFT (LoRA or full, one process or torchrun), tiny local models and GGUF import."""
