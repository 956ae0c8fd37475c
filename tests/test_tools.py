"""The code tool's loop with the real sandbox: a scripted model writes the code (the engine
cannot be made to write an attack), the sandbox runs it, its output is what comes back."""

import json
import socket
import subprocess
import sys

import polars as pl
import pytest

from thresher.config import ToolsConfig
from thresher.samplers.tools import Step, StepOut, sample_with_tools, tool_output
from thresher.sandbox import Limits, run_code
from thresher.segments import model_text, tool_spans

TOOLS = ToolsConfig(timeout_s=2, max_calls=2)


def scripted(turns: list[list[str]]):
    """A step function that plays each prompt's turns: turn i once i tool outputs are in
    its text, cut at the first stop string as an engine would."""
    calls = []

    def step(requests: list[Step]) -> list[list[StepOut]]:
        calls.append(len(requests))
        out = []
        for r in requests:
            script = turns[r.prompt]
            done = r.prefix.count("```output")
            i = 2 * done + int(r.prefix.endswith(TOOLS.open))  # after the opening marker: code
            text = script[i] if i < len(script) else ""
            hit = [(text.find(s) + len(s), s) for s in r.stop if s in text]
            reason = "stop"
            if hit:
                text = text[: min(hit)[0]]
            if len(text) // 4 > r.max_tokens:  # four characters a token, as the engine cuts
                text, reason = text[: 4 * r.max_tokens], "length"
            context = 10 + len(r.prefix) // 4  # a 10-token prompt, as an engine counts it
            if r.max_context is not None and context >= r.max_context:
                text, reason = "", "budget"
            out.append([StepOut(text, max(1, len(text) // 4), reason, context)] * r.n)
        return out

    return step, calls


def test_code_runs_in_the_sandbox_and_its_output_is_appended(tmp_path):
    code = "x = 23 * 47\nprint(x)"
    step, calls = scripted([[" Let me compute. ```python", f"\n{code}\n```", "So 1081."]])
    [[c]] = sample_with_tools(step, 1, 1, TOOLS, max_tokens=200)
    kinds = [s["kind"] for s in c.segments]
    assert kinds == ["text", "code", "output", "text"]
    assert c.segments[1]["code"] == code
    # the output is what Python itself prints for the code, in the configured block
    expected = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert c.segments[2]["output"] == expected.strip() == "1081"
    assert c.segments[2]["text"] == TOOLS.output.replace("{output}", "1081")
    assert c.segments[2]["status"] == "ok" and c.segments[2]["ms"] > 0
    assert "".join(s["text"] for s in c.segments) == c.text
    assert c.text.endswith("So 1081.") and c.finish_reason == "stop"
    assert calls == [1, 1, 1]  # the first step, the code, the answer after the output


def test_max_calls_ends_a_candidate_that_asks_for_one_more():
    step, _ = scripted(
        [[" a ```python", "\nprint(1)\n```", " b ```python", "\nprint(2)\n```", " c ```python"]]
    )
    tools = TOOLS.model_copy(update={"max_calls": 2})
    [[c]] = sample_with_tools(step, 1, 1, tools, max_tokens=200)
    assert c.finish_reason == "max_calls"
    assert [s["output"] for s in c.segments if s["kind"] == "output"] == ["1", "2"]
    assert c.text.endswith(" c ")  # the third block was never opened, nor run


def test_a_candidate_out_of_tokens_is_marked_length():
    step, _ = scripted([[" ```python", "\nprint(1)\n```", "x" * 400]])
    [[c]] = sample_with_tools(step, 1, 1, TOOLS, max_tokens=50)
    assert c.finish_reason == "length" and c.n_tokens >= 50


def test_a_total_budget_counts_the_tools_output():
    step, _ = scripted([[" ```python", "\nprint('y' * 150)\n```", "done"]])
    tools = TOOLS.model_copy(update={"max_total_tokens": 30})
    [[c]] = sample_with_tools(step, 1, 1, tools, max_tokens=500)
    # the output (150 characters, ~40 tokens) leaves no room: no step after it
    assert c.finish_reason == "budget" and not c.text.endswith("done")
    assert [s["kind"] for s in c.segments] == ["text", "code", "output"]


@pytest.mark.parametrize(
    ("code", "expect"),
    [
        ("print(open({ref!r}).read())", "FileNotFoundError"),
        (  # a port this test listens on: reachable from here, not from the sandbox
            "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "print('connected')",
            "Error",
        ),
        ("while True:\n    pass", "TimeoutError: time limit exceeded"),
        ("import os\nprint(os.environ.get('THRESHER_REFERENCE'))", "None"),
    ],
)
def test_code_cannot_reach_the_reference_outside_its_sandbox(tmp_path, monkeypatch, code, expect):
    reference = "REFERENCE-7568"
    monkeypatch.setenv("THRESHER_REFERENCE", reference)  # nor the pipeline's environment
    ref = tmp_path / "reference.txt"
    ref.write_text(reference)
    with socket.create_server(("127.0.0.1", 0)) as server:
        code = code.format(ref=str(ref), port=server.getsockname()[1])
        step, _ = scripted([[" ```python", f"\n{code}\n```", "The answer is 1."]])
        [[c]] = sample_with_tools(step, 1, 1, TOOLS, max_tokens=200)
    out = next(s for s in c.segments if s["kind"] == "output")
    assert expect in out["output"] and reference not in c.text
    assert "connected" not in out["output"]
    assert c.text.endswith("The answer is 1.")  # the model goes on after the error


def test_a_loop_stopped_by_its_cpu_limit_is_a_time_limit():
    """Whichever limit stops a loop first, wall clock or CPU time, the model hears time ran out."""
    [run] = run_code(["while True:\n    pass"], Limits(timeout_s=60, cpu_s=1))
    assert run.status == "timeout" and run.error == "time limit exceeded (CPU time)"
    assert tool_output(run, 1000) == "TimeoutError: time limit exceeded (CPU time)"


def test_errors_come_back_as_the_interpreter_prints_them():
    [run] = run_code(["print('before')\n1 / 0"])
    shown = tool_output(run, 1000)
    assert shown.startswith("before\nTraceback (most recent call last):")
    assert shown.endswith("ZeroDivisionError: division by zero")
    assert run.status == "error"
    long = tool_output(run_code(["print('z' * 5000)"])[0], 100)
    assert long.startswith("z" * 100) and "4900 more characters" in long


def test_segments_give_the_models_own_text_and_the_tools_spans():
    step, _ = scripted([[" A ```python", "\nprint(6 * 7)\n```", " B"]])
    [[c]] = sample_with_tools(step, 1, 1, TOOLS, max_tokens=200)
    segs = json.dumps(list(c.segments))
    [[a, b]] = tool_spans(c.text, segs)
    assert c.text[a:b] == TOOLS.output.replace("{output}", "42")
    assert model_text(c.text, segs) == c.text[:a] + c.text[b:]
    assert "42" not in model_text(c.text, segs)
    with pytest.raises(ValueError, match="do not add up"):
        tool_spans(c.text + "x", segs)


def test_a_printed_reference_is_not_the_models_answer(lake):
    """The math verifier, through the verify stage, on a candidate whose tool printed the
    reference and whose model never stated it: a fail; the same text as plain model text
    (no segments) passes, so the verdict is the segments' doing."""
    from thresher.config import CurateConfig
    from thresher.ingest.load import ingest
    from thresher.plan import Batch, plan_curate
    from thresher.samplers import candidate_rows
    from thresher.stores.tables import write_candidates
    from thresher.verifiers import stage as verification

    src = lake.root.parent / "p.jsonl"
    src.write_text(json.dumps({"prompt": "What is 88 * 86?", "answer": "7568"}) + "\n")
    ingest(lake, src, dataset="d", task="arithmetic")
    pid = lake.query("SELECT prompt_id FROM prompts")["prompt_id"][0]
    step, _ = scripted([[" ```python", "\nprint(88 * 86)\n```", " I am not sure."]])
    [[tooled]] = sample_with_tools(step, 1, 1, TOOLS, max_tokens=200)
    plain = type(tooled)(tooled.text, tooled.n_tokens, "stop")
    cfg = CurateConfig(
        name="t", model="m", prompts={"dataset": "d"}, verify={"verifiers": ["math"]}
    )
    plan = plan_curate(cfg)
    rows = candidate_rows(
        [pid], [[tooled, plain]], model="m", round_=0, run_id=plan.run_id, batch_id="b",
        params={"tools": True},
    )  # fmt: skip
    write_candidates(lake, rows)
    verification.run(lake, plan, cfg.verify, Batch(candidate_ids=[r["candidate_id"] for r in rows]))
    got = lake.query(
        "SELECT c.segments IS NOT NULL AS tool, v.passed, v.reason FROM verdicts v "
        "JOIN candidates c USING (candidate_id) ORDER BY tool"
    )
    assert got.height == 2 and "7568" in tooled.text
    assert got.filter(pl.col("tool"))["passed"].to_list() == [False]
    assert got.filter(~pl.col("tool"))["passed"].to_list() == [True]
