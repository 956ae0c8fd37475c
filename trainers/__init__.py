"""Trainers: models and fine-tuning (tiny local models for demos and tests so far)."""
