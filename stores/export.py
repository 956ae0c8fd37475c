"""Export a round's selected data as `datasets` datasets (and JSONL) for SFT or DPO."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from thresher.stores.lake import Lake
from thresher.stores.schemas import DropReason

# A round's kept data is its current selection (the latest curate run of the pipeline and
# round); a candidate two pipelines kept is exported once.
KEPT_SQL = """
SELECT s.round, c.candidate_id, c.prompt_id, p.prompt, p.messages, c.text AS completion,
       coalesce(c.hinted, false) AS hinted, p.task, p.dataset, c.segments,
       (SELECT max(v.answer) FROM verdicts v WHERE v.candidate_id = c.candidate_id) AS answer,
       (SELECT bool_and(v.passed) FROM verdicts v
        WHERE v.candidate_id = c.candidate_id AND v.verifier = 'answer_format') AS in_format
FROM current_selections s
JOIN candidates c USING (candidate_id)
JOIN prompts p ON p.prompt_id = c.prompt_id
WHERE s.kept AND s.round {op} $round AND ($name IS NULL OR s.pipeline = $name)
QUALIFY row_number() OVER (PARTITION BY c.candidate_id ORDER BY s.round) = 1
ORDER BY s.round, c.prompt_id, c.sample_idx
"""

FAILED_SQL = f"""
SELECT DISTINCT c.candidate_id, c.prompt_id, c.text, c.sample_idx
FROM current_selections s JOIN candidates c USING (candidate_id)
WHERE {DropReason.failed.sql()} AND s.round {{op}} $round AND ($name IS NULL OR s.pipeline = $name)
ORDER BY c.prompt_id, c.sample_idx
"""


class ExportError(ValueError):
    """Nothing to export, or the destination is not usable."""


def _messages(row: dict) -> list[dict]:
    if row["messages"]:
        return json.loads(row["messages"])
    return [{"role": "user", "content": row["prompt"]}]


def _kept(lake: Lake, round_: int, all_rounds: bool, name: str | None) -> list[dict]:
    sql = KEPT_SQL.format(op="<=" if all_rounds else "=")
    return lake.query(sql, {"round": round_, "name": name}).to_dicts()


def sft_rows(
    lake: Lake,
    round_: int,
    all_rounds: bool = False,
    name: str | None = None,
    restate_format: str | None = None,
) -> list[dict]:
    """SFT rows (messages, prompt, completion, ids) of a round's kept candidates
    (only those pipeline `name` curated, when given); with `restate_format` (a tag), an
    answer outside the format its prompt asks for ends with its answer restated in it."""
    from thresher.segments import tool_spans

    rows = []
    for r in _kept(lake, round_, all_rounds, name):
        completion, restated = r["completion"], False
        if restate_format:
            completion, restated = restate(r, restate_format)
        # what a code tool wrote: context in training, never a target (only rows that have it
        # carry the key, so the training rows of a lake without tools stay as they were)
        spans = [
            [a, min(b, len(completion))]
            for a, b in tool_spans(r["completion"], r["segments"])
            if a < len(completion)
        ]
        rows.append(
            {
                "messages": [*_messages(r), {"role": "assistant", "content": completion}],
                "prompt": r["prompt"] if r["prompt"] is not None else _messages(r)[-1]["content"],
                "completion": completion,
                "prompt_id": r["prompt_id"],
                "candidate_id": r["candidate_id"],
                "round": r["round"],
                "hinted": r["hinted"],
                **({"restated": restated} if restate_format else {}),
                **({"tool_spans": spans} if spans else {}),
            }
        )
    return rows


def tool_turns(messages: list[dict], completion: str, spans: list[list[int]]) -> list[dict]:
    """The conversation with a tool-calling answer as turns: the model's text as assistant
    messages, each tool output as a `tool` message between them."""
    out, at = list(messages[:-1]), 0
    for a, b in spans:
        if completion[at:a]:
            out.append({"role": "assistant", "content": completion[at:a]})
        out.append({"role": "tool", "content": completion[a:b]})
        at = b
    if completion[at:]:
        out.append({"role": "assistant", "content": completion[at:]})
    return out


def restate(row: dict, tag: str) -> tuple[str, bool]:
    """(completion, restated): the kept answer with `<tag>answer</tag>` on a last line when
    it is outside the asked format (its `answer_format` verdict failed; without one: its
    prompt names `<tag>` and it states no non-empty `<tag>...</tag>`) and its verifier read
    an answer; otherwise the text as it is."""
    import re

    text = row["completion"] or ""
    outside = row.get("in_format") is False
    if row.get("in_format") is None:
        asked = f"<{tag}>" in ((row.get("prompt") or "") + (row.get("messages") or ""))
        pairs = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, re.DOTALL)
        outside = asked and not (pairs and pairs[-1].strip())
    if not outside or not row.get("answer"):
        return text, False
    return f"{text.rstrip()}\n<{tag}>{row['answer']}</{tag}>", True


def export_round(
    lake: Lake,
    round_: int,
    fmt: Literal["sft", "dpo"],
    to: str | Path,
    all_rounds: bool = False,
    name: str | None = None,
) -> int:
    """Write round `round_`'s kept data (with `all_rounds`: rounds 0..round_) to `to`.

    sft rows: messages (prompt messages + the answer as assistant), prompt, completion,
    prompt_id, candidate_id, round, hinted. dpo rows: prompt (messages), chosen, rejected
    (a kept and a failed candidate of the same prompt), their ids. Only pipeline `name`'s
    selections count when given (default: every pipeline's current ones). Saved with
    `datasets.Dataset.save_to_disk(to)` and as `to/data.jsonl`. Returns the row count.
    """
    import datasets

    op = "<=" if all_rounds else "="
    kept = _kept(lake, round_, all_rounds, name)
    if not kept:
        raise ExportError(f"round {round_} has no kept candidates in {lake.root}")
    if fmt == "sft":
        rows = sft_rows(lake, round_, all_rounds, name)
        if any("tool_spans" in r for r in rows):
            # trainers read the tool's outputs as `tool` turns: context, not targets (TRL's
            # assistant-only loss, open-instruct's mask_tool_use); tool_spans says the same
            # of `completion`, character by character
            for r in rows:
                spans = r.setdefault("tool_spans", [])
                r["messages"] = tool_turns(r["messages"], r["completion"], spans)
                r["loss_mask"] = "assistant turns only; tool turns and tool_spans are context"
    elif fmt == "dpo":
        failed: dict[str, list[dict]] = {}
        failed_rows = lake.query(FAILED_SQL.format(op=op), {"round": round_, "name": name})
        for f in failed_rows.to_dicts():
            failed.setdefault(f["prompt_id"], []).append(f)
        rows, used = [], {}
        for r in kept:
            bad = failed.get(r["prompt_id"])
            if not bad:
                continue
            i = used.get(r["prompt_id"], 0)
            used[r["prompt_id"]] = i + 1
            rejected = bad[i % len(bad)]  # each kept answer pairs with the next failed one
            rows.append(
                {
                    "prompt": _messages(r),
                    "chosen": [{"role": "assistant", "content": r["completion"]}],
                    "rejected": [{"role": "assistant", "content": rejected["text"]}],
                    "prompt_id": r["prompt_id"],
                    "chosen_id": r["candidate_id"],
                    "rejected_id": rejected["candidate_id"],
                    "round": r["round"],
                }
            )
        if not rows:
            raise ExportError(f"round {round_} has no prompt with both a kept and a failed answer")
    else:
        raise ExportError(f"format must be sft or dpo, got {fmt!r}")
    to = Path(to)
    datasets.Dataset.from_list(rows).save_to_disk(str(to))
    with open(to / "data.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return len(rows)


# -- sources of a training mix (trainers/mix.py) --------------------------------------

REFERENCE_SQL = """
SELECT prompt_id, prompt, messages, answer, meta FROM prompts
WHERE dataset = $dataset AND split = 'train'
  AND ($ids IS NULL OR prompt_id IN (SELECT unnest($ids)))
ORDER BY prompt_id
"""


def latest_kept_round(lake: Lake, name: str) -> int | None:
    """The latest round in which pipeline `name` kept a candidate, or None."""
    row = lake.query(
        "SELECT max(round) AS r FROM current_selections WHERE kept AND pipeline = $name",
        {"name": name},
    )
    return row["r"][0] if row.height else None


def reference_rows(
    lake: Lake, dataset: str, response: str = "answer", prompt_ids: list[str] | None = None
) -> tuple[list[dict], int]:
    """SFT rows of a prompts dataset's train split, each prompt with its reference
    response (`answer`, or `meta.<key>`), and how many prompts had none. With `prompt_ids`,
    only those prompts, in that order (a file's rows as it was ingested)."""
    got = lake.query(REFERENCE_SQL, {"dataset": dataset, "ids": prompt_ids}).to_dicts()
    if prompt_ids is not None:
        where = {pid: i for i, pid in enumerate(prompt_ids)}
        got.sort(key=lambda r: where[r["prompt_id"]])
    rows, missing = [], 0
    for r in got:
        if response == "answer":
            text = r["answer"]
        else:
            text = json.loads(r["meta"] or "{}").get(response.removeprefix("meta."))
        if not isinstance(text, str) or not text.strip():
            missing += 1
            continue
        prompt = r["prompt"] if r["prompt"] is not None else _messages(r)[-1]["content"]
        rows.append(
            {
                "messages": [*_messages(r), {"role": "assistant", "content": text}],
                "prompt": prompt,
                "completion": text,
                "prompt_id": r["prompt_id"],
                "candidate_id": None,
                "round": None,
                "hinted": False,
            }
        )
    return rows, missing
