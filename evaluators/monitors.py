"""Monitors of each curated round: signs that the rounds collapse or learn to game their
signal, measured on a pipeline's current selection of the round and its candidates.

- distinct_answers: distinct final answers per prompt (as the rule verifiers extract them;
  candidates with no final answer share the answer "none"), mean over prompts;
- similarity: mean pairwise MinHash Jaccard estimate among a prompt's candidates, mean over
  prompts with two or more;
- top_opening / top_closing: the opening (closing) sentence most prompts have a candidate
  starting (ending) with, lower-cased with whitespace collapsed, and that share of prompts;
- all_p50, all_p90, kept_p50, kept_p90: tokens per candidate, of all and of the kept ones;
  kept_length_ratio = kept_p50 / all_p50;
- hinted_share: hinted candidates among the kept ones;
- headroom: pass@k - pass@1 (largest k) of the round's sampling model on held-out prompts
  (the evaluation of its candidates' model: model r, or the best model a rollback chose),
  when it was evaluated;
- mixed_share: prompts solved sometimes but not always (`prompt_difficulty`'s `mixed`);
- answer_excess: per task, the kept candidates' top final answer's share less that answer's
  share of the task's references, the largest over tasks (detail: task and answer); each
  task's own figures (`task_answer_monitors`) are rows `task:<task>:<monitor>` (view
  `task_monitors`).

Answers, similarity, sentences and the mixed share are measured on unhinted candidates
(what the model samples on its own), lengths on every candidate. `record_monitors`
writes them to the `monitors` table (view `round_monitors`); `check_monitors` holds them
against a bootstrap's `monitors:` gate.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import numpy as np
import polars as pl

from thresher.answers import answer_key
from thresher.config import MonitorsGateConfig
from thresher.selection.minhash import signatures
from thresher.stores.lake import ROUND_MONITOR_COLUMNS, Lake
from thresher.stores.queries import (
    current_selection_id,
    latest_overall_eval,
    selection_answers,
    selection_outcomes,
    selection_texts,
)
from thresher.stores.tables import write_monitors
from thresher.verifiers.extract import extract_answer

NUM_PERM, SHINGLE_SIZE = 128, 5  # selection's near-duplicate defaults
TEXT_BATCH_ROWS = 50_000  # candidate texts read and measured at once
NO_ANSWER = "\x00none"  # a candidate without a final answer (no real answer equals it)
MAX_SENTENCE = 300  # characters of a sentence compared and stored
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n+")

# gate field -> (the monitor it holds, how: at least, at most, or at most this far from 1)
GATES = {
    "min_distinct_answers": ("distinct_answers", "min"),
    "max_similarity": ("similarity", "max"),
    "max_repeated_opening_share": ("top_opening_share", "max"),
    "max_repeated_closing_share": ("top_closing_share", "max"),
    "max_length_drift": ("kept_length_ratio", "drift"),
    "max_hinted_share": ("hinted_share", "max"),
    "min_headroom": ("headroom", "min"),
    "min_mixed_share": ("mixed_share", "min"),
    "max_answer_excess": ("answer_excess", "max"),
}


def round_monitors(lake: Lake, name: str | None, round_: int) -> dict[str, Any]:
    """The monitors of pipeline `name`'s current selection of round `round_` (the
    `round_monitors` view's columns with its selection_id; {} when it curated nothing)."""
    return _measure(lake, name, round_)[0]


def record_monitors(lake: Lake, name: str | None, round_: int, run_id: str | None) -> dict:
    """Measure the round's monitors and append them to `monitors` (a monitor recorded
    before for the same selection and evaluation adds nothing); returns them."""
    monitors, eval_run_id = _measure(lake, name, round_)
    if monitors:
        rows = monitor_rows(monitors, name, round_, eval_run_id)
        sid = monitors["selection_id"]
        rows += task_monitor_rows(_task_answers(lake, sid), sid, name, round_)
        write_monitors(lake, rows, run_id)
    return monitors


def task_monitor_rows(
    table: pl.DataFrame, selection_id: str, name: str | None, round_: int
) -> list[dict]:
    """`monitors` rows of the per-task answer monitors (metric task:<task>:<monitor>)."""
    rows = []
    for r in table.iter_rows(named=True):
        for which in ("model", "kept", "reference"):
            if r[f"{which}_top_share"] is not None:
                rows.append((r["task"], f"{which}_top_share", r[f"{which}_top_share"],
                             r[f"{which}_top"]))  # fmt: skip
        rows.append((r["task"], "distinct_answers", r["distinct_answers"], None))
        if r["excess"] is not None:
            rows.append((r["task"], "answer_excess", r["excess"], r["kept_top"]))
    return [
        {
            "selection_id": selection_id,
            "pipeline": name,
            "round": round_,
            "metric": f"task:{task}:{monitor}",
            "value": float(value),
            "detail": detail,
            "eval_run_id": None,
        }
        for task, monitor, value, detail in rows
    ]


def task_answer_monitors(answers: pl.DataFrame) -> pl.DataFrame:
    """Per task of a selection's unhinted candidates (prompt_id, task, kept, answer,
    reference): the top final answer and its share among the model's answers, the kept
    ones and the references (one per prompt), the distinct answers, and `excess`, the
    kept top answer's share less its share of the references."""

    def top(keys: list[str | None]) -> tuple[str | None, float | None, Counter]:
        counts = Counter(k for k in keys if k is not None)
        if not counts:
            return None, None, counts
        key, n = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return key, round(n / sum(counts.values()), 4), counts

    out = []
    for task in sorted(answers["task"].fill_null("").unique().to_list()):
        part = answers.filter(pl.col("task").fill_null("") == task)
        said = [answer_key(a) for a in part["answer"].to_list()]
        kept = [k for k, keep in zip(said, part["kept"].to_list(), strict=True) if keep]
        refs = [answer_key(a) for a in part.unique("prompt_id")["reference"].to_list()]
        model_top, model_share, counts = top(said)
        kept_top, kept_share, _ = top(kept)
        ref_top, ref_share, ref_counts = top(refs)
        excess = None
        if kept_top is not None and ref_counts:
            excess = round(kept_share - ref_counts[kept_top] / sum(ref_counts.values()), 4)
        out.append(
            {
                "task": task,
                "model_top": model_top,
                "model_top_share": model_share,
                "kept_top": kept_top,
                "kept_top_share": kept_share,
                "reference_top": ref_top,
                "reference_top_share": ref_share,
                "distinct_answers": len(counts),
                "excess": excess,
            }
        )
    return pl.DataFrame(out, schema=TASK_ANSWER_SCHEMA)


TASK_ANSWER_SCHEMA = {
    "task": pl.String,
    "model_top": pl.String,
    "model_top_share": pl.Float64,
    "kept_top": pl.String,
    "kept_top_share": pl.Float64,
    "reference_top": pl.String,
    "reference_top_share": pl.Float64,
    "distinct_answers": pl.Int64,
    "excess": pl.Float64,
}


def _task_answers(lake: Lake, selection_id: str) -> pl.DataFrame:
    return task_answer_monitors(selection_answers(lake, selection_id))


def monitor_rows(
    monitors: dict[str, Any], name: str | None, round_: int, eval_run_id: str | None
) -> list[dict]:
    """`monitors` rows of one round's measured monitors (those measured only)."""
    details = {metric: column for column, metric, how in ROUND_MONITOR_COLUMNS if how == "detail"}
    rows = []
    for column, metric, how in ROUND_MONITOR_COLUMNS:
        if how == "detail" or monitors.get(column) is None:
            continue
        rows.append(
            {
                "selection_id": monitors["selection_id"],
                "pipeline": name,
                "round": round_,
                "metric": metric,
                "value": float(monitors[column]),
                "detail": monitors.get(details[metric]) if metric in details else None,
                "eval_run_id": eval_run_id if metric == "headroom" else None,
            }
        )
    return rows


def check_monitors(monitors: dict[str, Any], gate: MonitorsGateConfig) -> list[str]:
    """The thresholds of `gate` the round's monitors break, one line each (empty: it
    passes). An unmeasured monitor breaks a minimum (nothing shows it holds) and no maximum
    (nothing was kept to drift)."""
    lines = []
    for field, (monitor, how) in GATES.items():
        limit = getattr(gate, field)
        if limit is None:
            continue
        value = monitors.get(monitor)
        if value is None:
            if how == "min":
                lines.append(f"{monitor} unmeasured in this round, {field} {limit:g} needs it")
        elif how == "min" and value < limit:
            lines.append(f"{monitor} {value:.4g} is below {field} {limit:g}")
        elif how == "max" and value > limit:
            lines.append(f"{monitor} {value:.4g} is above {field} {limit:g}")
        elif how == "drift" and abs(value - 1) > limit:
            lines.append(
                f"{monitor} {value:.4g} is {abs(value - 1):.4g} from 1, over {field} {limit:g}"
            )
    return lines


# -- measuring ------------------------------------------------------------------------


def _measure(lake: Lake, name: str | None, round_: int) -> tuple[dict[str, Any], str | None]:
    """The round's monitors and the evaluation its headroom was read from."""
    selection_id = current_selection_id(lake, name, round_)
    if selection_id is None:
        return {}, None
    rows = selection_outcomes(lake, selection_id)
    unhinted = rows.filter(~pl.col("hinted"))
    per_prompt = _text_monitors(lake, selection_id, unhinted["prompt_id"].n_unique())
    kept = rows.filter(pl.col("kept"))
    lengths = {
        f"{which}_{p}": _percentile(frame["n_tokens"], q)
        for which, frame in (("all", rows), ("kept", kept))
        for p, q in (("p50", 50), ("p90", 90))
    }
    sampled_with = unhinted["model"].drop_nulls().mode().sort()  # the round's sampling model
    model = sampled_with[0] if len(sampled_with) else None
    headroom, headroom_metric, eval_run_id = _headroom(lake, name, round_, model)
    tasks = _task_answers(lake, selection_id).filter(pl.col("excess").is_not_null())
    worst = tasks.sort("excess", "task", descending=[True, False]).head(1)
    measured = {
        "selection_id": selection_id,
        "prompts": rows["prompt_id"].n_unique(),
        "candidates": rows.height,
        **per_prompt,
        **lengths,
        "kept_length_ratio": _ratio(lengths["kept_p50"], lengths["all_p50"]),
        "hinted_share": _ratio(kept["hinted"].sum(), kept.height),
        "headroom": headroom,
        "headroom_metric": headroom_metric,
        "mixed_share": _mixed_share(unhinted),
        "answer_excess": worst["excess"][0] if worst.height else None,
        "answer_excess_at": (
            f"{worst['task'][0]}: {worst['kept_top'][0]}" if worst.height else None
        ),
    }
    columns = ["selection_id", *(column for column, _, _ in ROUND_MONITOR_COLUMNS)]
    return {c: measured.get(c) for c in columns}, eval_run_id


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else round(float(num) / float(den), 4)


def _percentile(values: pl.Series, q: float) -> float | None:
    known = values.drop_nulls().to_numpy()
    return round(float(np.percentile(known, q)), 4) if len(known) else None


def _mixed_share(unhinted: pl.DataFrame) -> float | None:
    """Share of prompts whose unhinted candidates are neither all passed nor all failed."""
    if unhinted.is_empty():
        return None
    per = unhinted.group_by("prompt_id").agg(pl.col("passed").any().alias("some"),
                                             pl.col("passed").all().alias("every"))  # fmt: skip
    return round(float((per["some"] & ~per["every"]).mean()), 4)


def _headroom(
    lake: Lake, name: str | None, round_: int, model: str | None
) -> tuple[float | None, str | None, str | None]:
    """pass@k - pass@1 (largest k), the pass@k it used and the evaluation's run id, from
    the pipeline's latest overall held-out evaluation of the model that sampled the round
    (`model`; unknown: model `round_`)."""
    metrics = latest_overall_eval(lake, name, round_, model)
    values = {}
    for metric, value in zip(metrics["metric"], metrics["value"], strict=True):
        prefix, _, k = metric.partition("@")
        if prefix == "pass" and k.isdigit():
            values[int(k)] = value
    top = max(values, default=1)
    if 1 not in values or top == 1:
        return None, None, None
    return round(values[top] - values[1], 4), f"pass@{top}", metrics["run_id"][0]


def _text_monitors(lake: Lake, selection_id: str, prompts: int) -> dict[str, Any]:
    """distinct_answers, similarity and the top opening and closing sentences with their
    shares (of `prompts`), over the selection's unhinted candidates, a frame at a time."""
    distinct: list[np.ndarray] = []
    similar: list[np.ndarray] = []
    openings: Counter[str] = Counter()
    closings: Counter[str] = Counter()

    def measure(texts: pl.DataFrame) -> None:
        texts = texts.with_columns(pl.col("text").fill_null(""))
        group = texts["prompt_id"].rank("dense").cast(pl.Int64).to_numpy() - 1
        distinct.append(_distinct_answers(texts["text"].to_list(), group))
        similar.append(_similarities(texts["text"].to_list(), group))
        first, last = _ends_per_prompt(texts)
        openings.update(first)
        closings.update(last)

    carried = None  # the last prompt of a frame: the next frame may hold more of it
    for frame in selection_texts(lake, selection_id, TEXT_BATCH_ROWS):
        if carried is not None:
            frame = pl.concat([carried, frame])
        if frame.is_empty():
            continue
        last = pl.col("prompt_id") == frame["prompt_id"][-1]
        carried = frame.filter(last)
        if frame.height > carried.height:
            measure(frame.filter(~last))
    if carried is not None and not carried.is_empty():
        measure(carried)
    opening, opening_share = _top(openings, prompts)
    closing, closing_share = _top(closings, prompts)
    sims = np.concatenate(similar) if similar else np.array([])
    sims = sims[~np.isnan(sims)]
    return {
        "distinct_answers": round(float(np.concatenate(distinct).mean()), 4) if distinct else None,
        "similarity": round(float(sims.mean()), 4) if len(sims) else None,
        "top_opening": opening,
        "top_opening_share": opening_share,
        "top_closing": closing,
        "top_closing_share": closing_share,
    }


def _distinct_answers(texts: list[str], group: np.ndarray) -> np.ndarray:
    """Per group (0..G-1), how many distinct final answers its texts give."""
    answers = []
    for text in texts:
        answer, _ = extract_answer(text)
        answers.append(NO_ANSWER if answer is None else " ".join(answer.split()))
    frame = pl.DataFrame({"group": group, "answer": answers})
    counted = frame.group_by("group").agg(pl.col("answer").n_unique()).sort("group")
    return counted["answer"].to_numpy().astype(float)


def _similarities(texts: list[str], group: np.ndarray) -> np.ndarray:
    """Per group, the mean pairwise MinHash Jaccard estimate of its texts (NaN: fewer than
    two)."""
    return pairwise_similarity(signatures(texts, NUM_PERM, SHINGLE_SIZE), group)


def pairwise_similarity(sigs: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Per group (ids 0..G-1), the mean over pairs of its rows of the share of signature
    slots they agree on (NaN: fewer than two rows), without forming the pairs: c rows
    sharing a value in a slot make c(c-1)/2 agreeing pairs."""
    n, perm = sigs.shape
    group = np.asarray(group, dtype=np.int64)
    size = np.bincount(group).astype(float)
    cell = (group[:, None] * perm + np.arange(perm)[None, :]).astype(np.uint64)
    keys = (cell << np.uint64(32)) | sigs.astype(np.uint64)
    values, counts = np.unique(keys.ravel(), return_counts=True)
    owner = (values >> np.uint64(32)).astype(np.int64) // perm
    agree = np.bincount(owner, weights=counts * (counts - 1) / 2.0, minlength=len(size))
    pairs = size * (size - 1) / 2.0 * perm
    return np.divide(agree, pairs, out=np.full(len(size), np.nan), where=pairs > 0)


def sentences(text: str) -> list[str]:
    """The text's sentences (split after . ! ? and at line breaks), lower-cased, whitespace
    collapsed, at most MAX_SENTENCE characters each."""
    out = []
    for part in _SENTENCE_BREAK.split(text):
        said = " ".join(part.split()).lower()
        if said:
            out.append(said[:MAX_SENTENCE])
    return out


def _ends_per_prompt(texts: pl.DataFrame) -> tuple[list[str], list[str]]:
    """The opening and the closing sentence of each distinct (prompt, sentence) pair: a
    sentence counts once per prompt however many of its texts open (close) with it."""
    first, last = set(), set()
    for prompt_id, text in zip(texts["prompt_id"], texts["text"], strict=True):
        said = sentences(text)
        if said:
            first.add((prompt_id, said[0]))
            last.add((prompt_id, said[-1]))
    return [sentence for _, sentence in first], [sentence for _, sentence in last]


def _top(counts: Counter[str], prompts: int) -> tuple[str | None, float | None]:
    """The sentence most prompts have (ties: the first in sorted order) and that share."""
    if not counts or not prompts:
        return None, None
    sentence, n = min(counts.items(), key=lambda item: (-item[1], item[0]))
    return sentence, round(n / prompts, 4)
