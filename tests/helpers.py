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


def select(lake, prompt_ids: list[str], rule=None, eval_index=None, **settings) -> int:
    """Select these prompts' candidates (selection "r", round 0) with SelectConfig(**settings)."""
    from thresher.config import SelectConfig
    from thresher.selection.select import select_batch

    ids = candidates_of(lake, prompt_ids)
    return select_batch(lake, "r", 0, ids, SelectConfig(**settings), rule, eval_index=eval_index)
