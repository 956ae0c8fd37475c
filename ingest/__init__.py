"""Ingest: prompts into the lake (files, dataset presets, environments), labelled audit
sheets, and the synthetic arithmetic problems of the demos and tiny models."""
