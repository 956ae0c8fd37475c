"""The reward-model gate end to end: a pipeline using the `reward` verifier runs only with a
reward model whose recorded pairwise accuracy is high enough, or when forced (real Prefect,
real vLLM engine, real lake)."""

import json

import pytest
import yaml
from helpers import ingest_arithmetic, tiny_curate
from typer.testing import CliRunner

from thresher.config import BootstrapConfig, CurateConfig
from thresher.flows.bootstrap import run_bootstrap
from thresher.flows.cli import app
from thresher.flows.curate import run_curate
from thresher.identities import run_id_for
from thresher.stores.lake import Lake
from thresher.stores.runs import latest_rm_check
from thresher.verifiers.reward import RewardModelRejected

PROMPTS, K = 2, 2


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args))
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def test_a_reward_model_must_pass_rm_check(tiny_model, tiny_reward_model, tmp_path):
    lake = Lake(tmp_path / "lake")
    ingest_arithmetic(lake)
    settings = tiny_curate(
        tiny_model,
        "rm-gate",
        {"dataset": "arith", "limit": PROMPTS},
        batch_size=PROMPTS,
        sampling={"k": K, "max_tokens": 16, "temperature": 0.8},
        verify={
            "verifiers": ["exact", "reward"],
            "rule": "exact",
            "options": {"reward": {"model": tiny_reward_model}},
        },
    )
    curate_yaml = tmp_path / "curate.yaml"
    curate_yaml.write_text(yaml.safe_dump(settings))
    boot = {
        **{k: settings[k] for k in ("name", "batch_size", "prompts", "sampling", "engine")},
        "verify": settings["verify"],
        "base_model": str(tiny_model),
        "eval": {"prompts": {"dataset": "arith", "split": "eval"}, "n": 1, "ks": [1]},
    }
    boot_yaml = tmp_path / "boot.yaml"
    boot_yaml.write_text(yaml.safe_dump(boot))
    where = ("--lake", str(lake.root), "--no-progress")

    # never checked: curate and bootstrap refuse before sampling anything
    for cmd, path in (("curate", curate_yaml), ("bootstrap", boot_yaml)):
        result = invoke(cmd, "-c", str(path), *where)
        assert result.exit_code == 1, result.output
        assert f"no pairwise accuracy recorded for reward model {tiny_reward_model}" in (
            result.output
        )
    # the commands check before starting a flow: nothing sampled, no run recorded
    assert lake.count("candidates") == 0 and lake.count("evals") == 0
    assert lake.count("runs") == 0

    # checked, below the bar: two of four pairs are ties, so at most 0.5
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        "".join(
            json.dumps({"prompt": q, "chosen": c, "rejected": r}) + "\n"
            for q, c, r in [
                ("What is 1 + 1?", " 2", " 3"),
                ("What is 2 * 3?", " 6", " 5"),
                ("What is 4 + 4?", " 8", " 8"),
                ("What is 5 - 1?", " 4", " 4"),
            ]
        )
    )
    result = invoke("rm-check", "-m", tiny_reward_model, "--pairs", str(pairs), "--lake", where[1])
    assert result.exit_code == 1, result.output
    check = latest_rm_check(lake, tiny_reward_model)
    assert check["ties"] == 2 and check["accuracy"] <= 0.5
    cfg = CurateConfig(**settings)
    with pytest.raises(RewardModelRejected) as refused:
        run_curate(cfg, lake.root, progress=False)
    assert f"pairwise accuracy {check['accuracy']:.2f} [{check['low']:.2f}" in str(refused.value)
    assert "(< 0.85, thresher rm-check at" in str(refused.value)
    with pytest.raises(RewardModelRejected, match="has pairwise accuracy"):
        run_bootstrap(BootstrapConfig(**boot), lake.root, progress=False)
    assert lake.count("candidates") == 0 and lake.count("evals") == 0
    # the flow itself refuses too (a scheduled run starts no command), and records why
    runs = lake.query("SELECT flow, status, summary FROM runs WHERE flow <> 'rm-check' ORDER BY 1")
    assert [(r["flow"], r["status"]) for r in runs.to_dicts()] == [
        ("bootstrap", "failed"),
        ("curate", "failed"),
    ]
    assert all("RewardModelRejected" in r for r in runs["summary"])

    # forced: the run goes on, and its summary records the figure it was forced past
    forced = CurateConfig(**{**settings, "gates": {"force_reward_model": True}})
    assert run_id_for(forced) == run_id_for(cfg)  # a gate setting resumes the same run
    summary = run_curate(forced, lake.root, progress=False)
    assert summary["candidates"] == PROMPTS * K and summary["sampled_now"] == PROMPTS * K
    figure = summary["reward_model_check"]
    assert figure["forced"] is True and figure["accuracy"] == check["accuracy"]
    assert figure["checked_at"] == check["checked_at"] and figure["pairs"] == 4
    verdicts = lake.query("SELECT verifier, count(*) AS n FROM verdicts GROUP BY 1 ORDER BY 1")
    assert verdicts.rows() == [("exact", PROMPTS * K), ("reward", PROMPTS * K)]
    run = lake.query("SELECT status, summary FROM runs WHERE run_id = ?", [summary["run_id"]]).row(
        0, named=True
    )
    assert run["status"] == "completed"
    assert json.loads(run["summary"])["reward_model_check"]["forced"] is True
