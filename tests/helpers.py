"""Small helpers shared by unit tests."""

from __future__ import annotations


def candidates_of(lake, prompt_ids: list[str]) -> list[str]:
    """The candidate ids of these prompts, in prompt and sample order."""
    rows = lake.query(
        "SELECT candidate_id FROM candidates WHERE prompt_id IN (SELECT unnest(?)) "
        "ORDER BY prompt_id, sample_idx",
        [list(prompt_ids)],
    )
    return rows["candidate_id"].to_list()
