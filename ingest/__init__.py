"""Ingest: prompt files (raw or via a dataset preset) and labelled audit sheets, into the lake."""
