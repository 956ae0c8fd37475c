"""The queries the flows need: what to sample, what to verify, what a run produced."""

from __future__ import annotations

import pyarrow as pa

from thresher.stores.lake import Lake


def load_prompts(
    lake: Lake, dataset: str, split: str, limit: int | None = None, task: str | None = None
):
    """Prompts of one dataset split, ordered by prompt_id (a stable order for batching)."""
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


def complete_prompts(lake: Lake, expected: dict[str, list[str]]) -> set[str]:
    """Prompts whose expected candidate ids (prompt_id -> ids) are all in the lake already."""
    wanted = [c for ids in expected.values() for c in ids]
    con = lake.connect()
    try:
        _with_ids(con, "wanted", "candidate_id", wanted)
        found = con.sql(
            "SELECT c.prompt_id, count(*) FROM candidates c JOIN wanted USING (candidate_id) "
            "GROUP BY c.prompt_id"
        ).fetchall()
    finally:
        con.close()
    return {pid for pid, n in found if pid in expected and n >= len(expected[pid])}


def last_pass_rates(lake: Lake, name: str, before_round: int) -> dict[str, float]:
    """Each prompt's pass rate (unhinted candidates) in the latest round before
    `before_round` that pipeline `name` curated it."""
    rows = lake.query(
        """WITH curated AS (
               SELECT DISTINCT run_id FROM runs
               WHERE flow = 'curate' AND json_extract_string(config, '$.name') = ?),
           rates AS (
               SELECT s.round, s.prompt_id,
                      avg((s.drop_reason IS DISTINCT FROM 'failed')::INT) AS pass_rate
               FROM selections s JOIN candidates c USING (candidate_id)
               WHERE s.round < ? AND s.run_id IN (SELECT run_id FROM curated)
                 AND NOT coalesce(c.hinted, false)
               GROUP BY s.round, s.prompt_id)
           SELECT prompt_id, arg_max(pass_rate, round) AS pass_rate FROM rates
           GROUP BY prompt_id""",
        [name, before_round],
    )
    return dict(zip(rows["prompt_id"].to_list(), rows["pass_rate"].to_list(), strict=True))


def unsolved_prompts(
    lake: Lake, run_id: str, prompt_ids: list[str], rule: str | None = None
) -> list[str]:
    """Prompts of a run with verified unhinted candidates, none of which passes `rule`."""
    from thresher.stores.rules import rule_sql

    con = lake.connect()
    try:
        _with_ids(con, "batch", "prompt_id", prompt_ids)
        rows = con.sql(
            f"""WITH per_candidate AS (
                    SELECT c.candidate_id, c.prompt_id, {rule_sql(rule)} AS passed
                    FROM candidates c JOIN batch USING (prompt_id)
                    JOIN verdicts v ON v.candidate_id = c.candidate_id
                    WHERE c.run_id = ? AND NOT coalesce(c.hinted, false)
                    GROUP BY ALL)
                SELECT prompt_id FROM per_candidate GROUP BY prompt_id
                HAVING NOT bool_or(passed) ORDER BY prompt_id""",
            params=[run_id],
        ).fetchall()
    finally:
        con.close()
    return [r[0] for r in rows]


def candidates_to_verify(lake: Lake, run_id: str, prompt_ids: list[str], verifier: str):
    """Candidates of a run's prompts, joined with their prompt, that `verifier` has not scored."""
    con = lake.connect()
    try:
        _with_ids(con, "batch", "prompt_id", prompt_ids)
        return con.sql(
            """SELECT c.candidate_id, c.prompt_id, c.text, c.finish_reason, c.n_tokens,
                      p.task, p.prompt, p.messages, p.answer, p.tests, p.meta
               FROM candidates c JOIN batch USING (prompt_id) JOIN prompts p USING (prompt_id)
               WHERE c.run_id = ?
                 AND NOT EXISTS (SELECT 1 FROM verdicts v
                                 WHERE v.candidate_id = c.candidate_id AND v.verifier = ?)
               ORDER BY c.prompt_id, c.sample_idx""",
            params=[run_id, verifier],
        ).pl()
    finally:
        con.close()


def run_summary(lake: Lake, run_id: str, round_: int) -> dict:
    """Prompts, candidates, pass rate and kept counts of one run (passed = not `failed`)."""
    row = lake.query(
        """SELECT count(DISTINCT c.prompt_id) AS prompts,
                  count(*) AS candidates,
                  count(*) FILTER (WHERE s.drop_reason IS DISTINCT FROM 'failed') AS passed,
                  coalesce(avg((s.drop_reason IS DISTINCT FROM 'failed')::INT), 0) AS pass_rate,
                  count(DISTINCT c.prompt_id)
                      FILTER (WHERE s.drop_reason IS DISTINCT FROM 'failed') AS prompts_solved,
                  count(*) FILTER (WHERE s.kept) AS kept,
                  count(*) FILTER (WHERE s.drop_reason LIKE 'duplicate_of:%') AS duplicates,
                  count(*) FILTER (WHERE s.drop_reason = 'capped') AS capped,
                  count(*) FILTER (WHERE s.drop_reason LIKE 'contaminated:%') AS contaminated,
                  count(*) FILTER (WHERE s.drop_reason = 'too_easy') AS too_easy,
                  count(*) FILTER (WHERE c.finish_reason = 'length') AS truncated
           FROM candidates c
           JOIN selections s ON s.candidate_id = c.candidate_id AND s.round = ?
           WHERE c.run_id = ?""",
        [round_, run_id],
    ).row(0, named=True)
    row["pass_rate"] = round(float(row["pass_rate"]), 4)
    return row


def eval_items(lake: Lake, datasets: list[str] | None = None) -> list[tuple[str, str]]:
    """(prompt_id, prompt text) of every eval-split prompt (of `datasets`, if given)."""
    sql = "SELECT prompt_id, coalesce(prompt, messages) AS text FROM prompts WHERE split = 'eval'"
    params: list = []
    if datasets is not None:
        sql += " AND dataset IN (SELECT unnest(?))"
        params.append(datasets)
    rows = lake.query(sql, params or None)
    return list(zip(rows["prompt_id"].to_list(), rows["text"].to_list(), strict=True))
