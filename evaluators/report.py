"""Per-round numbers of the self-bootstrap rounds in a lake: held-out pass@k and the data funnel.

Round r's eval row measures model r (round 0 is the base model): the model that sampled
round r's training data. Round r's curated data trains model r+1, whose eval is round
r+1's row, so reading down the round table shows what each round of data bought.

`name` restricts every frame to one pipeline: evals of `evaluate` runs and the current
selections of `curate` runs whose config `name` equals it. Without it, every pipeline's
current selections count.
"""

from __future__ import annotations

import json

import polars as pl

from thresher.answers import answer_key
from thresher.config import FORGETTING, EvalConfig
from thresher.evaluators.passk import pass_counts, protocol_rules
from thresher.identities import expected_ids
from thresher.intervals import wilson_interval
from thresher.plan import plan_eval
from thresher.stores.lake import (
    DIFFICULTY_BY_ROUND_SQL,
    PROMPT_DIFFICULTY_SQL,
    ROUND_FUNNEL_SQL,
    Lake,
)
from thresher.stores.queries import existing_candidates, load_prompts
from thresher.stores.schemas import PASSED_SQL, SOURCE_SQL

# The funnel and difficulty columns the round table shows beside pass@k.
ROUND_TABLE_COUNTS = (
    "sampled",
    "hinted",
    "passed",
    "truncated_dropped",
    "duplicates",
    "capped",
    "contaminated",
    "kept",
    "prompts",
    "all_pass",
    "all_fail",
)


def _runs_named(flow: str) -> str:
    # run ids of one flow whose config is named `?`
    return (
        f"SELECT run_id FROM runs WHERE flow = '{flow}' "
        "AND json_extract_string(config, '$.name') = ?"
    )


def _completed_runs(flow: str, name: str | None) -> tuple[str, list]:
    """A WHERE clause (and its parameters) over `runs` for the completed runs of one flow,
    of pipeline `name` when given."""
    where = f"flow = '{flow}' AND status = 'completed'"
    if name is None:
        return where, []
    return where + " AND json_extract_string(config, '$.name') = ?", [name]


def _selections(name: str | None) -> tuple[str, list]:
    """A CTE `sel`: the current selection of each round (of pipeline `name`), and its
    parameters."""
    if name is None:
        return "sel AS (SELECT * FROM current_selections)", []
    return "sel AS (SELECT * FROM current_selections WHERE pipeline = ?)", [name]


def _metric_key(metric: str) -> tuple[str, int, str]:
    prefix, _, k = metric.partition("@")
    return (prefix, int(k) if k.isdigit() else 1 << 62, metric)


def _overall_evals(split: str, name: str | None, alias: str = "") -> tuple[str, list]:
    """A WHERE clause (and its parameters) for the overall (`task = 'all'`) eval rows of one
    split, of pipeline `name`'s evaluate runs when given; `alias` prefixes the columns."""
    where = f"{alias}split = '{split}' AND {alias}task = 'all'"
    if name is None:  # every pipeline's, less forgetting checks (not the rounds' metric)
        forgetting = (
            "SELECT run_id FROM runs WHERE flow = 'evaluate' AND "
            f"contains(json_extract_string(config, '$.name'), '{FORGETTING}')"
        )
        return where + f" AND {alias}run_id NOT IN ({forgetting})", []
    return where + f" AND {alias}run_id IN ({_runs_named('evaluate')})", [name]


def eval_by_round(lake: Lake, name: str | None = None) -> pl.DataFrame:
    """Held-out overall pass@k: one row per round, a column per metric (pass@1, pass@8, ...).

    Only `split = 'eval'`, `task = 'all'` rows count; of several rows for one (round,
    metric) the latest (by created_at) wins.
    """
    where, params = _overall_evals("eval", name)
    long = lake.query(
        f"""SELECT round, metric, value FROM evals WHERE {where}
            QUALIFY row_number() OVER (
                PARTITION BY round, metric ORDER BY created_at DESC, run_id DESC) = 1
            ORDER BY round, metric""",
        params,
    )
    if long.is_empty():
        return pl.DataFrame(schema={"round": pl.Int64})
    wide = long.pivot(on="metric", index="round", values="value").sort("round")
    metrics = sorted((c for c in wide.columns if c != "round"), key=_metric_key)
    return wide.select("round", *metrics)


def test_results(lake: Lake, name: str | None = None) -> pl.DataFrame:
    """Every opening of the sealed test split, oldest first: opening, when, model, round and
    its overall pass@k (a column per metric)."""
    where, params = _overall_evals("test", name, "e.")
    long = lake.query(
        f"""SELECT e.run_id, min(r.started_at) AS opened_at, any_value(e.model) AS model,
                   any_value(e.round) AS round, e.metric, any_value(e.value) AS value
            FROM evals e JOIN runs r USING (run_id) WHERE {where}
            GROUP BY e.run_id, e.metric""",
        params,
    )
    if long.is_empty():
        return pl.DataFrame(schema={"opening": pl.Int64})
    wide = long.pivot(on="metric", index=["run_id", "opened_at", "model", "round"], values="value")
    wide = wide.sort("opened_at").with_row_index("opening", offset=1)
    metrics = sorted((c for c in wide.columns if c.startswith("pass@")), key=_metric_key)
    return wide.select("opening", "opened_at", "model", "round", *metrics)


def funnel_by_round(lake: Lake, name: str | None = None) -> pl.DataFrame:
    """Per curated round, how many candidates each stage let through (as `round_funnel`)."""
    cte, params = _selections(name)
    return lake.query(
        f"""WITH {cte}
        {ROUND_FUNNEL_SQL.format(selections="sel")}""",
        params,
    )


def _prompt_difficulty(name: str | None) -> tuple[str, list]:
    # the `prompt_difficulty` view's query over this pipeline's selections
    cte, params = _selections(name)
    sql = f"""WITH {cte}, difficulty AS ({PROMPT_DIFFICULTY_SQL.format(selections="sel")})"""
    return sql, params


def pass_rates_by_round(lake: Lake, name: str | None = None) -> pl.DataFrame:
    """Per curated round and prompt: the share of its unhinted candidates that passed, and kind.

    kind is `all_pass`, `all_fail` or `mixed` (as the `prompt_difficulty` view).
    """
    cte, params = _prompt_difficulty(name)
    return lake.query(
        f"{cte} SELECT round, prompt_id, pass_rate, kind FROM difficulty ORDER BY round, prompt_id",
        params,
    )


def difficulty_by_round(lake: Lake, name: str | None = None) -> pl.DataFrame:
    """Per curated round: prompts, all_pass, all_fail and mixed counts, mean pass rate."""
    cte, params = _prompt_difficulty(name)
    return lake.query(f"{cte} {DIFFICULTY_BY_ROUND_SQL.format(difficulty='difficulty')}", params)


def task_frontier_by_round(lake: Lake, name: str | None = None) -> pl.DataFrame:
    """Per curated round and task: the curriculum level its prompts were generated at (null
    for a fixed dataset), prompts sampled, those always and never solved (kept out of
    training by the frontier filter: `select.max_pass_rate` and the rule), the share in
    between (`in_band`), and its unhinted pass rate."""
    cte, params = _prompt_difficulty(name)
    return lake.query(
        f"""{cte}
        SELECT d.round, p.task, max(json_extract(p.meta, '$.level')::INT) FILTER (
                   WHERE NOT coalesce(json_extract(p.meta, '$.probe')::BOOLEAN, false)) AS level,
               count(*) AS prompts,
               count(*) FILTER (WHERE d.kind = 'all_pass') AS always,
               count(*) FILTER (WHERE d.kind = 'all_fail') AS never,
               round(avg((d.kind = 'mixed')::INT), 4) AS in_band,
               round(sum(d.passed) / sum(d.candidates), 4) AS pass_rate
        FROM difficulty d JOIN prompts p USING (prompt_id)
        GROUP BY ALL ORDER BY d.round, p.task""",
        params,
    )


def held_out_levels(lake: Lake, name: str) -> dict[str, int]:
    """task -> the curriculum level its held-out prompts were generated at, as pipeline
    `name`'s latest bootstrap recorded it (empty without an environment)."""
    rows = lake.query(
        """SELECT summary FROM runs WHERE flow = 'bootstrap'
           AND json_extract_string(config, '$.name') = ? AND summary IS NOT NULL
           ORDER BY updated_at DESC LIMIT 1""",
        [name],
    )
    if rows.is_empty():
        return {}
    rounds = json.loads(rows["summary"][0]).get("rounds") or []
    return next((r["held_out_levels"] for r in reversed(rounds) if r.get("held_out_levels")), {})


def classes_by_round(lake: Lake, name: str | None = None) -> pl.DataFrame:
    """Per curated round: its prompts by class (view `prompt_classes`: solved by the
    student, teachable by a teacher, out of reach) and the out-of-reach share."""
    where, params = ("WHERE pipeline = ?", [name]) if name is not None else ("", [])
    return lake.query(
        f"""SELECT round, count(*) AS prompts,
                   count(*) FILTER (WHERE class = 'solved') AS solved,
                   count(*) FILTER (WHERE class = 'teachable') AS teachable,
                   count(*) FILTER (WHERE class = 'out_of_reach') AS out_of_reach,
                   round(avg((class = 'out_of_reach')::INT), 4) AS out_of_reach_share
            FROM prompt_classes {where} GROUP BY round ORDER BY round""",
        params,
    )


def sources_by_round(lake: Lake, name: str | None = None) -> pl.DataFrame:
    """Per curated round and source (student, hints, each teacher): candidates, passing,
    kept, and the tokens sampled and kept."""
    cte, params = _selections(name)
    return lake.query(
        f"""WITH {cte}
        SELECT s.round, {SOURCE_SQL} AS source, count(*) AS candidates,
               count(*) FILTER (WHERE {PASSED_SQL}) AS passed,
               count(*) FILTER (WHERE s.kept) AS kept,
               coalesce(sum(c.n_tokens), 0)::BIGINT AS tokens,
               coalesce(sum(c.n_tokens) FILTER (WHERE s.kept), 0)::BIGINT AS kept_tokens
        FROM sel s JOIN candidates c USING (candidate_id)
        GROUP BY ALL ORDER BY s.round, source""",
        params,
    )


def spend_by_round(lake: Lake, name: str) -> pl.DataFrame:
    """Per curated round and task (and "all"): tokens sampled, kept examples, tokens per kept
    example, the held-out pass@1 gain of the model trained on the round over the model that
    sampled it, and tokens per held-out point gained (null where it did not gain)."""
    cte, params = _selections(name)
    spent = lake.query(
        f"""WITH {cte}
        SELECT s.round, p.task, sum(c.n_tokens)::BIGINT AS tokens,
               count(*) FILTER (WHERE s.kept) AS kept
        FROM sel s JOIN candidates c USING (candidate_id)
        JOIN prompts p ON p.prompt_id = s.prompt_id
        GROUP BY ALL""",
        params,
    )
    if spent.is_empty():
        return pl.DataFrame(schema={"round": pl.Int64, "task": pl.String})
    spent = pl.concat(
        [spent, spent.group_by("round").agg(pl.lit("all").alias("task"), pl.sum("tokens", "kept"))],
        how="diagonal",
    )
    rates = eval_prompt_rates(lake, name)
    if not rates.is_empty():
        per = _with_all(rates).group_by("task", "round").agg(pass_at_1=pl.col("rate").mean())
        after = per.with_columns(pl.col("round") - 1).rename({"pass_at_1": "after"})
        gains = per.join(after, on=["task", "round"]).select(
            "task", "round", gain=pl.col("after") - pl.col("pass_at_1")
        )
        spent = spent.join(gains, on=["task", "round"], how="left")
    else:
        spent = spent.with_columns(gain=pl.lit(None, pl.Float64))
    return spent.with_columns(
        tokens_per_kept=(pl.col("tokens") / pl.col("kept")).round(1),
        tokens_per_point=pl.when(pl.col("gain") > 0)
        .then(pl.col("tokens") / (pl.col("gain") * 100))
        .round(0),
        gain=pl.col("gain").round(4),
    ).sort("round", pl.col("task") != "all", "task")


def task_answers_by_round(lake: Lake, name: str | None = None) -> pl.DataFrame:
    """Per curated round and task (view `task_monitors`): the top final answer's share among
    the model's answers, the kept ones and the references, the kept top answer, its excess
    over its reference share, and the distinct answers."""
    where, params = ("WHERE pipeline = ?", [name]) if name is not None else ("", [])
    long = lake.query(f"SELECT * FROM task_monitors {where}", params)
    if long.is_empty():
        return pl.DataFrame(schema={"round": pl.Int64, "task": pl.String})
    wide = long.pivot(
        on="monitor", index=["round", "task"], values="value", aggregate_function="max"
    )
    top = long.filter(pl.col("monitor") == "kept_top_share").select(
        "round", "task", kept_top=pl.col("detail")
    )
    return wide.join(top, on=["round", "task"], how="left").sort("round", "task")


def tokens_by_round(lake: Lake, name: str | None = None) -> pl.DataFrame:
    """Tokens of each curated candidate (round, n_tokens, kept); unknown counts are skipped."""
    cte, params = _selections(name)
    return lake.query(
        f"""WITH {cte}
        SELECT s.round, c.n_tokens, s.kept
        FROM sel s JOIN candidates c USING (candidate_id)
        WHERE c.n_tokens IS NOT NULL
        ORDER BY s.round, c.n_tokens""",
        params,
    )


def round_table(lake: Lake, name: str | None = None) -> pl.DataFrame:
    """One row per round: held-out pass@k of model r beside the funnel of round r's data.

    Rounds with an eval but no curated data (the last model) have null counts, and the
    other way round.
    """
    evals = eval_by_round(lake, name)
    funnel = funnel_by_round(lake, name)
    difficulty = difficulty_by_round(lake, name)
    rounds = pl.concat(
        [f.select(pl.col("round").cast(pl.Int64)) for f in (evals, funnel, difficulty)]
    ).unique()
    table = (
        rounds.join(evals, on="round", how="left")
        .join(funnel, on="round", how="left")
        .join(difficulty, on="round", how="left")
        .sort("round")
    )
    metrics = [c for c in evals.columns if c != "round"]
    return table.select("round", *metrics, *ROUND_TABLE_COUNTS)


def forgetting_by_round(lake: Lake, name: str) -> pl.DataFrame:
    """Pass@1 of every round's model on each forgetting check (eval.also) of bootstrap
    `name`: check, round, pass@1 and the drop from the base model (round 0)."""
    long = lake.query(
        f"""SELECT substr(json_extract_string(r.config, '$.name'), length($name) + 2) AS "check",
                   e.round, e.value AS "pass@1"
            FROM evals e JOIN runs r USING (run_id)
            WHERE e.task = 'all' AND e.metric = 'pass@1' AND r.flow = 'evaluate'
              AND starts_with(json_extract_string(r.config, '$.name'), $name || '{FORGETTING}')
            QUALIFY row_number() OVER (
                PARTITION BY "check", e.round ORDER BY e.created_at DESC, e.run_id DESC) = 1
            ORDER BY "check", e.round""",
        {"name": name},
    )
    base = long.filter(pl.col("round") == 0).select("check", base=pl.col("pass@1"))
    return long.join(base, on="check", how="left").select(
        "check", "round", "pass@1", drop=(pl.col("base") - pl.col("pass@1")).round(4)
    )


def signal_by_round(lake: Lake, name: str | None = None) -> pl.DataFrame:
    """Per curated round, from the latest curate run of it (of pipeline `name`): prompts
    sampled, retired (difficulty.retire_after) and skipped as solved, and the share of
    prompts in the signal band."""
    where, params = _completed_runs("curate", name)
    return lake.query(
        f"""SELECT round, json_extract(summary, '$.prompts')::BIGINT AS prompts,
                   json_extract(summary, '$.skipped_solved')::BIGINT AS skipped_solved,
                   json_extract(summary, '$.retired')::BIGINT AS retired,
                   json_extract(summary, '$.band.share')::DOUBLE AS in_band
            FROM runs WHERE {where}
            QUALIFY row_number() OVER (PARTITION BY round ORDER BY finished_at DESC) = 1
            ORDER BY round""",
        params,
    )


def best_and_rollbacks(lake: Lake, name: str | None = None) -> tuple[int | None, list[tuple]]:
    """The round whose model has the best held-out pass@1 (None: no evals), and, from the
    pipeline's latest bootstrap run, each round that sampled with an earlier model
    (round, the model's round)."""
    import json

    evals = eval_by_round(lake, name)
    best = None
    if "pass@1" in evals.columns and evals.height:
        best = int(evals.sort(["pass@1", "round"], descending=[True, False])["round"][0])
    where, params = _completed_runs("bootstrap", name)
    runs = lake.query(
        f"SELECT summary FROM runs WHERE {where} ORDER BY finished_at DESC LIMIT 1", params
    )
    rounds = json.loads(runs["summary"][0] or "{}").get("rounds", []) if runs.height else []
    rolled = [
        (r["round"], r["sampled_with"])
        for r in rounds
        if r.get("sampled_with") is not None and r["sampled_with"] != r["round"]
    ]
    return best, rolled


def pipeline_names(lake: Lake) -> list[str]:
    """Config names of the lake's curate and evaluate runs, sorted."""
    rows = lake.query(
        """SELECT DISTINCT json_extract_string(config, '$.name') AS name FROM runs
           WHERE flow IN ('curate', 'evaluate') AND name IS NOT NULL ORDER BY name"""
    )
    return rows["name"].to_list()


def training_mix(lake: Lake, name: str | None = None) -> pl.DataFrame:
    """Per trained model (the latest completed train run of each round, of pipeline `name`)
    the sources of its training mix (train.mix): weight, share, rows available and used,
    their share, rows repeated. Empty when no run trained on a mix."""
    where, params = "status = 'completed'", []
    if name is not None:
        where += " AND pipeline = ?"
        params.append(name)
    return lake.query(
        f"""SELECT round AS model, source, weight, share, available, rows, row_share, repeated
            FROM train_mix WHERE {where} AND run_id IN (
                SELECT run_id FROM runs WHERE flow = 'train' AND status = 'completed'
                QUALIFY row_number() OVER (
                    PARTITION BY json_extract_string(config, '$.name'), round
                    ORDER BY finished_at DESC) = 1)
            ORDER BY model, position""",
        params,
    )


def monitors_by_round(lake: Lake, name: str | None = None) -> pl.DataFrame:
    """Per pipeline and curated round, its monitors (the `round_monitors` view, of pipeline
    `name` when given)."""
    where, params = ("WHERE pipeline = ?", [name]) if name is not None else ("", [])
    return lake.query(
        f"SELECT * FROM round_monitors {where} ORDER BY pipeline, round", params
    ).drop("selection_id")


Z95 = 1.959963984540054  # the normal quantile of a two-sided 95 % interval


def eval_prompt_rates(lake: Lake, name: str, lenient: bool = False) -> pl.DataFrame:
    """Per round and held-out prompt of pipeline `name`'s evaluations: task, samples n,
    passing c and rate c/n, from each round's latest completed evaluate run, judged as that
    run judged (its verifiers' digests and rule; with `lenient`, without the asked format
    where the run judged it)."""
    import json

    where, params = _completed_runs("evaluate", name)
    runs = lake.query(
        f"""SELECT run_id, round, config FROM runs WHERE {where}
            QUALIFY row_number() OVER (PARTITION BY round ORDER BY started_at DESC) = 1
            ORDER BY round""",
        params,
    )
    frames = []
    for run in runs.iter_rows(named=True):
        try:
            cfg = EvalConfig(**json.loads(run["config"]))
        except (ValueError, TypeError):  # a run recorded without its whole config
            continue
        if cfg.prompts.split != "eval" or cfg.final:
            continue
        ids = eval_candidate_ids(lake, cfg)
        rules = protocol_rules(cfg)
        rule = rules.get(" lenient", rules[""]) if lenient else rules[""]
        counts = pass_counts(lake, ids, rule, plan_eval(cfg).digests)
        frames.append(
            counts.with_columns(
                round=pl.lit(run["round"], pl.Int64), rate=pl.col("c") / pl.col("n")
            )
        )
    if not frames:
        return pl.DataFrame(
            schema={"round": pl.Int64, "prompt_id": pl.String, "task": pl.String,
                    "reference": pl.String}
        )  # fmt: skip
    return pl.concat(frames).select("round", "prompt_id", "task", "reference", "n", "c", "rate")


def eval_candidate_ids(lake: Lake, cfg: EvalConfig) -> list[str]:
    """The candidates an evaluation judged, by their identity (prompts, model, round, n and
    sampling): a run that reused another's samples (its verifiers changed) owns none."""
    plan = plan_eval(cfg)
    p = cfg.prompts
    prompt_ids = load_prompts(lake, p.dataset, p.split, p.limit, p.task)["prompt_id"].to_list()
    expected = expected_ids(prompt_ids, plan.model_id, plan.round, cfg.n, plan.params)
    present = existing_candidates(lake, expected)
    return [i for i in expected if i in present]


def _with_all(rates: pl.DataFrame) -> pl.DataFrame:
    return pl.concat([rates.with_columns(task=pl.lit("all")), rates])


def _interval(mean: str, spread: str) -> list[pl.Expr]:
    half = Z95 * pl.col(spread).fill_null(0) / pl.col("prompts").sqrt()
    return [(pl.col(mean) - half).alias("low"), (pl.col(mean) + half).alias("high")]


def task_pass_by_round(lake: Lake, name: str) -> pl.DataFrame:
    """Held-out pass@1 per task (and "all") and round, with its 95 % interval over prompts
    (mean of per-prompt pass rates; the normal interval of that mean)."""
    rates = eval_prompt_rates(lake, name)
    if rates.is_empty():
        return pl.DataFrame(schema={"task": pl.String, "round": pl.Int64})
    return (
        _with_all(rates)
        .group_by("task", "round")
        .agg(prompts=pl.len(), pass_at_1=pl.col("rate").mean(), sd=pl.col("rate").std())
        .with_columns(_interval("pass_at_1", "sd"))
        .drop("sd")
        .sort(pl.col("task") != "all", "task", "round")
    )


def gain_by_task(lake: Lake, name: str, round_: int | None = None) -> pl.DataFrame:
    """Round `round_`'s model (default: the last evaluated) against the base model (round
    0) on the prompts both saw: mean per-prompt pass@1 difference per task (and "all"),
    with its 95 % interval (paired over prompts)."""
    return _paired_gain(eval_prompt_rates(lake, name), round_)


def _paired_gain(rates: pl.DataFrame, round_: int | None = None) -> pl.DataFrame:
    if rates.is_empty() or rates["round"].min() != 0:
        return pl.DataFrame(schema={"task": pl.String})
    last = rates["round"].max() if round_ is None else round_
    base = rates.filter(pl.col("round") == 0).select("prompt_id", "task", base="rate")
    then = rates.filter(pl.col("round") == last).select("prompt_id", after="rate")
    paired = base.join(then, on="prompt_id").with_columns(diff=pl.col("after") - pl.col("base"))
    return (
        _with_all(paired)
        .group_by("task")
        .agg(
            prompts=pl.len(),
            base=pl.col("base").mean(),
            after=pl.col("after").mean(),
            gain=pl.col("diff").mean(),
            sd=pl.col("diff").std(),
        )
        .with_columns(_interval("gain", "sd"), round=pl.lit(last, pl.Int64))
        .drop("sd")
        .sort(pl.col("task") != "all", "task")
        .select("task", "round", "prompts", "base", "after", "gain", "low", "high")
    )


def modal_flags(rates: pl.DataFrame) -> pl.DataFrame:
    """`rates` with `modal`: the prompt's reference is its task's commonest answer (as
    `thresher.answers.answer_key` spells answers; ties go to the first in order)."""
    keyed = rates.with_columns(
        key=pl.col("reference").map_elements(answer_key, return_dtype=pl.String)
    )
    prompts = keyed.unique("prompt_id").filter(pl.col("key").is_not_null())
    counts = prompts.group_by("task", "key").agg(k=pl.len().cast(pl.Int64))
    counts = counts.sort(["task", "k", "key"], descending=[False, True, False])
    modal = counts.unique("task", keep="first").select("task", modal_key="key")
    return keyed.join(modal, on="task", how="left").with_columns(
        modal=(pl.col("key") == pl.col("modal_key")).fill_null(False)
    )


def prior_by_task(lake: Lake, name: str, round_: int | None = None) -> pl.DataFrame:
    """Gains above the answer prior, per task (and "all"): the constant-answer baseline
    (share of held-out prompts whose reference is the task's commonest answer, with its
    Wilson 95 % interval), pass@1 and its paired gain over the base model, and the same on
    the prompts whose reference is not the commonest (`non_modal_*`)."""
    rates = eval_prompt_rates(lake, name)
    if rates.is_empty() or rates["round"].min() != 0:
        return pl.DataFrame(schema={"task": pl.String})
    flagged = modal_flags(rates)
    base = flagged.filter(pl.col("round") == 0)
    shares = _with_all(base).group_by("task").agg(prompts=pl.len(), hits=pl.col("modal").sum())
    bounds = [wilson_interval(int(h), int(n)) for h, n in shares.select("hits", "prompts").rows()]
    shares = shares.with_columns(
        constant_answer=pl.col("hits") / pl.col("prompts"),
        ca_low=pl.Series([b[0] for b in bounds]),
        ca_high=pl.Series([b[1] for b in bounds]),
    ).drop("hits")
    every = _paired_gain(rates, round_).drop("prompts")
    other = _paired_gain(flagged.filter(~pl.col("modal")).drop("key", "modal_key", "modal"), round_)
    other = other.select(
        "task",
        non_modal_prompts="prompts",
        non_modal_base="base",
        non_modal_after="after",
        non_modal_gain="gain",
        nm_low="low",
        nm_high="high",
    )
    return (
        shares.join(every, on="task", how="left")
        .join(other, on="task", how="left")
        .sort(pl.col("task") != "all", "task")
    )


def test_strength_tables(lake: Lake) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Test strength per dataset and suite (`test_strength_summary`), and the weak prompts
    of the original suites (`weak_prompts`, weakest first); empty without audits."""
    summary = lake.query("SELECT * FROM test_strength_summary")
    weak = lake.query(
        "SELECT dataset, prompt_id, reference_passes, round(kill_rate, 4) AS kill_rate, "
        "mutants, killed, equivalent, note FROM weak_prompts WHERE suite = 'original' "
        "ORDER BY kill_rate NULLS FIRST, dataset, prompt_id LIMIT 50"
    )
    return summary, weak
