"""Change a setting, recompute only what it touches (real engine, real Prefect, real lake).

One pipeline is run again and again with one setting changed each time; each run must
sample, verify and select exactly what its change requires, reuse the rest, and say so.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from thresher.config import CurateConfig, EvalConfig, TrainConfig
from thresher.flows.cli.pipelines import reuse_line
from thresher.flows.curate import run_curate
from thresher.flows.evaluate import run_eval
from thresher.flows.train import run_train
from thresher.identities import selection_id_for
from thresher.ingest.load import ingest
from thresher.stores.lake import Lake

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "arithmetic"
PROMPTS = 40


def config(model, **changes) -> CurateConfig:
    base = dict(
        name="knobs",
        model=str(model),
        batch_size=16,
        prompts={"dataset": "arith"},
        sampling={"k": 4, "max_tokens": 24, "temperature": 1.0},
        engine={"dtype": "float32", "max_model_len": 256},
        verify={"verifiers": ["exact"]},
        select={"cap": 1, "near_dup": False},
    )
    for key, value in changes.items():
        base[key] = {**base[key], **value}
    return CurateConfig(**base)


def per_prompt_kept(lake: Lake, selection_id: str) -> dict[str, int]:
    rows = lake.query(
        "SELECT prompt_id, count(*) FILTER (WHERE kept) AS k FROM selections "
        "WHERE selection_id = ? GROUP BY 1",
        [selection_id],
    )
    return dict(rows.rows())


def assert_nothing_doubled(lake: Lake) -> None:
    for table, key in (
        ("candidates", "candidate_id"),
        ("verdicts", "candidate_id, verifier, options_digest"),
        ("selections", "selection_id, candidate_id"),
    ):
        n = lake.query(f"SELECT count(*) AS n, count(DISTINCT ({key})) AS d FROM {table}")
        assert n["n"][0] == n["d"][0], f"{table} has repeated keys"


@pytest.fixture(scope="module")
def runs(tiny_model, tmp_path_factory):
    """The same pipeline run six ways, in order; (config, summary) of each."""
    lake = Lake(tmp_path_factory.mktemp("changes") / "lake")
    first = tmp_path_factory.mktemp("data") / "first.jsonl"
    first.write_text("".join((EXAMPLES / "train.jsonl").read_text().splitlines(True)[:PROMPTS]))
    ingest(lake, first, "arith", mapping={"prompt": "question"}, task="a")
    out = {}
    out["base"] = config(tiny_model)
    out["cap"] = config(tiny_model, select={"cap": 3})
    out["verifier"] = config(tiny_model, select={"cap": 3}, verify={"verifiers": ["exact", "math"]})
    out["more_k"] = config(
        tiny_model, select={"cap": 3}, verify={"verifiers": ["exact", "math"]}, sampling={"k": 6}
    )
    out["fewer_k"] = config(
        tiny_model, select={"cap": 3}, verify={"verifiers": ["exact", "math"]}, sampling={"k": 2}
    )
    summaries = {}
    for name, cfg in out.items():
        if name == "cap":  # through the command line, to read what it prints
            path = tmp_path_factory.mktemp("cfg") / "cap.yaml"
            path.write_text(yaml.safe_dump(cfg.model_dump()))
            res = subprocess.run(
                [sys.executable, "-m", "thresher.flows.cli", "curate", "-c", str(path)]
                + ["--lake", str(lake.root), "--no-progress"],
                capture_output=True,
                text=True,
            )
            assert res.returncode == 0, res.stderr[-2000:]
            summaries[name] = {"printed": res.stdout}
            runs_ = lake.query("SELECT summary FROM runs WHERE flow = 'curate'")["summary"]
            done = [json.loads(s) for s in runs_ if json.loads(s).get("selection_id")]
            sid = selection_id_for(cfg)
            summaries[name] |= next(s for s in done if s["selection_id"] == sid)
        else:
            summaries[name] = run_curate(cfg, lake.root, progress=False)
        assert_nothing_doubled(lake)
    return lake, out, summaries


def test_the_first_run_does_everything(runs):
    lake, cfgs, s = runs
    base = s["base"]
    assert (base["candidates"], base["sampled_now"]) == (PROMPTS * 4, PROMPTS * 4)
    assert base["verified_now"] == PROMPTS * 4 and base["selected_now"] == PROMPTS * 4
    assert base["changes"] is None
    assert max(per_prompt_kept(lake, base["selection_id"]).values()) <= 1
    assert reuse_line(base).endswith("; selected")


def test_a_new_cap_only_selects_again(runs):
    lake, cfgs, s = runs
    cap, base = s["cap"], s["base"]
    assert (cap["sampled_now"], cap["verified_now"]) == (0, 0)
    assert cap["selected_now"] == PROMPTS * 4
    assert cap["selection_id"] != base["selection_id"]
    kept = per_prompt_kept(lake, cap["selection_id"])
    assert max(kept.values()) <= 3 and cap["kept"] >= base["kept"]
    assert cap["kept"] == sum(kept.values())
    printed = cap["printed"]
    assert f"reused {PROMPTS * 4} candidates, {PROMPTS * 4} verdicts" in printed
    assert "sampled 0, verified 0; selected again (select.cap 1 -> 3)" in printed
    # the earlier selection is still there to query
    assert sum(per_prompt_kept(lake, base["selection_id"]).values()) == base["kept"]


def test_an_added_verifier_verifies_with_it_only(runs):
    lake, cfgs, s = runs
    v = s["verifier"]
    assert v["sampled_now"] == 0 and v["verified_now"] == PROMPTS * 4
    assert v["verdicts"] == PROMPTS * 4 * 2
    # after every run: one options digest per verifier, each candidate judged once by each
    per_verifier = lake.query(
        "SELECT verifier, count(DISTINCT options_digest) AS d, count(*) AS n, "
        "count(DISTINCT candidate_id) AS c FROM verdicts GROUP BY 1 ORDER BY 1"
    ).rows()
    assert per_verifier == [
        ("exact", 1, PROMPTS * 6, PROMPTS * 6),
        ("math", 1, PROMPTS * 6, PROMPTS * 6),
    ]
    assert any(c.startswith("verify.verifiers") for c in v["changes"])
    # kept now needs both verifiers' passes (the default rule), still at most 3 a prompt
    assert v["kept"] <= s["cap"]["kept"]
    assert max(per_prompt_kept(lake, v["selection_id"]).values()) <= 3


def test_a_larger_k_samples_only_the_new_indices_and_the_cap_holds_over_all(runs):
    lake, cfgs, s = runs
    more = s["more_k"]
    assert more["sampled_now"] == PROMPTS * 2 and more["candidates"] == PROMPTS * 6
    assert more["verified_now"] == PROMPTS * 2 * 2  # the new candidates, two verifiers
    idx = lake.query("SELECT sample_idx, count(*) FROM candidates GROUP BY 1 ORDER BY 1").rows()
    assert idx == [(i, PROMPTS) for i in range(6)]
    assert max(per_prompt_kept(lake, more["selection_id"]).values()) <= 3
    assert "sampling.k 4 -> 6" in more["changes"]


def test_a_smaller_k_reads_the_first_k(runs):
    lake, cfgs, s = runs
    fewer = s["fewer_k"]
    assert (fewer["sampled_now"], fewer["verified_now"]) == (0, 0)
    assert fewer["candidates"] == PROMPTS * 2 and fewer["selected_now"] == PROMPTS * 2
    used = lake.query(
        "SELECT max(c.sample_idx) AS top FROM selections s JOIN candidates c USING (candidate_id) "
        "WHERE s.selection_id = ?",
        [fewer["selection_id"]],
    )
    assert used["top"][0] == 1
    assert lake.count("candidates") == PROMPTS * 6  # nothing sampled, nothing removed


def test_views_read_the_latest_selection_of_each_round(runs):
    lake, cfgs, s = runs
    fewer = s["fewer_k"]
    funnel = dict(lake.query("SELECT outcome, candidates FROM funnel").rows())
    assert sum(funnel.values()) == PROMPTS * 2
    assert funnel.get("kept", 0) == fewer["kept"]
    yields = lake.query("SELECT candidates, kept FROM yield_by_round").rows()
    assert yields == [(PROMPTS * 2, fewer["kept"])]
    # an unchanged re-run of an earlier config makes its selection current again, redoing nothing
    again = run_curate(cfgs["cap"], lake.root, progress=False)
    assert (again["sampled_now"], again["verified_now"], again["selected_now"]) == (0, 0, 0)
    assert reuse_line(again).endswith(
        'reused the selection (sampling.k 2 -> 4; verify.verifiers ["exact", "math"] -> ["exact"])'
    )
    assert (
        dict(lake.query("SELECT outcome, candidates FROM funnel").rows()).get("kept")
        == again["kept"]
    )


def test_another_verifier_in_eval_writes_its_own_metrics(runs, tiny_model):
    lake, _, _ = runs
    ingest(
        lake,
        EXAMPLES / "eval.jsonl",
        "arith",
        split="eval",
        mapping={"prompt": "question"},
        task="a",
    )

    def evaluate(verifier):
        return run_eval(
            EvalConfig(
                name="knobs",
                model=str(tiny_model),
                prompts={"dataset": "arith", "split": "eval", "limit": 10},
                n=4,
                ks=[1, 4],
                sampling={"temperature": 1.0, "max_tokens": 24},
                engine={"dtype": "float32", "max_model_len": 256},
                verify={"verifiers": [verifier]},
            ),
            lake.root,
            progress=False,
        )

    math, exact = evaluate("math"), evaluate("exact")
    assert math["run_id"] != exact["run_id"]
    assert exact["verified_now"] == 40  # the same 40 candidates, judged by exact now
    for s in (math, exact):
        got = {m["metric"] for m in s["metrics"] if m["task"] == "all"}
        assert got == {"pass@1", "pass@4", "constant-answer", "pass@1 non-modal"}
    ids = set(lake.query("SELECT DISTINCT run_id FROM evals")["run_id"])
    assert {math["run_id"], exact["run_id"]} <= ids


def test_new_data_trains_again_and_the_same_data_does_not(runs, tiny_model, tmp_path):
    lake, cfgs, _ = runs
    train = TrainConfig(
        name="knobs",
        base_model=str(tiny_model),
        data={"round": 0, "pipeline": "knobs"},
        max_steps=2,
        batch_size=4,
        lora={"r": 4, "alpha": 8},
        out=str(tmp_path / "model"),
    )
    first = run_train(train, lake.root, progress=False)
    assert not first.get("already_trained") and first["steps"] == 2
    assert run_train(train, lake.root, progress=False).get("already_trained")
    # more prompts are ingested and curated: the round's data grows, so training runs again
    extra = tmp_path / "extra.jsonl"
    lines = (EXAMPLES / "train.jsonl").read_text().splitlines(True)
    extra.write_text("".join(lines[PROMPTS : PROMPTS + 20]))
    ingest(lake, extra, "arith", mapping={"prompt": "question"}, task="a")
    kept_before = first["rows"]
    curated = run_curate(cfgs["cap"], lake.root, progress=False)  # the same config
    assert curated["sampled_now"] == 20 * 4 and curated["prompts"] == PROMPTS + 20
    assert curated["kept"] > kept_before  # the tiny model solves some of these
    again = run_train(train, lake.root, progress=False)
    assert not again.get("already_trained")
    assert again["rows_digest"] != first["rows_digest"] and again["run_id"] != first["run_id"]
