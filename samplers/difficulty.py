"""Difficulty-aware sampling: how many candidates each prompt gets this round."""

from __future__ import annotations


def plan_k(
    prompt_ids: list[str],
    k: int,
    rates: dict[str, float],
    skip_solved_above: float | None = None,
    hard_below: float | None = None,
    hard_k: int | None = None,
) -> dict[str, int]:
    """prompt_id -> candidates to sample (0: skip), from each prompt's last pass rate.

    A prompt solved at a rate of `skip_solved_above` or more is skipped; one solved less
    often than `hard_below` gets `hard_k`; unmeasured prompts and the rest get `k`.
    """
    plan = {}
    for pid in prompt_ids:
        rate = rates.get(pid)
        if rate is not None and skip_solved_above is not None and rate >= skip_solved_above:
            plan[pid] = 0
        elif rate is not None and hard_below is not None and hard_k and rate < hard_below:
            plan[pid] = hard_k
        else:
            plan[pid] = k
    return plan


def hinted_prompt(
    template: str, prompt: str | None, messages: list[dict] | None, **hint: str
) -> tuple[str | None, list[dict] | None]:
    """(prompt, messages) with a hint (`answer=...`, `hint=...`) filled into `template`.

    For chat prompts the hint goes into the last user message.
    """
    if messages:
        messages = [dict(m) for m in messages]
        last = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        messages[last]["content"] = template.format(prompt=messages[last]["content"], **hint)
        return None, messages
    return template.format(prompt=prompt or "", **hint), None
