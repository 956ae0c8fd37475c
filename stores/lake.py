"""The lake: one Delta table per table, committed exactly once per batch, queried through
DuckDB views over one snapshot."""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from thresher.ids import content_id
from thresher.stores.delta import DeltaTables
from thresher.stores.schemas import (
    KEYS,
    PASSED_SQL,
    SCHEMAS,
    SOURCE_SQL,
    STUDENT,
    TABLES,
    TEACHER,
    DropReason,
)
from thresher.stores.storage import is_url, local_path, open_storage

DEFAULT_LAKE = "./lake"


def resolve_lake(path: str | os.PathLike | None = None) -> Path | str:
    """The lake's location: `path`, else $THRESHER_LAKE, else ./lake; a local folder as a
    Path (file:// URLs included), any other fsspec URL (s3://bucket/prefix) as a string."""
    location = path or os.environ.get("THRESHER_LAKE") or DEFAULT_LAKE
    return str(location).rstrip("/") if is_url(location) else local_path(location)


def now() -> datetime:
    """The current time in UTC (the lake's timestamp type)."""
    return datetime.now(UTC)


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


# The selection each round of each pipeline reads by default: the one written by the
# pipeline's latest curate run of that round. A run records its selection_id (lakes
# written before selections had ids used the run id); selections written outside any
# run count as a pipeline of their own (NULL), the latest by time. Every status row of a
# run counts (`run_updates`): a run resumed after a verifier's version changed records a
# new selection, and the one it wrote before still belongs to its pipeline.
CURRENT_SELECTIONS_SQL = """
        WITH curated AS (
            SELECT DISTINCT coalesce(selection_id, run_id) AS sid, round, started_at,
                   json_extract_string(config, '$.name') AS pipeline
            FROM run_updates WHERE flow = 'curate'),
        written AS (
            SELECT coalesce(selection_id, run_id) AS sid, round, max(created_at) AS at
            FROM selections GROUP BY ALL),
        latest AS (
            SELECT w.sid, w.round, c.pipeline FROM written w
            LEFT JOIN curated c ON c.sid = w.sid AND c.round = w.round
            QUALIFY row_number() OVER (
                PARTITION BY c.pipeline, w.round
                ORDER BY coalesce(c.started_at, w.at) DESC, w.sid) = 1)
        SELECT l.pipeline, s.* FROM selections s
        JOIN latest l ON coalesce(s.selection_id, s.run_id) = l.sid AND s.round = l.round"""

# Queries over a selections source (the current selections, or a pipeline's, for reports).
PROMPT_DIFFICULTY_SQL = f"""
        SELECT s.round, s.prompt_id, count(*) AS candidates,
               count(*) FILTER (WHERE {PASSED_SQL}) AS passed,
               avg(({PASSED_SQL})::INT) AS pass_rate,
               CASE WHEN bool_and({PASSED_SQL}) THEN 'all_pass'
                    WHEN bool_and(NOT ({PASSED_SQL})) THEN 'all_fail'
                    ELSE 'mixed' END AS kind
        FROM {{selections}} s JOIN candidates c USING (candidate_id)
        WHERE NOT coalesce(c.hinted, false)
        GROUP BY s.round, s.prompt_id"""
# Per pipeline and prompt, over the rounds it was sampled in (before round `{before}`):
# the latest of them and how many of them in a row, up to that one, had no passing
# unhinted candidate. A prompt that failed `difficulty.retire_after` rounds in a row is
# retired: later rounds do not sample it.
FAIL_STREAKS_SQL = f"""
        WITH per AS (
            SELECT s.pipeline, s.round, s.prompt_id, bool_or({PASSED_SQL}) AS any_pass
            FROM current_selections s JOIN candidates c USING (candidate_id)
            WHERE NOT coalesce(c.hinted, false) AND s.round < {{before}}
            GROUP BY ALL),
        last AS (
            SELECT pipeline, prompt_id, max(round) AS last_round,
                   coalesce(max(round) FILTER (WHERE any_pass), -1) AS last_pass
            FROM per GROUP BY ALL)
        SELECT p.pipeline, p.prompt_id, l.last_round,
               count(*) FILTER (WHERE p.round > l.last_pass) AS failing_rounds
        FROM per p JOIN last l USING (pipeline, prompt_id)
        GROUP BY ALL"""
# Prompts each pipeline's latest curate run retired (`difficulty.retire_after`).
RETIRED_PROMPTS_SQL = """
        WITH cfg AS (
            SELECT json_extract_string(config, '$.name') AS pipeline,
                   json_extract(config, '$.difficulty.retire_after')::INT AS retire_after
            FROM run_updates WHERE flow = 'curate'
            QUALIFY row_number() OVER (
                PARTITION BY json_extract_string(config, '$.name')
                ORDER BY started_at DESC, updated_at DESC) = 1)
        SELECT f.pipeline, f.prompt_id, f.failing_rounds, f.last_round AS last_sampled_round,
               c.retire_after
        FROM fail_streaks f JOIN cfg c USING (pipeline)
        WHERE c.retire_after IS NOT NULL AND f.failing_rounds >= c.retire_after
        ORDER BY f.pipeline, f.prompt_id"""
# over a `prompt_difficulty` source
DIFFICULTY_BY_ROUND_SQL = """
        SELECT round, count(*) AS prompts,
               count(*) FILTER (WHERE kind = 'all_pass') AS all_pass,
               count(*) FILTER (WHERE kind = 'all_fail') AS all_fail,
               count(*) FILTER (WHERE kind = 'mixed') AS mixed,
               round(avg(pass_rate), 4) AS mean_pass_rate
        FROM {difficulty} GROUP BY round ORDER BY round"""
# The selection funnel's counts over selections `s` (with their candidates `c`): how many
# passed the rule, were dropped at each later stage, and were kept. The `round_funnel` view
# and a run's summary (queries.run_summary) both count with these.
FUNNEL_COUNTS_SQL = f"""
               count(*) FILTER (WHERE {PASSED_SQL}) AS passed,
               count(*) FILTER (WHERE {DropReason.truncated.sql()}) AS truncated_dropped,
               count(*) FILTER (WHERE {DropReason.copies_hint.sql()}) AS copies_hint,
               count(*) FILTER (WHERE {DropReason.too_easy.sql()}) AS too_easy,
               count(*) FILTER (WHERE {DropReason.contaminated.sql()}) AS contaminated,
               count(*) FILTER (WHERE {DropReason.suspect_reference.sql()}) AS suspect_reference,
               count(*) FILTER (WHERE {DropReason.duplicate_of.sql()}) AS duplicates,
               count(*) FILTER (WHERE {DropReason.capped.sql()}) AS capped,
               count(*) FILTER (WHERE {DropReason.hint_share.sql()}) AS hint_share,
               count(*) FILTER (WHERE {DropReason.answer_share.sql()}) AS answer_share,
               count(*) FILTER (WHERE {DropReason.teacher_share.sql()}) AS teacher_share,
               count(*) FILTER (WHERE s.kept) AS kept"""
ROUND_FUNNEL_SQL = f"""
        SELECT s.round, count(*) AS sampled,
               count(*) FILTER (WHERE coalesce(c.hinted, false)) AS hinted,{FUNNEL_COUNTS_SQL},
               count(*) FILTER (WHERE s.kept AND coalesce(c.hinted, false)) AS kept_hinted,
               count(*) FILTER (WHERE {SOURCE_SQL} LIKE '{TEACHER}%') AS taught,
               count(*) FILTER (WHERE s.kept AND {SOURCE_SQL} LIKE '{TEACHER}%') AS kept_teacher,
               coalesce(sum(c.n_tokens) FILTER (WHERE s.kept), 0)::BIGINT AS kept_tokens,
               coalesce(sum(c.n_tokens) FILTER (
                   WHERE s.kept AND {SOURCE_SQL} LIKE '{TEACHER}%'), 0)::BIGINT
                   AS kept_teacher_tokens
        FROM {{selections}} s JOIN candidates c USING (candidate_id)
        GROUP BY s.round ORDER BY s.round"""

# Each candidate's latest verdict from each verifier, whatever its options.
LATEST_VERDICTS_SQL = """
    SELECT * FROM verdicts QUALIFY row_number() OVER (
        PARTITION BY candidate_id, verifier ORDER BY created_at DESC) = 1"""

# CTEs: the current selections' candidates with the verdict of each verifier their
# pipeline's run used: the one under the options digest the run read (its summary's
# verifier_digests), else (runs that did not record them) the latest of each verifier the
# run's config names, else (a selection written outside a run) every verifier's latest.
SELECTION_VERDICTS_SQL = f"""
latest AS ({LATEST_VERDICTS_SQL}),
used AS (
    SELECT DISTINCT selection_id, verifier,
           json_extract_string(summary, '$.verifier_digests."' || verifier || '"') AS digest
    FROM (SELECT selection_id, summary, unnest(list_concat(
              json_extract_string(config, '$.verify.verifiers[*]'),
              coalesce(json_extract_string(config, '$.verify.by_task.*[*]'), []))) AS verifier
          FROM runs WHERE flow = 'curate' AND selection_id IS NOT NULL)),
exact AS (SELECT DISTINCT selection_id FROM used WHERE digest IS NOT NULL),
sel_verdicts AS (
    SELECT s.pipeline, s.round, s.selection_id, v.candidate_id, v.verifier, v.passed,
           v.reason
    FROM current_selections s JOIN used u ON u.selection_id = s.selection_id
    JOIN verdicts v ON v.candidate_id = s.candidate_id AND v.verifier = u.verifier
                   AND v.options_digest = u.digest
    UNION ALL
    SELECT s.pipeline, s.round, s.selection_id, v.candidate_id, v.verifier, v.passed,
           v.reason
    FROM current_selections s JOIN latest v USING (candidate_id)
    WHERE s.selection_id NOT IN (SELECT selection_id FROM exact)
      AND (v.verifier IN (SELECT u.verifier FROM used u WHERE u.selection_id = s.selection_id)
           OR NOT EXISTS (SELECT 1 FROM used u WHERE u.selection_id = s.selection_id)))"""

# Per pipeline, round and verifier (and `rule`, the selection rule): labelled candidates
# and how the verdicts stand against the labels (a candidate's label is its latest).
VERIFIER_QUALITY_SQL = f"""
WITH {SELECTION_VERDICTS_SQL},
lab AS (
    SELECT candidate_id, label = 'correct' AS correct FROM labels
    QUALIFY row_number() OVER (
        PARTITION BY candidate_id ORDER BY labelled_at DESC, imported_at DESC, label_id) = 1),
judged AS (
    SELECT v.pipeline, v.round, v.verifier, v.passed, lab.correct
    FROM sel_verdicts v JOIN lab USING (candidate_id)
    UNION ALL
    SELECT s.pipeline, s.round, 'rule' AS verifier,
           s.drop_reason IS DISTINCT FROM 'failed' AS passed, lab.correct
    FROM current_selections s JOIN lab USING (candidate_id))
SELECT pipeline, round, verifier, count(*) AS labelled,
       count(*) FILTER (WHERE passed AND correct) AS true_pass,
       count(*) FILTER (WHERE passed AND NOT correct) AS false_pass,
       count(*) FILTER (WHERE NOT passed AND NOT correct) AS true_fail,
       count(*) FILTER (WHERE NOT passed AND correct) AS false_fail,
       round(false_pass / nullif(false_pass + true_fail, 0), 4) AS false_pass_rate,
       round(false_fail / nullif(false_fail + true_pass, 0), 4) AS false_fail_rate,
       round(true_pass / nullif(true_pass + false_pass, 0), 4) AS precision,
       round(true_pass / nullif(true_pass + false_fail, 0), 4) AS recall
FROM judged GROUP BY pipeline, round, verifier
ORDER BY pipeline, round, verifier = 'rule', verifier"""

# Per pipeline, round and pair of its verifiers: how often they disagree on the same
# candidates (no labels needed).
VERIFIER_DISAGREEMENT_SQL = f"""
WITH {SELECTION_VERDICTS_SQL}
SELECT a.pipeline, a.round, a.verifier AS verifier_a, b.verifier AS verifier_b,
       count(*) AS candidates,
       count(*) FILTER (WHERE a.passed <> b.passed) AS disagree,
       round(avg((a.passed <> b.passed)::INT), 4) AS disagreement_rate
FROM sel_verdicts a JOIN sel_verdicts b ON a.candidate_id = b.candidate_id
    AND a.round = b.round AND a.pipeline IS NOT DISTINCT FROM b.pipeline
    AND a.verifier < b.verifier
GROUP BY ALL ORDER BY a.pipeline, a.round, verifier_a, verifier_b"""

# The `round_monitors` view's columns after pipeline, round and selection_id: (column,
# the `monitors` metric it comes from, what of that row it shows).
ROUND_MONITOR_COLUMNS = (
    ("prompts", "prompts", "count"),
    ("candidates", "candidates", "count"),
    ("distinct_answers", "distinct_answers", "value"),
    ("similarity", "similarity", "value"),
    ("top_opening", "top_opening_share", "detail"),
    ("top_opening_share", "top_opening_share", "value"),
    ("top_closing", "top_closing_share", "detail"),
    ("top_closing_share", "top_closing_share", "value"),
    ("all_p50", "all_p50", "value"),
    ("all_p90", "all_p90", "value"),
    ("kept_p50", "kept_p50", "value"),
    ("kept_p90", "kept_p90", "value"),
    ("kept_length_ratio", "kept_length_ratio", "value"),
    ("hinted_share", "hinted_share", "value"),
    ("headroom", "headroom", "value"),
    ("headroom_metric", "headroom", "detail"),
    ("mixed_share", "mixed_share", "value"),
    ("answer_excess", "answer_excess", "value"),
    ("answer_excess_at", "answer_excess", "detail"),
)
_SHOWN = {"count": "({})::BIGINT", "value": "{}", "detail": "{}"}
_MONITOR_COLUMNS_SQL = ",\n               ".join(
    _SHOWN[how].format(
        f"max({'detail' if how == 'detail' else 'value'}) FILTER (WHERE metric = '{metric}')"
    )
    + f" AS {column}"
    for column, metric, how in ROUND_MONITOR_COLUMNS
)
# One row per pipeline and curated round: the monitors of its current selection (of each
# metric the latest row: a headroom read again from a newer evaluation replaces the older).
ROUND_MONITORS_SQL = f"""
        WITH sel AS (
            SELECT DISTINCT pipeline, round, coalesce(selection_id, run_id) AS selection_id
            FROM current_selections),
        latest AS (
            SELECT m.selection_id, m.round, m.metric, m.value, m.detail
            FROM monitors m JOIN sel USING (selection_id, round)
            QUALIFY row_number() OVER (
                PARTITION BY m.selection_id, m.round, m.metric
                ORDER BY m.created_at DESC, m.eval_run_id DESC NULLS LAST) = 1)
        SELECT s.pipeline, s.round, s.selection_id,
               {_MONITOR_COLUMNS_SQL}
        FROM sel s JOIN latest l USING (selection_id, round)
        GROUP BY s.pipeline, s.round, s.selection_id ORDER BY s.pipeline, s.round"""

# Training mixtures: each train run's summary lists its sources (trainers/mix.py).
TRAIN_MIX_SQL = """
SELECT run_id, round, pipeline, status, i AS position,
       json_extract_string(m, '$.source') AS source,
       json_extract(m, '$.weight')::DOUBLE AS weight,
       json_extract(m, '$.share')::DOUBLE AS share,
       json_extract(m, '$.available')::BIGINT AS available,
       json_extract(m, '$.rows')::BIGINT AS rows,
       json_extract(m, '$.row_share')::DOUBLE AS row_share,
       json_extract(m, '$.repeated')::BIGINT AS repeated,
       json_extract_string(m, '$.on_short') AS on_short,
       json_extract(m, '$.no_response')::BIGINT AS no_response,
       json_extract(m, '$.contaminated')::BIGINT AS contaminated
FROM (SELECT run_id, round, status, started_at,
             json_extract_string(config, '$.name') AS pipeline,
             unnest(json_extract(summary, '$.mix[*]')) AS m,
             generate_subscripts(json_extract(summary, '$.mix[*]'), 1) AS i
      FROM runs WHERE flow = 'train')
ORDER BY pipeline, round, started_at, i"""

# Views built on the base tables: the everyday questions, answered in SQL.
WEAK_KILL_RATE = 0.8  # the weak_prompts view's line (select.min_test_strength sets its own)

# One row per tool call of a candidate that ran code (`sampling.tools`): its code, what
# came back, how (ok, error, timeout) and how long it took; each output follows its code.
TOOL_CALLS_SQL = """
SELECT candidate_id, prompt_id, run_id, round, model, call,
       json_extract_string(seg, '$.code') AS code,
       json_extract_string(out, '$.output') AS output,
       json_extract_string(out, '$.status') AS status,
       json_extract(out, '$.ms')::DOUBLE AS ms
FROM (
    SELECT c.*, s.seg, s.i,
           lead(s.seg) OVER (PARTITION BY c.candidate_id ORDER BY s.i) AS out,
           count(*) FILTER (WHERE json_extract_string(s.seg, '$.kind') = 'code')
               OVER (PARTITION BY c.candidate_id ORDER BY s.i) AS call
    FROM (SELECT candidate_id, prompt_id, run_id, round, model, segments FROM candidates
          WHERE segments IS NOT NULL) c,
         LATERAL (SELECT unnest(json_extract(c.segments, '$[*]')) AS seg,
                         generate_subscripts(json_extract(c.segments, '$[*]'), 1) AS i) s)
WHERE json_extract_string(seg, '$.kind') = 'code'
  AND json_extract_string(out, '$.kind') = 'output'
ORDER BY candidate_id, call"""

# A prompt's latest label of its reference (`thresher audit import`).
CURRENT_REFERENCE_LABELS_SQL = """
        SELECT * FROM reference_labels
        QUALIFY row_number() OVER (PARTITION BY prompt_id
                                   ORDER BY labelled_at DESC, imported_at DESC, label_id) = 1"""

DERIVED_VIEWS = {
    "current_selections": CURRENT_SELECTIONS_SQL,
    "current_reference_labels": CURRENT_REFERENCE_LABELS_SQL,
    # the answer verifiers judge a prompt by: its reference, or the right answer of its
    # latest label when that says the reference is wrong
    "prompt_references": """
        SELECT p.prompt_id, p.answer AS reference,
               CASE WHEN l.label = 'wrong' THEN l.answer ELSE p.answer END AS answer,
               l.label
        FROM prompts p LEFT JOIN current_reference_labels l USING (prompt_id)""",
    # reworded evaluation items a selection found (selection.select.Contaminated): the two
    # prompts, their references, how alike, what agreed, and the candidates dropped for it
    "contamination": f"""
        SELECT e.selection_id, e.round, e.prompt_id, e.eval_prompt_id, e.similarity, e.agreed,
               coalesce(p.prompt, p.messages) AS prompt, coalesce(q.prompt, q.messages)
                   AS eval_prompt, p.answer AS reference, q.answer AS eval_reference,
               (SELECT count(*) FROM selections s
                WHERE s.selection_id = e.selection_id AND s.prompt_id = e.prompt_id
                  AND {DropReason.contaminated.sql()}) AS dropped
        FROM evidence e LEFT JOIN prompts p ON p.prompt_id = e.prompt_id
        LEFT JOIN prompts q ON q.prompt_id = e.eval_prompt_id
        WHERE e.kind = 'reworded'""",
    # prompts whose samples agree on another answer than their reference
    # (selection.select.SuspectReference), the latest flag of each, and any label since
    "suspect_references": f"""
        SELECT e.prompt_id, p.dataset, p.task, coalesce(p.prompt, p.messages) AS prompt,
               e.reference, e.agreed AS agreed_answer, e.share, e.reference_share, e.samples,
               e.models, e.round, e.selection_id,
               (SELECT count(*) FROM selections s
                WHERE s.selection_id = e.selection_id AND s.prompt_id = e.prompt_id
                  AND {DropReason.suspect_reference.sql()}) AS dropped,
               l.label, l.answer AS labelled_answer, l.who AS labelled_by
        FROM evidence e JOIN prompts p USING (prompt_id)
        LEFT JOIN current_reference_labels l USING (prompt_id)
        WHERE e.kind = 'suspect_reference'
        QUALIFY row_number() OVER (PARTITION BY e.prompt_id
                                   ORDER BY e.round DESC, e.created_at DESC) = 1""",
    # One row per candidate: passed when it has verdicts and every verifier passed it
    # (each verifier's latest verdict, whatever its options).
    "candidate_outcomes": f"""
        SELECT c.candidate_id, c.prompt_id, c.round, c.model, c.run_id,
               count(v.verifier) AS n_verdicts,
               coalesce(bool_and(v.passed), false) AND count(v.verifier) > 0 AS passed
        FROM candidates c LEFT JOIN ({LATEST_VERDICTS_SQL}) v USING (candidate_id)
        GROUP BY ALL""",
    "pass_rate": """
        SELECT prompt_id, round, count(*) AS candidates,
               count(*) FILTER (WHERE passed) AS passed,
               avg(passed::INT) AS pass_rate
        FROM candidate_outcomes GROUP BY prompt_id, round""",
    # Every prompt's pass rate per model, from each round's sampling and each evaluation
    # (hinted samples left out): the difficulty history an RL hand-off reads
    "prompt_pass_rates": """
        SELECT c.prompt_id, any_value(p.task) AS task, any_value(p.dataset) AS dataset,
               any_value(p.split) AS split, c.model, c.round, c.run_id,
               any_value(r.flow) AS source, count(*) AS samples,
               count(*) FILTER (WHERE o.passed) AS passed, avg(o.passed::INT) AS pass_rate
        FROM candidates c
        JOIN candidate_outcomes o ON o.candidate_id = c.candidate_id
        JOIN prompts p ON p.prompt_id = c.prompt_id
        LEFT JOIN runs r ON r.run_id = c.run_id
        WHERE NOT coalesce(c.hinted, false)
        GROUP BY c.prompt_id, c.model, c.round, c.run_id""",
    # Per pipeline, curated round, prompt and source (the student, each teacher; hinted
    # samples left out): the model that sampled it and how often the round's rule held.
    "difficulty_profiles": f"""
        SELECT s.pipeline, s.round, s.prompt_id, any_value(p.task) AS task,
               {SOURCE_SQL} AS source, any_value(c.model) AS model, count(*) AS samples,
               count(*) FILTER (WHERE {PASSED_SQL}) AS passed,
               avg(({PASSED_SQL})::INT) AS pass_rate
        FROM current_selections s JOIN candidates c USING (candidate_id)
        LEFT JOIN prompts p ON p.prompt_id = s.prompt_id
        WHERE {SOURCE_SQL} = '{STUDENT}' OR {SOURCE_SQL} LIKE '{TEACHER}%'
        GROUP BY ALL""",
    # Per pipeline, curated round and prompt: solved (the student's own samples pass),
    # teachable (a teacher's do, the student's do not) or out_of_reach (nobody's do).
    "prompt_classes": f"""
        SELECT pipeline, round, prompt_id, any_value(task) AS task,
               max(pass_rate) FILTER (WHERE source = '{STUDENT}') AS student_pass_rate,
               max(pass_rate) FILTER (WHERE source LIKE '{TEACHER}%') AS teacher_pass_rate,
               CASE WHEN coalesce(student_pass_rate, 0) > 0 THEN 'solved'
                    WHEN coalesce(teacher_pass_rate, 0) > 0 THEN 'teachable'
                    ELSE 'out_of_reach' END AS class
        FROM difficulty_profiles GROUP BY pipeline, round, prompt_id""",
    "tool_calls": TOOL_CALLS_SQL,
    # per candidate that could call the tool: calls made, errors, time in the tool, and
    # whether it passed (which prompts the tool helped: SQL over this and pass_rate)
    "tool_use": """
        SELECT c.candidate_id, c.prompt_id, c.round, c.model, c.finish_reason,
               count(t.call) AS calls,
               count(t.call) FILTER (WHERE t.status <> 'ok') AS tool_errors,
               coalesce(sum(t.ms), 0) AS tool_ms, o.passed
        FROM candidates c LEFT JOIN tool_calls t USING (candidate_id)
        JOIN candidate_outcomes o USING (candidate_id)
        WHERE c.segments IS NOT NULL GROUP BY ALL""",
    "funnel": """
        SELECT round, coalesce(split_part(drop_reason, ':', 1), 'kept') AS outcome,
               count(*) AS candidates
        FROM current_selections GROUP BY ALL ORDER BY round, outcome""",
    # passed = the selection rule held (evaluation runs select nothing)
    "yield_by_round": f"""
        SELECT round, count(DISTINCT prompt_id) AS prompts, count(*) AS candidates,
               count(*) FILTER (WHERE {PASSED_SQL}) AS passed,
               round(avg(({PASSED_SQL})::INT), 4) AS pass_rate,
               count(*) FILTER (WHERE kept) AS kept,
               count(DISTINCT prompt_id) FILTER (WHERE kept) AS prompts_with_kept
        FROM current_selections GROUP BY round ORDER BY round""",
    # Per curated round and prompt, from unhinted candidates: how often the round's model
    # solved it (passed = the selection rule held), and whether it was all-pass / all-fail.
    "prompt_difficulty": PROMPT_DIFFICULTY_SQL.format(selections="current_selections"),
    # All-pass and all-fail prompts carry no signal about pass-rate changes: count them.
    "difficulty_by_round": DIFFICULTY_BY_ROUND_SQL.format(difficulty="prompt_difficulty"),
    # Per pipeline and prompt: rounds in a row, up to the latest it was sampled in, without
    # a passing candidate; and the prompts retired for it (difficulty.retire_after).
    "fail_streaks": FAIL_STREAKS_SQL.format(before="9223372036854775807"),
    "retired_prompts": RETIRED_PROMPTS_SQL,
    # One row per curated round: how many candidates each stage let through.
    "round_funnel": ROUND_FUNNEL_SQL.format(selections="current_selections"),
    # Labelled audits against verdicts, per pipeline, round and verifier (`rule`: the
    # selection rule); and how often verifiers disagree on the same candidates.
    "verifier_quality": VERIFIER_QUALITY_SQL,
    "verifier_disagreement": VERIFIER_DISAGREEMENT_SQL,
    # One row per source of each training run's mixture (train.mix, from the run's summary);
    # round is the runs row's: the model the run trained.
    "train_mix": TRAIN_MIX_SQL,
    # Per pipeline and curated round: its monitors (distinct answers, similarity, repeated
    # openings and closings, kept-versus-all length, hinted share, headroom, mixed share).
    "round_monitors": ROUND_MONITORS_SQL,
    # Per pipeline, curated round and task: the top final answer's share among the model's
    # answers, the kept ones and the references, and the distinct answers (monitors rows
    # named task:<task>:<monitor>).
    "task_monitors": """
        SELECT DISTINCT cs.pipeline, m.round, split_part(m.metric, ':', 2) AS task,
               split_part(m.metric, ':', 3) AS monitor, m.value, m.detail
        FROM monitors m
        JOIN (SELECT DISTINCT pipeline, round, coalesce(selection_id, run_id) AS selection_id
              FROM current_selections) cs USING (selection_id, round)
        WHERE m.metric LIKE 'task:%'
        ORDER BY cs.pipeline, m.round, task, monitor""",
    # Each prompt's latest test-strength audit, per suite; the weak ones (a reference that
    # fails its tests, or a kill rate under 0.8); and per dataset and suite, the spread.
    "prompt_strength": """
        SELECT * EXCLUDE (tests) FROM test_strength
        QUALIFY row_number() OVER (
            PARTITION BY prompt_id, suite ORDER BY created_at DESC, audit_id) = 1""",
    "weak_prompts": f"""
        SELECT dataset, prompt_id, suite, reference_passes, kill_rate, mutants, killed,
               equivalent, survivors, note
        FROM prompt_strength
        WHERE NOT reference_passes OR kill_rate < {WEAK_KILL_RATE}
        ORDER BY dataset, suite, kill_rate NULLS FIRST, prompt_id""",
    "test_strength_summary": f"""
        SELECT dataset, suite, count(*) AS prompts,
               count(*) FILTER (WHERE NOT reference_passes) AS reference_fails,
               sum(mutants) AS mutants, sum(killed) AS killed, sum(equivalent) AS equivalent,
               round(sum(killed) / nullif(sum(mutants) - sum(equivalent), 0), 4) AS kill_rate,
               round(median(kill_rate), 4) AS median_kill_rate,
               round(quantile_cont(kill_rate, 0.1), 4) AS p10_kill_rate,
               count(*) FILTER (WHERE kill_rate < {WEAK_KILL_RATE}) AS weak,
               sum(kept) AS tests_added
        FROM prompt_strength GROUP BY dataset, suite ORDER BY dataset, suite""",
}


class _Views:
    """A lake's DuckDB database in this process and the table versions its views read."""

    def __init__(self, db: duckdb.DuckDBPyConnection):
        self.db = db
        self.versions: dict[str, int] = {}
        self.derived = False


_DATABASES: dict[str, _Views] = {}
_DATABASES_LOCK = threading.RLock()
_TABLES: dict[tuple[int, str], DeltaTables] = {}
_INITIALIZED: set[tuple[int, str]] = set()


def _delta_tables(storage: Any) -> DeltaTables:
    """The lake's Delta tables, opened once per process."""
    key = (os.getpid(), storage.location)
    with _DATABASES_LOCK:
        if key not in _TABLES:
            _TABLES[key] = DeltaTables(storage)
        return _TABLES[key]


@atexit.register
def _close_databases() -> None:
    # DuckDB's bindings report leaks when connections outlive interpreter shutdown
    with _DATABASES_LOCK:
        for state in _DATABASES.values():
            state.db.close()
        _DATABASES.clear()


def _key_tuples(data: pa.Table, keys: tuple[str, ...]) -> list[tuple]:
    return list(zip(*(data.column(k).to_pylist() for k in keys), strict=True))


class LegacyLake(RuntimeError):
    """The lake was written by an older thresher (plain Parquet folders): migrate it."""


# Tables whose rows are few (prompts are few next to their candidates): an append also
# skips rows whose key is in the table already. Other tables skip a batch by its id.
ROW_DEDUP = frozenset(
    {
        "prompts",
        "rejects",
        "train_metrics",
        "evals",
        "labels",
        "monitors",
        "test_strength",
        "reference_labels",
    }
)
SCHEMA_DIR = "_schemas"


class Lake:
    """A lake rooted at one folder or URL; every table is a Delta table.

    `root` is the folder (a Path) of a local lake, the URL (a string) of a remote one
    (s3://bucket/prefix or any fsspec URL); `Lake(lake.root)` opens the same lake.
    `as_of` ({table: version}) opens it read-only as it was at those versions.
    """

    def __init__(
        self,
        root: str | os.PathLike | None = None,
        create: bool = True,
        as_of: dict[str, int] | None = None,
    ):
        self.root = resolve_lake(root)
        self.storage = open_storage(self.root)
        self.tables = _delta_tables(self.storage)
        self.as_of = as_of
        if create and as_of is None:
            self.init()

    @property
    def location(self) -> str:
        """Where the lake is, for messages and as a key: an absolute folder path or a URL."""
        return self.storage.location

    @property
    def remote(self) -> bool:
        """True when the lake is not a local folder (its files are not on this disk)."""
        return self.storage.remote

    def local_dir(self, *parts: str) -> Path:
        """A folder on this machine for what must live on a disk (models, reports):
        <lake>/<parts> for a local lake, ./<parts> (in the current directory) for a remote one."""
        return Path(*parts).absolute() if self.remote else Path(self.root, *parts)

    def schema_file(self, table: str) -> str:
        """An empty Parquet file with the table's current schema (every view reads it, so
        columns added since older files were written read as NULL)."""
        return self.storage.join(SCHEMA_DIR, f"{table}.parquet")

    def legacy(self) -> list[str]:
        """The tables still in the plain-Parquet layout of older thresher versions."""
        return [
            t
            for t in TABLES
            if self.storage.exists(self.storage.join(t, "_schema.parquet"))
            and not self.tables.exists(t)
        ]

    def init(self, again: bool = False) -> None:
        """Create every table missing from the lake, and add columns added since (once per
        process, unless `again`)."""
        key = (os.getpid(), self.location)
        if key in _INITIALIZED and not again:
            return
        old = self.legacy()
        if old:
            raise LegacyLake(
                f"the lake at {self.location} was written by an older thresher (tables "
                f"{', '.join(old)} are plain Parquet folders): run `thresher migrate "
                f"--lake {self.location}` to convert it into Delta tables"
            )
        for table in TABLES:
            self.storage.ensure_schema(self.schema_file(table), SCHEMAS[table])
            self.tables.create(table, SCHEMAS[table])
        _INITIALIZED.add(key)

    def exists(self) -> bool:
        """True when the location holds a lake (one of an older layout counts)."""
        return self.tables.exists("prompts") or bool(self.legacy())

    def versions(self) -> dict[str, int]:
        """Each table's latest version."""
        return {t: self.tables.version(t) for t in TABLES}

    def read_versions(self) -> dict[str, int]:
        """The table versions the latest query in this process read (a snapshot)."""
        state = _DATABASES.get(self.location)
        return dict(state.versions) if state else {}

    # -- writing -------------------------------------------------------------

    def append(
        self, table: str, rows: pa.Table | Sequence[dict] | Any, batch_id: str | None = None
    ) -> int:
        """Append rows (list of dicts, Arrow or polars) as one commit; returns rows written.

        The commit is identified by `batch_id` (by default a digest of the rows' keys):
        a batch committed before is skipped by a look at the table's log, so a retried
        or re-run step adds nothing. Rows repeating a key within `rows` are dropped;
        small tables (ROW_DEDUP) also drop rows whose key is already in the table.
        """
        if self.as_of is not None:
            raise PermissionError("a lake opened as of an earlier version is read-only")
        data = self._to_arrow(table, rows)
        keys = KEYS[table]
        if keys and data.num_rows:
            data = self._first_of_keys(data, keys)
            if table in ROW_DEDUP:
                data = self._drop_known(table, data, keys)
        if data.num_rows == 0:
            return 0
        if batch_id is None and keys:
            batch_id = content_id(table, sorted(map(repr, _key_tuples(data, keys))))
        if batch_id is not None:
            batch_id = f"{table}:{batch_id}"
        return data.num_rows if self.tables.commit(table, data, batch_id) else 0

    def _to_arrow(self, table: str, rows: Any) -> pa.Table:
        schema = SCHEMAS[table]
        if isinstance(rows, pa.Table):
            data = rows
        elif hasattr(rows, "to_arrow"):  # polars DataFrame
            data = rows.to_arrow()
        else:
            rows = list(rows)
            data = pa.Table.from_pylist(rows, schema=schema)
        missing = [f.name for f in schema if f.name not in data.column_names]
        for name in missing:
            data = data.append_column(name, pa.nulls(data.num_rows, schema.field(name).type))
        return data.select(schema.names).cast(schema)

    @staticmethod
    def _first_of_keys(data: pa.Table, keys: tuple[str, ...]) -> pa.Table:
        """The rows of `data` without those repeating an earlier row's key."""
        seen: set[tuple] = set()
        take = []
        for i, key in enumerate(_key_tuples(data, keys)):
            if key not in seen:
                seen.add(key)
                take.append(i)
        return data if len(take) == data.num_rows else data.take(pa.array(take, pa.int64()))

    def _drop_known(self, table: str, data: pa.Table, keys: tuple[str, ...]) -> pa.Table:
        con = self.connect()
        try:
            con.register(
                "incoming",
                data.select(list(keys)).append_column(
                    "_pos", pa.array(range(data.num_rows), pa.int64())
                ),
            )
            on = " AND ".join(f"i.{k} IS NOT DISTINCT FROM e.{k}" for k in keys)
            keep = con.sql(
                f"""SELECT i._pos FROM incoming i WHERE NOT EXISTS (
                        SELECT 1 FROM {table} e WHERE {on}) ORDER BY i._pos"""
            ).fetchall()
        finally:
            con.close()
        return data.take(pa.array([r[0] for r in keep], pa.int64()))

    # -- reading -------------------------------------------------------------

    def check_readable(self) -> None:
        """Raise now, not at the first query, for a missing lake (FileNotFoundError) or one
        of an older layout."""
        self.connect().close()

    def connect(self) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection with a view per table and the derived views; close it after use.

        Each call reads every table's latest version from its Delta log; a table's view
        lists exactly that snapshot's files (scanned by DuckDB itself), so a query never
        sees half a commit, and sees every commit made before the call, by any process.
        The database is kept per lake and process; each call returns a cheap cursor.
        """
        if self.as_of is not None:
            return self._connect_as_of()
        key = self.location
        self.storage.refresh()
        with _DATABASES_LOCK:
            state = _DATABASES.get(key)
            if state is None:
                if not self.exists():
                    raise FileNotFoundError(
                        f"no lake at {self.root} (run `thresher ingest` first, or pass --lake)"
                    )
                self.init(again=True)  # tables added since the lake was made, schema files
                db = duckdb.connect()
                self.storage.attach(db)
                state = _DATABASES[key] = _Views(db)
            for table in TABLES:
                if state.versions.get(table) != self.tables.version(table):
                    version, files = self.tables.files(table, refresh=False)  # just refreshed
                    state.db.execute(self._view_sql(table, files))
                    state.versions[table] = version
            if not state.derived:
                for name, body in DERIVED_VIEWS.items():
                    state.db.execute(f"CREATE VIEW {name} AS {body}")
                state.derived = True
            return state.db.cursor()

    def _connect_as_of(self) -> duckdb.DuckDBPyConnection:
        db = duckdb.connect()
        self.storage.attach(db)
        for table in TABLES:
            version = self.as_of.get(table)
            if version is None:
                files = self.tables.files(table)[1]
            elif version < 0:
                files = []  # the table did not exist yet
            else:
                files = self.tables.files_at(table, version)
            db.execute(self._view_sql(table, files))
        for name, body in DERIVED_VIEWS.items():
            db.execute(f"CREATE VIEW {name} AS {body}")
        return db

    def _view_sql(self, table: str, files: list[str]) -> str:
        listed = ", ".join(_sql_str(f) for f in [self.schema_file(table), *files])
        source = f"read_parquet([{listed}], union_by_name = true)"
        if table == "runs":  # append-only status updates: show the latest per run
            latest = (
                f"(SELECT * FROM {source} QUALIFY row_number() OVER "
                "(PARTITION BY run_id ORDER BY updated_at DESC) = 1)"
            )
            return (
                f"CREATE OR REPLACE VIEW run_updates AS SELECT * FROM {source};\n"
                f"CREATE OR REPLACE VIEW runs AS SELECT * FROM {latest}"
            )
        return f"CREATE OR REPLACE VIEW {table} AS SELECT * FROM {source}"

    def query(self, sql: str, params: Iterable[Any] | dict[str, Any] | None = None):
        """Run SQL over the lake's views and return a polars DataFrame ($name params
        from a dict, ? params from a sequence)."""
        con = self.connect()
        try:
            if params is not None and not isinstance(params, dict):
                params = list(params)
            return con.sql(sql, params=params or None).pl()
        finally:
            con.close()

    def count(self, table: str) -> int:
        """Rows in `table`."""
        return int(self.query(f"SELECT count(*) AS n FROM {table}")["n"][0])
