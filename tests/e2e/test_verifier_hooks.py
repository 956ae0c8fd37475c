"""A verifier defined outside thresher's packages takes part in a pipeline through its
hooks alone: typed options, a gate before anything is sampled and a held-out role (real
Prefect, real vLLM engine, real lake)."""

import json

import pytest
import yaml
from helpers import ingest_arithmetic
from pydantic import Field
from typer.testing import CliRunner

from thresher.config import BootstrapConfig, CurateConfig
from thresher.flows.cli import app
from thresher.flows.curate import run_curate
from thresher.flows.evaluate import run_eval
from thresher.flows.gates import pipeline_gates
from thresher.stores.lake import Lake
from thresher.verifiers import options_digest
from thresher.verifiers.base import GateRefused, Verdict, Verifier, map_rows

PROMPTS, K = 4, 2


class Brief(Verifier):
    """Pass a candidate whose text, stripped, has at most `max_chars` characters: the answer
    format these pipelines ask for. Its gate refuses a lake with fewer than `min_prompts`
    prompts."""

    name = "brief_e2e"
    operational = frozenset({"min_prompts"})  # the gate's setting: no verdict depends on it

    class Options(Verifier.Options):
        max_chars: int = Field(200, ge=1, description="longer answers fail")
        min_prompts: int = Field(0, ge=0, description="the gate: prompts the lake must hold")

    @classmethod
    def held_out_role(cls) -> str:
        return "asked_format"

    @classmethod
    def gate(cls, lake: Lake, options: Options, gates) -> dict:
        held = lake.count("prompts")
        if held < options.min_prompts:
            raise GateRefused(f"the lake holds {held} prompts, fewer than {options.min_prompts}")
        return {"prompts": held, "min_prompts": options.min_prompts}

    def run(self, batch):
        return map_rows(self.name, batch, self.check)

    def check(self, row: dict) -> Verdict:
        n = len(row["text"].strip())
        passed = n <= self.options.max_chars
        return Verdict(float(passed), passed, f"{n} characters")


def settings(tiny_model, **brief) -> dict:
    return dict(
        name="hooks",
        model=str(tiny_model),
        batch_size=PROMPTS,
        prompts={"dataset": "arith", "limit": PROMPTS},
        sampling={"k": K, "max_tokens": 16, "temperature": 0.8},
        engine={"dtype": "float32", "max_model_len": 256},
        verify={"verifiers": ["exact", Brief.name], "options": {Brief.name: brief}},
    )


def brief_verdicts(lake: Lake, digest: str) -> list[dict]:
    return lake.query(
        """SELECT c.text, v.passed, v.reason FROM verdicts v JOIN candidates c USING (candidate_id)
           WHERE v.verifier = ? AND v.options_digest = ?""",
        [Brief.name, digest],
    ).to_dicts()


def test_the_gate_refuses_before_anything_is_sampled(tiny_model, tmp_path):
    lake = Lake(tmp_path / "lake")
    ingest_arithmetic(lake)
    held = lake.count("prompts")
    path = tmp_path / "curate.yaml"
    path.write_text(yaml.safe_dump(settings(tiny_model, min_prompts=held + 1)))
    result = CliRunner().invoke(app, ["curate", "-c", str(path), "--lake", str(lake.root)])
    assert result.exit_code == 1, result.output
    assert f"the lake holds {held} prompts, fewer than {held + 1}" in result.output
    assert "Traceback" not in result.output
    refused = CurateConfig(**settings(tiny_model, min_prompts=held + 1))
    with pytest.raises(GateRefused, match="fewer than"):
        run_curate(refused, lake.root, progress=False)
    assert lake.count("candidates") == 0
    # its options are checked before the gate runs, as typed
    bad = CurateConfig(**settings(tiny_model, max_chars=0))
    with pytest.raises(GateRefused, match="bad options for verifier 'brief_e2e': max_chars"):
        pipeline_gates(lake, bad)


def test_curate_and_eval_with_a_verifier_of_its_own(tiny_model, tmp_path):
    lake = Lake(tmp_path / "lake")
    ingest_arithmetic(lake)
    ingest_arithmetic(lake, split="eval", source="eval")

    # the gate passes: its figure is what the run records
    loose = CurateConfig(**settings(tiny_model, max_chars=1000, min_prompts=1))
    figure = pipeline_gates(lake, loose)
    assert figure == {"prompts": lake.count("prompts"), "min_prompts": 1}
    first = run_curate(loose, lake.root, progress=False)
    assert first["candidates"] == PROMPTS * K
    run = lake.query("SELECT summary FROM runs WHERE run_id = ?", [first["run_id"]])
    assert figure in json.loads(run["summary"][0]).values()

    # its typed option decides its verdicts: every candidate fits 1000 characters, none 1
    tight = CurateConfig(**settings(tiny_model, max_chars=1, min_prompts=1))
    second = run_curate(tight, lake.root, progress=False)
    assert second["sampled_now"] == 0  # the same candidates, judged again
    for cfg, limit in ((loose, 1000), (tight, 1)):
        rows = brief_verdicts(lake, options_digest(Brief.name, cfg.verify.options[Brief.name]))
        assert len(rows) == PROMPTS * K
        assert all(r["passed"] == (len(r["text"].strip()) <= limit) for r in rows)
        assert all(r["reason"] == f"{len(r['text'].strip())} characters" for r in rows)
    # all must pass: under the tight option none does, under the loose one those `exact` passes
    exact_passes = lake.query(
        "SELECT count(DISTINCT candidate_id) FROM verdicts WHERE verifier = 'exact' AND passed"
    )[0, 0]
    assert first["passed"] == exact_passes and second["passed"] == 0
    # the gate's own option is operational: the verdicts' identity leaves it out
    assert options_digest(Brief.name, {"max_chars": 1, "min_prompts": 1}) == options_digest(
        Brief.name, {"max_chars": 1}
    )

    # its held-out role: a bootstrap evaluates with it beside the reference check, and a
    # restating round leaves it out of the rule
    boot = BootstrapConfig(
        **{k: v for k, v in settings(tiny_model, max_chars=1000).items() if k != "model"},
        base_model=str(tiny_model),
        eval={"prompts": {"dataset": "arith", "split": "eval", "limit": PROMPTS}, "n": 2,
              "ks": [1, 2]},
        format={"tag": "answer"},
    )  # fmt: skip
    held_out = boot.eval_verify()
    assert held_out.verifiers == ["exact", Brief.name]
    assert held_out.options == {Brief.name: {"max_chars": 1000}}
    assert boot.verify.with_reference().verifiers == ["exact"]
    assert boot.curate_config(0, str(tiny_model), restate=True).verify.rule == "exact"

    # ...and the evaluation reports the lenient reading and its share as `format`
    summary = run_eval(boot.eval_config(0, str(tiny_model)), lake.root, progress=False)
    metrics = {m["metric"]: m["value"] for m in summary["metrics"] if m["task"] == "all"}
    assert {"pass@1", "pass@2", "pass@1 lenient", "pass@2 lenient", "format"} <= set(metrics)
    verdicts = lake.query(
        """SELECT v.verifier, avg(v.passed::INT) AS rate FROM verdicts v
           JOIN candidates c USING (candidate_id) JOIN prompts p USING (prompt_id)
           WHERE p.split = 'eval' GROUP BY 1"""
    )
    rates = dict(zip(verdicts["verifier"], verdicts["rate"], strict=True))
    assert set(rates) == {"exact", Brief.name}
    assert metrics["format"] == pytest.approx(rates[Brief.name])
    assert metrics["pass@1 lenient"] == pytest.approx(rates["exact"])
