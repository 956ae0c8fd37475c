"""Export a round's selected data as `datasets` datasets (and JSONL) for SFT or DPO, and
the prompts in a pass-rate band for RL trainers (verl parquet, a TRL GRPO dataset)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from thresher.segments import tool_spans
from thresher.stores.lake import Lake
from thresher.stores.schemas import DropReason

# A round's kept data is its current selection (the latest curate run of the pipeline and
# round); a candidate two pipelines kept is exported once.
KEPT_SQL = """
SELECT s.round, c.candidate_id, c.prompt_id, p.prompt, p.messages, c.text AS completion,
       coalesce(c.hinted, false) AS hinted, p.task, p.dataset, c.segments,
       (SELECT max(v.answer) FROM verdicts v WHERE v.candidate_id = c.candidate_id) AS answer,
       (SELECT bool_and(v.passed) FROM verdicts v
        WHERE v.candidate_id = c.candidate_id AND list_contains($formats, v.verifier))
           AS in_format
FROM current_selections s
JOIN candidates c USING (candidate_id)
JOIN prompts p ON p.prompt_id = c.prompt_id
WHERE s.kept AND s.round {op} $round AND ($name IS NULL OR s.pipeline = $name)
QUALIFY row_number() OVER (PARTITION BY c.candidate_id ORDER BY s.round) = 1
ORDER BY s.round, c.prompt_id, c.sample_idx, c.candidate_id
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


def _kept(
    lake: Lake, round_: int, all_rounds: bool, name: str | None, formats: Sequence[str] = ()
) -> list[dict]:
    """A round's kept rows; `in_format` from the verdicts of the `formats` verifiers."""
    sql = KEPT_SQL.format(op="<=" if all_rounds else "=")
    params = {"round": round_, "name": name, "formats": list(formats)}
    return lake.query(sql, params).to_dicts()


def sft_rows(
    lake: Lake,
    round_: int,
    all_rounds: bool = False,
    name: str | None = None,
    restate_format: str | None = None,
    formats: Sequence[str] = (),
) -> list[dict]:
    """SFT rows (messages, prompt, completion, ids) of a round's kept candidates
    (only those pipeline `name` curated, when given); with `restate_format` (a tag), an
    answer outside the format its prompt asks for (as the verdicts of the `formats`
    verifiers say, else its text) ends with its answer restated in it."""
    rows = []
    for r in _kept(lake, round_, all_rounds, name, formats):
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
    it is outside the asked format (its format verdict failed; without one: its
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


# -- the RL hand-off (verl parquet, a TRL GRPO dataset) --------------------------------

# the latest model whose samples measured training prompts (an eval of held-out ones says
# nothing about which training prompts are in its band)
LATEST_MODEL_SQL = """
SELECT c.model FROM candidates c JOIN runs r ON r.run_id = c.run_id
JOIN prompts p ON p.prompt_id = c.prompt_id WHERE p.split = 'train'
ORDER BY r.started_at DESC, c.round DESC LIMIT 1
"""

# Each training prompt's pass rate under one model, pooled over every unhinted sample of
# it (its rounds' sampling and evaluations); eval and test prompts never leave.
BAND_SQL = """
SELECT h.prompt_id, sum(h.samples)::BIGINT AS samples, sum(h.passed)::BIGINT AS passed,
       sum(h.passed) / sum(h.samples) AS pass_rate,
       any_value(p.dataset) AS dataset, any_value(p.task) AS task,
       any_value(p.prompt) AS prompt, any_value(p.messages) AS messages,
       any_value(p.answer) AS answer, any_value(p.tests) AS tests, any_value(p.meta) AS meta
FROM prompt_pass_rates h JOIN prompts p ON p.prompt_id = h.prompt_id
WHERE h.model = $model AND p.split = 'train'
GROUP BY h.prompt_id
HAVING pass_rate BETWEEN $low AND $high
ORDER BY h.prompt_id
"""

VERIFY_OF_MODEL_SQL = """
SELECT json_extract(r.config, '$.verify') AS verify,
       json_extract(r.config, '$.select.decontaminate') AS decontaminate FROM runs r
WHERE r.flow = 'curate' AND r.run_id IN (SELECT run_id FROM candidates WHERE model = $model)
ORDER BY r.started_at DESC LIMIT 1
"""


def latest_model(lake: Lake) -> str | None:
    """The model of the run that last sampled training prompts (its `candidates.model`)."""
    got = lake.query(LATEST_MODEL_SQL)
    return got["model"][0] if got.height else None


def band_prompts(lake: Lake, model: str, low: float, high: float) -> list[dict]:
    """Training prompts whose pass rate under `model` lies in [low, high], with what a
    verifier needs (answer, tests, meta) and the pass rate's samples."""
    return lake.query(BAND_SQL, {"model": model, "low": low, "high": high}).to_dicts()


def measured_prompts(lake: Lake, model: str) -> int:
    """How many training prompts have a pass rate under `model`."""
    got = lake.query(
        """SELECT count(DISTINCT h.prompt_id) FROM prompt_pass_rates h
           JOIN prompts p ON p.prompt_id = h.prompt_id
           WHERE h.model = $model AND p.split = 'train'""",
        {"model": model},
    )
    return int(got[0, 0])


def model_settings(lake: Lake, model: str) -> tuple[dict, dict | None]:
    """The verify and decontaminate sections of the latest curate run that sampled with
    `model` (what judged its pass rates and what its pipeline kept out); ({}, None) when
    none recorded them."""
    got = lake.query(VERIFY_OF_MODEL_SQL, {"model": model})
    if not got.height:
        return {}, None
    verify, decontam = got["verify"][0], got["decontaminate"][0]
    return json.loads(verify) if verify else {}, json.loads(decontam) if decontam else None


def rl_rows(prompts: list[dict], model: str, verify: dict) -> list[dict]:
    """verl's RL layout, one row per prompt: data_source, chat `prompt`, ability,
    reward_model (rule, the reference as ground_truth), extra_info (index, prompt id, task,
    pass rate, and what the `verify` section's verifiers need); flat copies of the
    reference columns for TRL's reward functions, which get a dataset's columns as keyword
    arguments."""
    spec = json.dumps({"verifiers": verify["verifiers"], "options": verify.get("options") or {}})
    rows = []
    for i, p in enumerate(prompts):
        messages = _messages(p)
        truth = p["answer"] if p["answer"] is not None else (p["tests"] or "")
        text = p["prompt"] if p["prompt"] is not None else messages[-1]["content"]
        rows.append(
            {
                "data_source": p["dataset"],
                "prompt": messages,
                "ability": p["task"] or "general",
                "reward_model": {"style": "rule", "ground_truth": truth},
                "extra_info": {
                    "index": i,
                    "split": "train",
                    "prompt_id": p["prompt_id"],
                    "task": p["task"],
                    "pass_rate": float(p["pass_rate"]),
                    "samples": int(p["samples"]),
                    "model": model,
                    "question": text,
                    "answer": p["answer"],
                    "tests": p["tests"],
                    "meta": p["meta"],
                    "verifiers": spec,
                },
                # TRL: every column but `prompt` reaches the reward function by name
                "prompt_id": p["prompt_id"],
                "task": p["task"],
                "question": text,
                "answer": p["answer"],
                "tests": p["tests"],
                "meta": p["meta"],
                "verifiers": spec,
                "pass_rate": float(p["pass_rate"]),
            }
        )
    return rows


def save_rl(rows: list[dict], to: str | Path) -> dict[str, Path]:
    """Write `to/train.parquet` (verl's columns) and `to/trl` (a `datasets` dataset for
    TRL's GRPO trainer: chat `prompt` and the flat reference columns), plus data.jsonl."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    to = Path(to)
    to.mkdir(parents=True, exist_ok=True)
    verl_cols = ("data_source", "prompt", "ability", "reward_model", "extra_info")
    pq.write_table(pa.Table.from_pylist([{c: r[c] for c in verl_cols} for r in rows]),
                   to / "train.parquet")  # fmt: skip
    trl = [{k: v for k, v in r.items() if k not in verl_cols or k == "prompt"} for r in rows]
    datasets.Dataset.from_list(trl).save_to_disk(str(to / "trl"))
    with open(to / "data.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return {"verl": to / "train.parquet", "trl": to / "trl", "jsonl": to / "data.jsonl"}


def kept_sql_text(round_: int, all_rounds: bool, name: str | None) -> str:
    """The SQL that lists a round's kept rows, with its parameters written in."""
    sql = KEPT_SQL.format(op="<=" if all_rounds else "=").replace("$round", str(round_))
    sql = sql.replace("$formats", "[]::VARCHAR[]")
    return sql.replace("$name", "NULL" if name is None else _quoted(name))


def band_sql_text(model: str, low: float, high: float) -> str:
    """The SQL that lists a model's prompts in a pass-rate band, parameters written in."""
    return (
        BAND_SQL.replace("$model", _quoted(model))
        .replace("$low", str(low))
        .replace("$high", str(high))
    )


def pass_rate_runs(lake: Lake, model: str) -> list[str]:
    """The runs whose samples of `model` measured its pass rates."""
    got = lake.query(
        "SELECT DISTINCT run_id FROM prompt_pass_rates WHERE model = $model ORDER BY 1",
        {"model": model},
    )
    return got["run_id"].to_list()


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
