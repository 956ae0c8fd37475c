"""Evaluation: pass@k of a model on held-out prompts, and the per-round report."""
