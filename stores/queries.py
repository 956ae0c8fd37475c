"""The queries the flows need: what to sample, what to verify, what a run produced.

Stages find their inputs by identity (candidate ids, a verifier's options digest, a
selection id), never by the run that happened to write them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa

from thresher.config import SEALED
from thresher.rules import rule_sql
from thresher.stores.lake import FAIL_STREAKS_SQL, FUNNEL_COUNTS_SQL, PROMPT_DIFFICULTY_SQL, Lake
from thresher.stores.schemas import PASSED_SQL, SOURCE_SQL, STUDENT, TEACHER

if TYPE_CHECKING:
    import duckdb
    import polars as pl

# A selection's rows (lakes written before selections had ids used the run id).
_OF_SELECTION = "(s.selection_id = $sid OR (s.selection_id IS NULL AND s.run_id = $sid))"


class SealedSplit(ValueError):
    """A read of the test split by anything but a final evaluation."""


def load_prompts(
    lake: Lake,
    dataset: str,
    split: str,
    limit: int | None = None,
    task: str | None = None,
    open_test: bool = False,
) -> pl.DataFrame:
    """Prompts of one dataset split, ordered by prompt_id (a stable order for batching);
    the test split only with `open_test` (a final evaluation)."""
    if split == "test" and not open_test:
        raise SealedSplit(SEALED)
    sql = "SELECT * FROM prompts WHERE dataset = ? AND split = ?"
    params: list = [dataset, split]
    if task:
        sql += " AND task = ?"
        params.append(task)
    sql += " ORDER BY prompt_id"
    if limit:
        sql += f" LIMIT {int(limit)}"
    return lake.query(sql, params)


def _with_ids(con, name: str, column: str, ids: list[str]) -> None:
    con.register(name, pa.table({column: pa.array(ids, pa.string())}))


def scoped_verdicts(con: duckdb.DuckDBPyConnection, used: dict[str, str] | None) -> str:
    """The verdicts to read, as SQL: only each verifier's rows for its options digest in
    `used` (verifier -> digest); every verdict when `used` is None."""
    if used is None:
        return "verdicts"
    con.register(
        "used_verifiers",
        pa.table(
            {
                "verifier": pa.array(list(used), pa.string()),
                "options_digest": pa.array(list(used.values()), pa.string()),
            }
        ),
    )
    return "(SELECT v.* FROM verdicts v JOIN used_verifiers USING (verifier, options_digest))"


def existing_candidates(lake: Lake, ids: list[str]) -> set[str]:
    """The ids among `ids` that are in the lake already."""
    return _present(lake, "candidates", "candidate_id", ids)


def _present(lake: Lake, table: str, column: str, ids: list[str]) -> set[str]:
    """The values among `ids` that `table`'s `column` holds."""
    if not ids:
        return set()
    con = lake.connect()
    try:
        _with_ids(con, "wanted", column, ids)
        found = con.sql(f"SELECT DISTINCT {column} FROM {table} JOIN wanted USING ({column})")
        return {r[0] for r in found.fetchall()}
    finally:
        con.close()


def existing_prompts(lake: Lake, ids: list[str]) -> dict[str, dict]:
    """The prompts among `ids` that are in the lake already: prompt_id -> its prompt_id,
    split, task, answer and tests."""
    if not ids:
        return {}
    columns = ("prompt_id", "split", "task", "answer", "tests")
    con = lake.connect()
    try:
        _with_ids(con, "wanted", "prompt_id", ids)
        rows = con.sql(
            f"SELECT {', '.join('p.' + c for c in columns)} FROM prompts p "
            "JOIN wanted USING (prompt_id)"
        ).fetchall()
    finally:
        con.close()
    return {r[0]: dict(zip(columns, r, strict=True)) for r in rows}


def last_pass_rates(lake: Lake, name: str, before_round: int) -> dict[str, float]:
    """Each prompt's pass rate (unhinted candidates) in the latest round before
    `before_round` that pipeline `name` curated (its current selection)."""
    rows = lake.query(
        f"""WITH rates AS (
               SELECT s.round, s.prompt_id,
                      avg(({PASSED_SQL})::INT) AS pass_rate
               FROM current_selections s JOIN candidates c USING (candidate_id)
               WHERE s.pipeline = ? AND s.round < ? AND NOT coalesce(c.hinted, false)
               GROUP BY s.round, s.prompt_id)
           SELECT prompt_id, arg_max(pass_rate, round) AS pass_rate FROM rates
           GROUP BY prompt_id""",
        [name, before_round],
    )
    return dict(zip(rows["prompt_id"].to_list(), rows["pass_rate"].to_list(), strict=True))


def retired_prompts(lake: Lake, name: str, before_round: int, after: int) -> set[str]:
    """Prompts pipeline `name` sampled in earlier rounds that had no passing (unhinted)
    candidate in their latest `after` sampled rounds in a row."""
    rows = lake.query(
        f"""SELECT prompt_id FROM ({FAIL_STREAKS_SQL.format(before="$before")})
            WHERE pipeline = $name AND failing_rounds >= $after""",
        {"before": before_round, "name": name, "after": after},
    )
    return set(rows["prompt_id"].to_list())


def band_share(lake: Lake, selection_id: str, low: float, high: float) -> dict:
    """Of one selection's prompts (unhinted candidates), how many were solved at a rate
    strictly between `low` and `high`: those that carry signal for training."""
    one = f"(SELECT * FROM selections s WHERE {_OF_SELECTION})"
    row = lake.query(
        f"""SELECT count(*) AS prompts,
                   count(*) FILTER (WHERE pass_rate > $low AND pass_rate < $high) AS in_band
            FROM ({PROMPT_DIFFICULTY_SQL.format(selections=one)})""",
        {"sid": selection_id, "low": low, "high": high},
    ).row(0, named=True)
    share = row["in_band"] / row["prompts"] if row["prompts"] else 0.0
    return {"min_pass_rate": low, "max_pass_rate": high, **row, "share": round(share, 4)}


def unsolved_prompts(
    lake: Lake, candidate_ids: list[str], rule: str | None = None, used: dict | None = None
) -> list[str]:
    """Prompts of these (unhinted) candidates that have verdicts, none of which passes `rule`."""
    rates = student_pass_rates(lake, candidate_ids, rule, used)
    return sorted(p for p, rate in rates.items() if rate == 0)


# Per prompt, the share of its student's own candidates (of table `cands`) passing a rule.
STUDENT_RATES_SQL = """
WITH per_candidate AS (
    SELECT c.candidate_id, c.prompt_id, {passed} AS passed
    FROM candidates c JOIN cands USING (candidate_id)
    JOIN {verdicts} v ON v.candidate_id = c.candidate_id
    WHERE NOT coalesce(c.hinted, false)
    GROUP BY ALL)
SELECT prompt_id, avg(passed::INT) FROM per_candidate GROUP BY prompt_id"""
# Per prompt (of table `wanted`), its shortest candidate of the student or a teacher that
# passes a rule: text, final answer, source.
SOLUTIONS_SQL = f"""
WITH judged AS (
    SELECT c.candidate_id, c.prompt_id, c.text, {SOURCE_SQL} AS source,
           max(v.answer) AS answer, {{passed}} AS passed
    FROM candidates c JOIN wanted USING (prompt_id)
    JOIN {{verdicts}} v ON v.candidate_id = c.candidate_id
    WHERE ({SOURCE_SQL} = '{STUDENT}' OR {SOURCE_SQL} LIKE '{TEACHER}%')
      AND c.round <= {{up_to}}
    GROUP BY ALL)
SELECT prompt_id, text, answer, source FROM judged WHERE passed
QUALIFY row_number() OVER (PARTITION BY prompt_id ORDER BY length(text), candidate_id) = 1"""


def student_pass_rates(
    lake: Lake, candidate_ids: list[str], rule: str | None = None, used: dict | None = None
) -> dict[str, float]:
    """prompt_id -> the share of its (unhinted) candidates among these, with verdicts, that
    pass `rule`."""
    rows = _judged(lake, STUDENT_RATES_SQL, ("cands", "candidate_id", candidate_ids), rule, used)
    return {r[0]: r[1] for r in rows}


def passing_solutions(
    lake: Lake, prompt_ids: list[str], up_to: int, rule: str | None = None, used: dict | None = None
) -> dict[str, dict]:
    """prompt_id -> a verified solution of it (text, final answer, source): a passing
    candidate of a teacher or of the student's own from round `up_to` or before (a resumed
    round reads no later round's), the shortest first."""
    sql = SOLUTIONS_SQL.replace("{up_to}", str(int(up_to)))
    rows = _judged(lake, sql, ("wanted", "prompt_id", prompt_ids), rule, used)
    return {r[0]: {"text": r[1], "answer": r[2], "source": r[3]} for r in rows}


def _judged(
    lake: Lake, sql: str, ids: tuple[str, str, list[str]], rule: str | None, used: dict | None
) -> list[tuple]:
    """The rows of `sql` with `ids` (table, column, values) registered, `{passed}` the
    `rule` over verdicts `v` and `{verdicts}` those under the `used` digests (None: all)."""
    con = lake.connect()
    try:
        _with_ids(con, *ids)
        verdicts = scoped_verdicts(con, used)
        return con.sql(sql.format(passed=rule_sql(rule), verdicts=verdicts)).fetchall()
    finally:
        con.close()


def sampled_by(lake: Lake, run_id: str | None, source: str, but_batch: str) -> int:
    """Candidates `source` sampled for run `run_id` in batches other than `but_batch`."""
    row = lake.query(
        f"""SELECT count(*) AS n FROM candidates c
            WHERE c.run_id IS NOT DISTINCT FROM ? AND {SOURCE_SQL} = ? AND c.batch_id <> ?""",
        [run_id, source, but_batch],
    )
    return int(row["n"][0])


def source_counts(lake: Lake, selection_id: str) -> dict[str, dict[str, int]]:
    """source -> its candidates, passing, kept and their tokens in one selection."""
    rows = lake.query(
        f"""SELECT {SOURCE_SQL} AS source, count(*) AS candidates,
                   count(*) FILTER (WHERE {PASSED_SQL}) AS passed,
                   count(*) FILTER (WHERE s.kept) AS kept,
                   coalesce(sum(c.n_tokens), 0)::BIGINT AS tokens,
                   coalesce(sum(c.n_tokens) FILTER (WHERE s.kept), 0)::BIGINT AS kept_tokens
            FROM selections s JOIN candidates c USING (candidate_id)
            WHERE coalesce(s.selection_id, s.run_id) = ? GROUP BY ALL ORDER BY source""",
        [selection_id],
    )
    return {r.pop("source"): r for r in rows.iter_rows(named=True)}


def candidates_to_verify(
    lake: Lake, candidate_ids: list[str], verifier: str, digest: str
) -> pl.DataFrame:
    """These candidates, joined with their prompt, that `verifier` with these options (its
    digest) has not scored."""
    con = lake.connect()
    try:
        _with_ids(con, "cands", "candidate_id", candidate_ids)
        return con.sql(
            """SELECT c.candidate_id, c.prompt_id, c.text, c.finish_reason, c.n_tokens,
                      p.task, p.prompt, p.messages, r.answer, p.tests, p.meta, c.segments
               FROM candidates c JOIN cands USING (candidate_id) JOIN prompts p USING (prompt_id)
               JOIN prompt_references r USING (prompt_id)
               WHERE NOT EXISTS (SELECT 1 FROM verdicts v
                                 WHERE v.candidate_id = c.candidate_id AND v.verifier = ?
                                   AND v.options_digest = ?)
               ORDER BY c.prompt_id, c.sample_idx""",
            params=[verifier, digest],
        ).pl()
    finally:
        con.close()


def prompts_to_verify(
    lake: Lake, candidate_ids: list[str], verifier: str, digest: str
) -> pl.DataFrame:
    """Every one of these candidates, joined with its prompt, of the prompts where `verifier`
    with these options (its digest) has not scored some of them (for a verifier that judges
    a prompt's candidates together); `missing` marks the unscored ones."""
    con = lake.connect()
    try:
        _with_ids(con, "cands", "candidate_id", candidate_ids)
        return con.sql(
            f"""WITH batch AS (
                   SELECT c.*, NOT EXISTS (SELECT 1 FROM verdicts v
                                           WHERE v.candidate_id = c.candidate_id
                                             AND v.verifier = ? AND v.options_digest = ?)
                               AS missing
                   FROM candidates c JOIN cands USING (candidate_id))
               SELECT b.candidate_id, b.prompt_id, b.text, b.finish_reason, b.n_tokens,
                      coalesce(b.hinted, false) AS hinted, b.missing, b.segments,
                      {SOURCE_SQL.replace("c.", "b.")} AS source,
                      p.task, p.prompt, p.messages, r.answer, p.tests, p.meta
               FROM batch b JOIN prompts p USING (prompt_id)
               JOIN prompt_references r USING (prompt_id)
               WHERE b.prompt_id IN (SELECT prompt_id FROM batch WHERE missing)
               ORDER BY b.prompt_id, hinted, b.sample_idx, b.candidate_id""",
            params=[verifier, digest],
        ).pl()
    finally:
        con.close()


# What selection decides on: each candidate with its prompt, whether the rule holds over
# the verdicts read, and a score (the ranking verifiers', else the mean).
SELECTION_INPUTS_SQL = """
SELECT cand.candidate_id, cand.prompt_id, cand.sample_idx, cand.text, cand.n_tokens,
       cand.finish_reason, coalesce(cand.hinted, false) AS hinted,
       {source} AS source, cand.hint, p.prompt, p.messages, p.tests IS NOT NULL AS has_tests,
       p.task, r.answer AS reference, max(v.answer) AS answer,
       {passed} AS passed,
       coalesce(max(v.score) FILTER (WHERE list_contains($ranking, v.verifier)), avg(v.score))
           AS score
FROM candidates cand
JOIN cands USING (candidate_id)
LEFT JOIN prompts p ON p.prompt_id = cand.prompt_id
LEFT JOIN prompt_references r ON r.prompt_id = cand.prompt_id
LEFT JOIN {verdicts} v ON v.candidate_id = cand.candidate_id
GROUP BY ALL
ORDER BY cand.prompt_id, hinted, cand.sample_idx, cand.candidate_id
"""


def selection_inputs(
    lake: Lake,
    candidate_ids: list[str],
    rule: str | None = None,
    used: dict[str, str] | None = None,
    ranking: list[str] | None = None,
) -> list[dict]:
    """These candidates as selection reads them, ordered by prompt, unhinted first, index."""
    con = lake.connect()
    try:
        _with_ids(con, "cands", "candidate_id", candidate_ids)
        sql = SELECTION_INPUTS_SQL.format(
            passed=rule_sql(rule),
            verdicts=scoped_verdicts(con, used),
            source=SOURCE_SQL.replace("c.", "cand."),
        )
        return con.sql(sql, params={"ranking": list(ranking or [])}).pl().to_dicts()
    finally:
        con.close()


def reference_answers(lake: Lake, prompt_ids: list[str]) -> pl.DataFrame:
    """(task, reference) of every prompt in the dataset splits these prompts come from: the
    round's references, whose answer shares `answer_balance` holds kept answers to."""
    con = lake.connect()
    try:
        _with_ids(con, "ids", "prompt_id", prompt_ids)
        return con.sql(
            """SELECT p.task, p.answer AS reference FROM prompts p
               WHERE (p.dataset, p.split) IN (SELECT DISTINCT q.dataset, q.split
                                              FROM prompts q JOIN ids USING (prompt_id))"""
        ).pl()
    finally:
        con.close()


def held_out_questions(lake: Lake) -> set[str]:
    """Every eval and test prompt's text, and its environment question where it has one,
    with case and spacing folded: what generated training prompts must never be."""
    rows = lake.query(
        """SELECT prompt, messages, json_extract_string(meta, '$.entry.question') AS question
           FROM prompts WHERE split IN ('eval', 'test')"""
    )
    out = set()
    for column in ("prompt", "messages", "question"):
        out |= {" ".join(t.split()).lower() for t in rows[column].drop_nulls().to_list()}
    return out


def task_level_rates(
    lake: Lake, pipeline: str, round_: int, judges: dict[str, str] | None = None
) -> dict[tuple[str, int | None], tuple[int, int]]:
    """(task, level) -> (right, sampled) of the student's own candidates in a pipeline's
    current selection of a round: right when every verifier of `judges` (verifier ->
    options digest) that scored it passed it, and one did; without judges, when the
    round's rule held."""
    if not judges:
        passed, verdicts = f"bool_and({PASSED_SQL})", ""
    else:
        passed = rule_sql(None)
        verdicts = "LEFT JOIN {verdicts} v ON v.candidate_id = c.candidate_id"
    con = lake.connect()
    try:
        verdicts = verdicts.format(verdicts=scoped_verdicts(con, judges)) if judges else ""
        rows = con.execute(
            f"""WITH judged AS (
                    SELECT c.candidate_id, any_value(p.task) AS task,
                           any_value(json_extract(p.meta, '$.level')::INT) AS level,
                           {passed} AS passed
                    FROM current_selections s JOIN candidates c USING (candidate_id)
                    JOIN prompts p ON p.prompt_id = s.prompt_id {verdicts}
                    WHERE s.pipeline = ? AND s.round = ? AND NOT coalesce(c.hinted, false)
                    GROUP BY c.candidate_id)
                SELECT task, level, count(*) FILTER (WHERE passed), count(*) FROM judged
                GROUP BY ALL""",
            [pipeline, round_],
        ).fetchall()
    finally:
        con.close()
    return {(r[0], r[1]): (r[2], r[3]) for r in rows}


def env_levels(lake: Lake, dataset: str) -> dict[str, int]:
    """task -> the curriculum level its prompts in `dataset` were generated at (probes of
    the next level left out)."""
    rows = lake.query(
        """SELECT task, max(json_extract(meta, '$.level')::INT) AS level FROM prompts
           WHERE dataset = ? AND json_extract(meta, '$.level') IS NOT NULL
             AND NOT coalesce(json_extract(meta, '$.probe')::BOOLEAN, false)
           GROUP BY task""",
        [dataset],
    )
    return {r["task"]: r["level"] for r in rows.iter_rows(named=True)}


def eval_task_configs(lake: Lake, dataset: str) -> dict[str, dict]:
    """task -> the generator settings of the held-out (eval) prompts of `dataset`."""
    rows = lake.query(
        """SELECT task, any_value(json_extract_string(meta, '$.config')) AS config
           FROM prompts WHERE dataset = ? AND split = 'eval'
             AND json_extract(meta, '$.config') IS NOT NULL GROUP BY task""",
        [dataset],
    )
    return {r["task"]: json.loads(r["config"]) for r in rows.iter_rows(named=True)}


def selected_count(lake: Lake, selection_id: str, candidate_ids: list[str]) -> int:
    """How many of these candidates selection `selection_id` has decided on already."""
    con = lake.connect()
    try:
        _with_ids(con, "cands", "candidate_id", candidate_ids)
        sql = (
            "SELECT count(*) FROM selections JOIN cands USING (candidate_id) WHERE selection_id = ?"
        )
        return con.sql(sql, params=[selection_id]).fetchall()[0][0]
    finally:
        con.close()


def kept_texts(lake: Lake, selection_id: str) -> pl.DataFrame:
    """(candidate_id, text) of what a selection kept, in the order it kept them."""
    return lake.query(
        "SELECT c.candidate_id, c.text FROM selections s JOIN candidates c USING (candidate_id) "
        "WHERE s.selection_id = ? AND s.kept ORDER BY s.created_at, c.prompt_id, c.sample_idx",
        [selection_id],
    )


def count_verdicts(lake: Lake, selection_id: str, used: dict[str, str]) -> int:
    """Verdicts the candidates of this selection have from the verifiers and options in
    `used`."""
    con = lake.connect()
    try:
        verdicts = scoped_verdicts(con, used)
        return con.execute(
            f"SELECT count(*) FROM {verdicts} JOIN selections USING (candidate_id) "
            "WHERE selection_id = ?",
            [selection_id],
        ).fetchall()[0][0]
    finally:
        con.close()


def run_summary(lake: Lake, selection_id: str) -> dict:
    """Prompts, candidates, the funnel's counts (as `round_funnel`), pass rate, prompts solved,
    truncated answers, tokens sampled and tokens per kept example of one selection (passed =
    not `failed`)."""
    row = lake.query(
        f"""SELECT count(DISTINCT c.prompt_id) AS prompts,
                  count(*) AS candidates,{FUNNEL_COUNTS_SQL},
                  coalesce(avg(({PASSED_SQL})::INT), 0) AS pass_rate,
                  count(DISTINCT c.prompt_id)
                      FILTER (WHERE {PASSED_SQL}) AS prompts_solved,
                  count(*) FILTER (WHERE c.finish_reason = 'length') AS truncated,
                  sum(c.n_tokens)::BIGINT AS tokens
           FROM selections s JOIN candidates c USING (candidate_id)
           WHERE s.selection_id = ?""",
        [selection_id],
    ).row(0, named=True)
    row["pass_rate"] = round(float(row["pass_rate"]), 4)
    # what a kept example cost to find: every token sampled for the selection's prompts
    row["tokens_per_kept"] = (
        round(row["tokens"] / row["kept"], 1) if row["tokens"] and row["kept"] else None
    )
    return row


def latest_curated_round(lake: Lake, name: str | None = None) -> int | None:
    """The latest round with a current selection (of pipeline `name`), or None."""
    row = lake.query(
        "SELECT max(round) AS r FROM current_selections WHERE $name IS NULL OR pipeline = $name",
        {"name": name},
    )
    return row["r"][0]


def previous_run(lake: Lake, flow: str, name: str, round_: int, run_id: str) -> dict | None:
    """The latest other run of this flow, pipeline name and round (config parsed), or None."""
    import json

    rows = lake.query(
        """SELECT run_id, config, status FROM runs
           WHERE flow = ? AND json_extract_string(config, '$.name') = ? AND round = ?
             AND run_id <> ?
           ORDER BY started_at DESC LIMIT 1""",
        [flow, name, round_, run_id],
    ).to_dicts()
    if not rows:
        return None
    return {**rows[0], "config": json.loads(rows[0]["config"] or "{}")}


def eval_items(lake: Lake, datasets: list[str] | None = None) -> list[tuple[str, str]]:
    """(prompt_id, prompt text) of every held-out prompt, eval and test splits (of
    `datasets`, if given): what decontamination keeps out of training data."""
    sql = (
        "SELECT prompt_id, coalesce(prompt, messages) AS text FROM prompts "
        "WHERE split IN ('eval', 'test')"
    )
    params: list = []
    if datasets is not None:
        sql += " AND dataset IN (SELECT unnest(?))"
        params.append(datasets)
    rows = lake.query(sql, params or None)
    return list(zip(rows["prompt_id"].to_list(), rows["text"].to_list(), strict=True))


def eval_answers(lake: Lake, ids: list[str]) -> dict[str, str | None]:
    """prompt_id -> reference answer of these (held-out) prompts."""
    sql = "SELECT prompt_id, answer FROM prompts JOIN ids USING (prompt_id)"
    return dict(_of_ids(lake, "prompt_id", ids, sql))


def stored_embeddings(lake: Lake, text_ids: list[str], model: str) -> dict[str, list[float]]:
    """text_id -> vector of the texts `model` embedded before."""
    sql = (
        "SELECT DISTINCT ON (text_id) text_id, vector FROM embeddings JOIN ids "
        "USING (text_id) WHERE model = ?"
    )
    return dict(_of_ids(lake, "text_id", text_ids, sql, [model]))


def _of_ids(
    lake: Lake, column: str, ids: list[str], sql: str, params: list | None = None
) -> list[tuple]:
    """The rows of `sql` run beside the table `ids` (one `column`) holding these ids."""
    con = lake.connect()
    try:
        _with_ids(con, "ids", column, ids)
        return con.sql(sql, params=params).fetchall()
    finally:
        con.close()


def answer_votes(lake: Lake, prompt_ids: list[str], up_to_round: int) -> pl.DataFrame:
    """Each final answer these prompts' samples gave (every model's of
    rounds up to `up_to_round`, a teacher's too; none sampled with a hint): prompt_id,
    reference (as verifiers judge it), label (of the reference, if any), answer, model."""
    con = lake.connect()
    try:
        _with_ids(con, "ids", "prompt_id", prompt_ids)
        return con.sql(
            f"""SELECT c.prompt_id, any_value(r.reference) AS reference,
                       any_value(r.answer) AS judged_by, any_value(r.label) AS label,
                       max(v.answer) AS answer, any_value(c.model) AS model
                FROM candidates c JOIN ids USING (prompt_id)
                JOIN prompt_references r USING (prompt_id)
                JOIN verdicts v USING (candidate_id)
                WHERE c.round <= ? AND {SOURCE_SQL} NOT LIKE 'hint:%' AND v.answer IS NOT NULL
                GROUP BY c.candidate_id, c.prompt_id
                ORDER BY c.prompt_id, c.candidate_id""",
            params=[up_to_round],
        ).pl()
    finally:
        con.close()


def eval_prompt_count(lake: Lake) -> int:
    """How many prompts of any dataset are held out (eval and test splits)."""
    sql = "SELECT count(*) AS n FROM prompts WHERE split IN ('eval', 'test')"
    return int(lake.query(sql)["n"][0])


def test_openings(lake: Lake, dataset: str | None = None) -> list[dict]:
    """Every final evaluation of the sealed test split (of `dataset`), oldest first: run,
    model, round, when, status."""
    return lake.query(
        """SELECT run_id, model, round, started_at, status,
                  json_extract_string(config, '$.prompts.dataset') AS dataset
           FROM runs WHERE flow = 'evaluate'
             AND json_extract_string(config, '$.prompts.split') = 'test'
             AND ($dataset IS NULL OR json_extract_string(config, '$.prompts.dataset') = $dataset)
           ORDER BY started_at""",
        {"dataset": dataset},
    ).to_dicts()


# -- monitors (evaluators.monitors) ---------------------------------------------------


def current_selection_id(lake: Lake, name: str | None, round_: int) -> str | None:
    """The id of pipeline `name`'s current selection of round `round_` (None: not curated)."""
    rows = lake.query(
        """SELECT DISTINCT coalesce(selection_id, run_id) AS sid FROM current_selections
           WHERE pipeline IS NOT DISTINCT FROM ? AND round = ?""",
        [name, round_],
    )
    return rows["sid"][0] if rows.height else None


def suspect_flags(lake: Lake, selection_id: str) -> dict[str, str]:
    """prompt_id -> the answer its samples agree on, of the prompts a selection flagged as
    suspect references."""
    rows = lake.query(
        """SELECT prompt_id, any_value(agreed) AS agreed FROM evidence
           WHERE selection_id = ? AND kind = 'suspect_reference' GROUP BY prompt_id""",
        [selection_id],
    )
    return dict(zip(rows["prompt_id"].to_list(), rows["agreed"].to_list(), strict=True))


def drop_counts(lake: Lake, name: str | None, round_: int) -> dict[str, int]:
    """How many of round `round_`'s candidates (of pipeline `name`, or any) each drop reason removed
    (reasons without their detail: `contaminated`, not `contaminated:<item>`), most first."""
    rows = lake.query(
        """SELECT split_part(drop_reason, ':', 1) AS reason, count(*) AS n
           FROM current_selections
           WHERE (CAST(? AS VARCHAR) IS NULL OR pipeline = ?) AND round = ? AND NOT kept
           GROUP BY 1 ORDER BY n DESC, reason""",
        [name, name, round_],
    )
    return dict(zip(rows["reason"].to_list(), rows["n"].to_list(), strict=True))


def selection_outcomes(lake: Lake, selection_id: str) -> pl.DataFrame:
    """Each candidate of a selection: prompt_id, kept, passed (the rule held), hinted (a
    hint helped: teachers' candidates are not), n_tokens and the model that sampled it."""
    return lake.query(
        f"""SELECT s.prompt_id, s.kept, ({PASSED_SQL}) AS passed,
                   {SOURCE_SQL} LIKE 'hint:%' AS hinted, c.n_tokens, c.model
            FROM selections s JOIN candidates c USING (candidate_id)
            WHERE {_OF_SELECTION}""",
        {"sid": selection_id},
    )


def selection_answers(lake: Lake, selection_id: str) -> pl.DataFrame:
    """Each unhinted candidate of a selection: prompt_id, task, kept, its final answer (as
    an answer-reading verifier read it; null: none) and the prompt's reference."""
    return lake.query(
        f"""SELECT s.prompt_id, p.task, s.kept, p.answer AS reference,
                   (SELECT max(v.answer) FROM verdicts v
                    WHERE v.candidate_id = s.candidate_id) AS answer
            FROM selections s JOIN candidates c USING (candidate_id)
            JOIN prompts p ON p.prompt_id = s.prompt_id
            WHERE {_OF_SELECTION} AND NOT coalesce(c.hinted, false)""",
        {"sid": selection_id},
    )


def selection_texts(
    lake: Lake, selection_id: str, batch_rows: int = 50_000
) -> Iterator[pl.DataFrame]:
    """(prompt_id, text) of a selection's unhinted candidates, ordered by prompt, as polars
    frames of about `batch_rows` rows read in one scan (a prompt may span two frames)."""
    import polars as pl

    con = lake.connect()
    try:
        reader = con.sql(
            f"""SELECT s.prompt_id, c.text
                FROM selections s JOIN candidates c USING (candidate_id)
                WHERE {_OF_SELECTION} AND NOT coalesce(c.hinted, false)
                ORDER BY s.prompt_id, c.sample_idx""",
            params={"sid": selection_id},
        ).to_arrow_reader(batch_rows)
        for batch in reader:
            yield pl.from_arrow(batch)
    finally:
        con.close()


def latest_overall_eval(
    lake: Lake, name: str | None, round_: int, model: str | None = None
) -> pl.DataFrame:
    """run_id, metric, value of the overall held-out metrics (split 'eval', task 'all') of
    pipeline `name`'s latest evaluation of `model` (when given: a rolled-back round samples
    with an earlier round's model), else of model `round_` (empty: none)."""
    return lake.query(
        """WITH measured AS (
               SELECT e.run_id, e.metric, e.value, e.created_at
               FROM evals e JOIN runs r USING (run_id)
               WHERE e.split = 'eval' AND e.task = 'all'
                 AND (CASE WHEN $model IS NULL THEN e.round = $round ELSE e.model = $model END)
                 AND r.flow = 'evaluate'
                 AND json_extract_string(r.config, '$.name') IS NOT DISTINCT FROM $name)
           SELECT run_id, metric, value FROM measured WHERE run_id = (
               SELECT run_id FROM measured ORDER BY created_at DESC, run_id DESC LIMIT 1)
           ORDER BY metric""",
        {"round": round_, "name": name, "model": model},
    )


def code_prompts(
    lake: Lake, dataset: str, split: str | None = None, limit: int | None = None
) -> pl.DataFrame:
    """A dataset's prompts that have tests (any split but the sealed test split unless
    named), ordered by prompt_id."""
    sql = "SELECT * FROM prompts WHERE dataset = ? AND tests IS NOT NULL"
    params: list = [dataset]
    if split:
        sql += " AND split = ?"
        params.append(split)
    else:
        sql += " AND split <> 'test'"
    sql += " ORDER BY prompt_id"
    if limit:
        sql += f" LIMIT {int(limit)}"
    return lake.query(sql, params)


def recorded_audits(lake: Lake, audit_ids: list[str]) -> set[str]:
    """The test-strength audits among these that the lake already has."""
    return _present(lake, "test_strength", "audit_id", audit_ids)


def prompt_kill_rates(
    lake: Lake, prompt_ids: list[str], suite: str = "original"
) -> dict[str, float | None]:
    """Each audited prompt's kill rate of one suite of its tests (latest audit; 0 where the
    reference fails its own tests, None where no mutant could be judged)."""
    con = lake.connect()
    try:
        _with_ids(con, "ids", "prompt_id", prompt_ids)
        rows = con.sql(
            "SELECT prompt_id, CASE WHEN reference_passes THEN kill_rate ELSE 0.0 END "
            "FROM prompt_strength JOIN ids USING (prompt_id) WHERE suite = ? "
            "OR (suite = 'original' AND NOT reference_passes)",
            params=[suite],
        ).fetchall()
        return dict(rows)
    finally:
        con.close()


def has_dataset(lake: Lake, dataset: str) -> bool:
    """Whether the lake has prompts of this dataset."""
    return bool(lake.query("SELECT count(*) FROM prompts WHERE dataset = ?", [dataset]).item())


def strength_summary(lake: Lake, dataset: str) -> tuple[pl.DataFrame, int]:
    """A dataset's test-strength summary per suite, and how many prompts' original tests
    are weak (`weak_prompts`)."""
    df = lake.query(
        "SELECT * EXCLUDE (dataset) FROM test_strength_summary WHERE dataset = ?", [dataset]
    )
    weak = lake.query(
        "SELECT count(*) FROM weak_prompts WHERE dataset = ? AND suite = 'original'", [dataset]
    ).item()
    return df, weak


def with_strengthened_tests(lake: Lake, rows: pl.DataFrame) -> pl.DataFrame:
    """Rows (a frame with prompt_id and tests) with each prompt's latest strengthened tests
    where `thresher tests-audit` made some (its reference passing), and a `tests_suite`
    column saying which suite each row has."""
    import polars as pl

    ids = rows["prompt_id"].unique().to_list()
    con = lake.connect()
    try:
        _with_ids(con, "ids", "prompt_id", ids)
        strong = con.sql(
            """SELECT prompt_id, tests AS strong_tests FROM test_strength JOIN ids USING (prompt_id)
               WHERE suite = 'strengthened' AND reference_passes
               QUALIFY row_number() OVER (
                   PARTITION BY prompt_id ORDER BY created_at DESC, audit_id) = 1"""
        ).pl()
    finally:
        con.close()
    joined = rows.join(strong, on="prompt_id", how="left")
    return joined.with_columns(
        pl.coalesce("strong_tests", "tests").alias("tests"),
        pl.when(pl.col("strong_tests").is_null())
        .then(pl.lit("original"))
        .otherwise(pl.lit("strengthened"))
        .alias("tests_suite"),
    ).drop("strong_tests")


def train_losses(lake: Lake, run_id: str) -> list[dict]:
    """A training run's logged steps: step, loss, eval_loss, lr, tokens_per_s."""
    return lake.query(
        """SELECT step, any_value(loss) AS loss, any_value(eval_loss) AS eval_loss,
                  any_value(lr) AS lr, any_value(tokens_per_s) AS tokens_per_s
           FROM train_metrics WHERE run_id = $run GROUP BY step ORDER BY step""",
        {"run": run_id},
    ).to_dicts()
