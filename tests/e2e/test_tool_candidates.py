"""Candidates that call a code tool, end to end: the tiny tool model on the real vLLM
engine, its code run in the real sandbox, the turns kept in the lake, curated, evaluated,
shown in the report and the audit sheet, and a killed run resumed."""

import json
from pathlib import Path

import pytest
import yaml
from helpers import curate_cmd, kill_mid_run, resume_run

from thresher.config import CurateConfig, EvalConfig, ToolsConfig
from thresher.flows.curate import run_curate
from thresher.flows.evaluate import run_eval
from thresher.ingest.load import ingest
from thresher.samplers.tools import sandbox_runner, tool_output
from thresher.stores.lake import Lake

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tool-problems"
K, PROMPTS = 4, 24
TOOLS = {"max_calls": 2, "timeout_s": 5, "output_chars": 200}


def _config(tool_model, name: str, tools: dict, prompts: int = PROMPTS) -> CurateConfig:
    return CurateConfig(
        name=name,
        model=str(tool_model),
        batch_size=8,
        prompts={"dataset": "tool-problems", "limit": prompts},
        sampling={"k": K, "max_tokens": 64, "temperature": 1.0, "seed": 0, "tools": tools},
        engine={"dtype": "float32", "max_model_len": 256},
        verify={"verifiers": ["math"]},
        select={"cap": 4},
    )


def _ingest(lake: Lake) -> None:
    for split in ("train", "eval"):
        ingest(
            lake, EXAMPLES / f"{split}.jsonl", dataset="tool-problems", task="arithmetic",
            split=split,
        )  # fmt: skip


@pytest.fixture(scope="module")
def curated(tool_model, tmp_path_factory):
    lake = Lake(tmp_path_factory.mktemp("tools") / "lake")
    _ingest(lake)
    cfg = _config(tool_model, "tools", TOOLS)
    summary = run_curate(cfg, lake.root, progress=False)
    return lake, cfg, summary


def test_code_runs_in_the_sandbox_and_the_model_goes_on(curated):
    lake, cfg, _ = curated
    calls = lake.query("SELECT code, output, status FROM tool_calls ORDER BY candidate_id, call")
    assert calls.height >= PROMPTS * K // 2, "the tool model asks the tool most of the time"
    # each output is what the code prints when run again in the sandbox, as the model saw it
    runs = sandbox_runner(ToolsConfig(**TOOLS))(calls["code"].to_list())
    assert [tool_output(r, TOOLS["output_chars"]) for r in runs] == calls["output"].to_list()
    assert [r.status for r in runs] == calls["status"].to_list()

    rows = lake.query("SELECT text, segments FROM candidates WHERE segments IS NOT NULL")
    assert rows.height == PROMPTS * K
    went_on = 0
    for text, segments in rows.iter_rows():
        segs = json.loads(segments)
        assert "".join(s["text"] for s in segs) == text  # the stored text is every turn
        kinds = [s["kind"] for s in segs]
        for i, kind in enumerate(kinds):
            if kind == "output":
                assert kinds[i - 1] == "code"
                went_on += i + 1 < len(kinds) and kinds[i + 1] == "text"
    assert went_on >= calls.height // 2, "generation continues after the tool's output"


def test_the_model_states_the_answer_after_the_tool_and_passes(curated):
    lake, _, summary = curated
    passed = lake.query(
        """SELECT c.segments, p.answer FROM candidates c
           JOIN candidate_outcomes o ON o.candidate_id = c.candidate_id
           JOIN prompts p ON p.prompt_id = c.prompt_id WHERE o.passed"""
    )
    assert passed.height > 0 and summary["kept"] > 0
    for segments, answer in passed.iter_rows():
        own = "".join(s["text"] for s in json.loads(segments) if s["kind"] == "text")
        assert answer in own, "a pass rests on the model's own text, not the tool's output"


def test_tool_use_answers_calls_errors_and_time_per_candidate(curated):
    lake, _, _ = curated
    use = lake.query("SELECT * FROM tool_use")
    assert use.height == PROMPTS * K
    calls = lake.query("SELECT candidate_id, count(*) AS n FROM tool_calls GROUP BY 1")
    by_id = dict(calls.iter_rows())
    assert {r["candidate_id"]: r["calls"] for r in use.to_dicts() if r["calls"]} == by_id
    assert use["calls"].max() <= TOOLS["max_calls"]
    assert (use.filter(use["calls"] > 0)["tool_ms"] > 0).all()


def test_max_calls_stops_a_candidate_on_the_real_engine(curated, tool_model):
    """Plain fences as the markers: the model's ```python opens a block whose first line
    ("python") runs and fails, and the model's next fence asks for a second run."""
    lake, _, _ = curated
    tools = {**TOOLS, "max_calls": 1, "open": "```", "close": "\n"}
    run_curate(_config(tool_model, "one-call", tools, prompts=8), lake.root, progress=False)
    rows = lake.query(
        """SELECT c.finish_reason, c.segments FROM candidates c JOIN runs r USING (run_id)
           WHERE json_extract_string(r.config, '$.name') = 'one-call'"""
    )
    assert rows.height == 8 * K
    stopped = 0
    for reason, segments in rows.iter_rows():
        outs = [s for s in json.loads(segments) if s["kind"] == "output"]
        assert len(outs) <= 1
        if reason == "max_calls":
            stopped += 1
            assert len(outs) == 1 and "NameError: name 'python' is not defined" in outs[0]["text"]
    assert stopped > 0, "some candidate asked for a second run and was stopped"


def test_eval_with_tools_reports_tool_use_and_the_page_shows_it(curated, tool_model, tmp_path):
    from thresher.evaluators.page import write_report

    lake, _, _ = curated
    cfg = EvalConfig(
        name="tools-eval",
        model=str(tool_model),
        prompts={"dataset": "tool-problems", "split": "eval", "limit": 16},
        n=4,
        ks=[1, 4],
        sampling={"temperature": 1.0, "max_tokens": 64, "tools": TOOLS},
        engine={"dtype": "float32", "max_model_len": 256},
        verify={"verifiers": ["math"]},
    )
    summary = run_eval(cfg, lake.root, progress=False)
    got = {m["metric"]: m["value"] for m in summary["metrics"] if m["task"] == "all"}
    # the same figures counted by hand from the eval's candidates
    hand = lake.query(
        """SELECT avg(calls) AS calls, sum(tool_errors) / sum(calls) AS errors,
                  avg((calls > 0)::INT) AS used,
                  avg((calls > 0)::INT) FILTER (WHERE passed) AS used_passing
           FROM tool_use JOIN candidates USING (candidate_id) WHERE run_id = ?""",
        [summary["run_id"]],
    ).row(0, named=True)
    assert got["tool calls"] == pytest.approx(hand["calls"])
    assert got["tool errors"] == pytest.approx(hand["errors"])
    assert got["tool used"] == pytest.approx(hand["used"])
    assert got["tool used | passed"] == pytest.approx(hand["used_passing"])
    assert got["pass@1"] > 0

    page = write_report(lake, tmp_path / "report").read_text()
    assert "<h2>Tool use</h2>" in page and (tmp_path / "report" / "tools.png").exists()


def test_the_audit_sheet_shows_the_turns(curated, tmp_path):
    from thresher.evaluators.audit_sheet import write_sheet

    lake, _, _ = curated
    sheet = write_sheet(lake, 0, tmp_path, name="tools", n=12)
    page = sheet.html.read_text()
    assert page.count('class="seg-output"') >= 6
    assert "tool output (not the model&#x27;s)" in page
    assert "segments" in sheet.csv.read_text().splitlines()[0]


def test_a_killed_tool_run_resumes_without_duplicating_segments(tool_model, tmp_path):
    lake = Lake(tmp_path / "lake")
    _ingest(lake)
    prompts = 80
    cfg = {
        "name": "resume-tools",
        "model": str(tool_model),
        "batch_size": 8,
        "prompts": {"dataset": "tool-problems", "limit": prompts},
        "sampling": {"k": K, "max_tokens": 64, "temperature": 1.0, "tools": TOOLS},
        "engine": {"dtype": "float32", "max_model_len": 256},
        "verify": {"verifiers": ["math"]},
    }
    cfg_path = tmp_path / "tools.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    cmd = curate_cmd(cfg_path, lake.root)

    def committed() -> int:
        return len(Lake(lake.root).tables.files("candidates")[1])

    kill_mid_run(cmd, committed, 2)
    done = lake.count("candidates")
    assert 0 < done < prompts * K, "the kill must land mid-run"
    before = dict(lake.query("SELECT candidate_id, segments FROM candidates").iter_rows())

    resume_run(cmd, prompts * K - done)
    counts = lake.query(
        "SELECT count(*) AS n, count(DISTINCT candidate_id) AS ids, "
        "count(segments) AS with_segments FROM candidates"
    ).row(0, named=True)
    assert counts == {"n": prompts * K, "ids": prompts * K, "with_segments": prompts * K}
    after = dict(lake.query("SELECT candidate_id, segments FROM candidates").iter_rows())
    assert {c: after[c] for c in before} == before  # finished batches kept their turns
    dup = lake.query(
        "SELECT candidate_id, call, count(*) AS n FROM tool_calls GROUP BY ALL HAVING n > 1"
    )
    assert dup.is_empty()
