"""Evaluators: pass@k, verifier audits against human labels, reward-model pairs, round reports."""
