"""Selection: which verified candidates of a round become training data, and why the rest don't."""

from __future__ import annotations

import pyarrow as pa

from thresher.stores.lake import Lake, now
from thresher.stores.rules import rule_sql

# One row per candidate of the batch: failed first, then exact duplicates within a prompt
# (whitespace-normalised text), then the per-prompt cap over what is left.
SELECT_SQL = """
WITH c AS (
    SELECT cand.candidate_id, cand.prompt_id, cand.sample_idx,
           coalesce(cand.hinted, false) AS hinted,
           md5(regexp_replace(trim(cand.text), '\\s+', ' ', 'g')) AS text_hash,
           {passed} AS passed
    FROM candidates cand
    JOIN batch b ON b.prompt_id = cand.prompt_id
    LEFT JOIN verdicts v ON v.candidate_id = cand.candidate_id
    WHERE cand.run_id = $run_id AND cand.round = $round
    GROUP BY ALL
), firsts AS (
    SELECT *, first_value(candidate_id) OVER (
        PARTITION BY prompt_id, passed, text_hash ORDER BY hinted, sample_idx) AS first_id
    FROM c
), reasons AS (
    SELECT *, CASE WHEN NOT passed THEN 'failed'
                   WHEN first_id <> candidate_id THEN 'duplicate_of:' || first_id END AS reason
    FROM firsts
), ranked AS (
    SELECT *, row_number() OVER (
        PARTITION BY prompt_id, reason IS NULL ORDER BY hinted, sample_idx) AS rank
    FROM reasons
)
SELECT $round AS round, candidate_id, prompt_id,
       reason IS NULL AND rank <= $cap AS kept,
       CASE WHEN reason IS NOT NULL THEN reason
            WHEN rank > $cap THEN 'capped' END AS drop_reason,
       $run_id AS run_id
FROM ranked
ORDER BY prompt_id, sample_idx
"""


def select_batch(
    lake: Lake, run_id: str, round_: int, prompt_ids: list[str], cap: int, rule: str | None = None
) -> int:
    """Write `selections` for a run's candidates of these prompts; returns rows written.

    `rule` (e.g. "math and format") says which verdicts make a candidate pass; by
    default every verifier that scored it must have passed it.
    """
    if cap < 1:
        raise ValueError(f"cap must be at least 1, got {cap}")
    con = lake.connect()
    try:
        con.register("batch", pa.table({"prompt_id": pa.array(prompt_ids, pa.string())}))
        params = {"run_id": run_id, "round": round_, "cap": cap}
        table = con.sql(SELECT_SQL.format(passed=rule_sql(rule)), params=params).to_arrow_table()
    finally:
        con.close()
    stamp = pa.array([now()] * table.num_rows, pa.timestamp("us", tz="UTC"))
    return lake.append("selections", table.append_column("created_at", stamp))
