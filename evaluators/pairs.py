"""Preference pairs (a prompt, a chosen and a rejected answer) from the lake or a JSONL file,
as a reward model's check reads them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from thresher.stores.lake import Lake
from thresher.stores.schemas import DropReason

# Each prompt of a round's current selection: every (kept, failed) pair of its unhinted
# candidates, at most $per_prompt of them in a hash order (deterministic, and not biased
# to early samples); overall the first-ranked pair of every prompt comes before any
# prompt's second, so the $max_pairs cap spreads over prompts.
LAKE_PAIRS_SQL = f"""
WITH sel AS (
    SELECT DISTINCT s.candidate_id, s.prompt_id, s.kept, {DropReason.failed.sql()} AS failed
    FROM current_selections s JOIN candidates c USING (candidate_id)
    WHERE s.round = $round AND ($name IS NULL OR s.pipeline = $name)
      AND NOT coalesce(c.hinted, false)),
pairs AS (
    SELECT g.prompt_id, g.candidate_id AS chosen_id, b.candidate_id AS rejected_id,
           md5(g.candidate_id || '|' || b.candidate_id) AS h
    FROM sel g JOIN sel b ON g.prompt_id = b.prompt_id AND g.kept AND b.failed),
ranked AS (
    SELECT *, row_number() OVER (PARTITION BY prompt_id ORDER BY h) AS rank FROM pairs
    QUALIFY rank <= $per_prompt)
SELECT r.prompt_id, p.prompt, p.messages, g.text AS chosen, b.text AS rejected,
       r.chosen_id, r.rejected_id
FROM ranked r
JOIN candidates g ON g.candidate_id = r.chosen_id
JOIN candidates b ON b.candidate_id = r.rejected_id
JOIN prompts p ON p.prompt_id = r.prompt_id
ORDER BY r.rank, r.h
LIMIT $max_pairs
"""


class PairsError(ValueError):
    """Pairs that cannot be read or built (a malformed line, no pairs at all)."""


def lake_pairs(
    lake: Lake,
    round_: int,
    name: str | None = None,
    per_prompt: int = 4,
    max_pairs: int = 2000,
) -> list[dict[str, Any]]:
    """Pairs of round `round_`'s current selection (pipeline `name`'s, when given): a kept
    (chosen) and a failed (rejected) unhinted candidate of the same prompt, at most
    `per_prompt` per prompt and `max_pairs` in all. Rows: prompt_id, prompt, messages
    (as the prompts table holds them), chosen, rejected, chosen_id, rejected_id."""
    params = {"round": round_, "name": name, "per_prompt": per_prompt, "max_pairs": max_pairs}
    return lake.query(LAKE_PAIRS_SQL, params).to_dicts()


def _answer(value: Any, field: str) -> str:
    """An answer given as text, or as messages whose last one is the assistant's answer."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value:
        last = value[-1]
        if isinstance(last, dict) and isinstance(last.get("content"), str):
            if last.get("role", "assistant") != "assistant":
                raise PairsError(f"{field}: its last message is not the assistant's")
            return last["content"]
    raise PairsError(f"{field}: expected text or a list of messages ending with the answer")


def _is_messages(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in value)
    )


def _prompt(row: dict[str, Any]) -> tuple[str | None, str | None]:
    """(prompt, messages JSON) as the prompts table would hold the row's prompt."""
    value = row.get("prompt")
    if value is None:
        value = row.get("messages")
    if value is None and _is_messages(row.get("chosen")) and len(row["chosen"]) > 1:
        value = row["chosen"][:-1]  # the prompt given as the turns before the answer
        if not _is_messages(row.get("rejected")) or row["rejected"][:-1] != value:
            raise PairsError("no prompt: chosen and rejected start with different turns")
    if isinstance(value, str):
        return value, None
    if not _is_messages(value):
        raise PairsError("expected `prompt` (text or messages) or `messages`")
    if len(value) == 1 and value[0].get("role", "user") == "user":
        # one user turn: a plain prompt (as `thresher export --format dpo` writes plain prompts)
        return value[0]["content"], None
    users = [m["content"] for m in value if m.get("role") == "user"]
    return (users[-1] if users else None), json.dumps(value, ensure_ascii=False)


def _pair(line: str) -> dict[str, Any]:
    """One JSONL line as a pair (prompt, messages, chosen, rejected)."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise PairsError(f"not valid JSON ({e.msg})") from None
    if not isinstance(row, dict):
        raise PairsError("expected a JSON object")
    missing = [k for k in ("chosen", "rejected") if k not in row]
    if missing:
        raise PairsError(f"missing {' and '.join(missing)}")
    prompt, messages = _prompt(row)
    return {
        "prompt_id": row.get("prompt_id"),
        "prompt": prompt,
        "messages": messages,
        "chosen": _answer(row["chosen"], "chosen"),
        "rejected": _answer(row["rejected"], "rejected"),
    }


def read_pairs(path: str | Path, max_pairs: int | None = None) -> list[dict[str, Any]]:
    """Pairs of a JSONL file (rows as `thresher export --format dpo` writes them: `prompt`
    or `messages`, `chosen`, `rejected`, each text or messages), the first `max_pairs` of
    them. A malformed line raises PairsError naming it; blank lines are skipped."""
    path = Path(path)
    if not path.is_file():
        raise PairsError(f"{path}: no such file")
    pairs: list[dict[str, Any]] = []
    n = 0
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, start=1):
                if max_pairs is not None and len(pairs) >= max_pairs:
                    break
                if line.strip():
                    pairs.append({**_pair(line), "line": n})
    except UnicodeDecodeError as e:
        raise PairsError(f"{path}: not UTF-8 text after line {n} ({e.reason})") from None
    except PairsError as e:
        raise PairsError(f"{path}, line {n}: {e}") from None
    if not pairs:
        raise PairsError(f"{path}: no pairs")
    return pairs
