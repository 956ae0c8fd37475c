"""Test strength: mutants of references, generated tests, the audit table, min_test_strength.

Everything runs through the real sandbox and a real lake; the MBPP and APPS rows in
tests/data/code-audit are written in those datasets' published layouts."""

import ast
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from thresher.config import SelectConfig
from thresher.flows.cli import app
from thresher.ingest.load import ingest
from thresher.sandbox import Limits
from thresher.selection.select import decide
from thresher.verifiers.mutants import (
    call_inputs,
    extend_tests,
    make_mutants,
    mutate_inputs,
    mutate_stdin,
)
from thresher.verifiers.strength import audit_dataset, audit_problems, problem_of, rows_of

DATA = Path(__file__).parent / "data" / "code-audit"
LIMITS = Limits(timeout_s=10, test_timeout_s=1)

# weak tests: f(3) alone; the reference clamps negatives to 0 and adds one
WEAK = {
    "prompt_id": "weak",
    "prompt": "Write f(x).",
    "tests": json.dumps(["assert f(3) == 4"]),
    "meta": json.dumps(
        {"reference_solution": "def f(x):\n    if x < 0:\n        return 0\n    return x + 1\n"}
    ),
}
# a stdin/stdout problem whose one test cannot tell most mutants apart
STDIO = {
    "prompt_id": "stdio",
    "prompt": "Print the larger of a and b, then their difference.",
    "tests": json.dumps([{"input": "5 5\n", "output": "5\n0\n"}]),
    "meta": json.dumps(
        {
            "reference_solution": "a, b = map(int, input().split())\n"
            "print(a if a > b else b)\nprint(abs(a - b))\n"
        }
    ),
}


def test_mutants_are_seeded_distinct_and_leave_docstrings_alone():
    code = (
        'def g(xs, k):\n    """Doc."""\n    out = [x for x in xs if x < k]\n'
        "    return len(out) + 1\n"
    )
    first = make_mutants(code, "g", 20, "p1")
    assert first == make_mutants(code, "g", 20, "p1")  # the same mutants on every run
    # two statements to drop, one operator, one comparison, one constant up and down
    assert sorted(k for k, _ in first) == [
        "comparison",
        "constant + 1",
        "constant - 1",
        "dropped statement",
        "dropped statement",
        "operator",
    ]
    assert len({c for _, c in first}) == 6
    assert len(make_mutants(code, "g", 3, "p1")) == 3
    for kind, mutant in first:
        ast.parse(mutant)
        assert mutant != code and '"""Doc."""' in mutant, kind
    assert make_mutants("def g(:\n", "g", 5, "p") == []  # does not parse: none


def test_inputs_come_from_the_tests_calls_and_keep_their_types():
    tests = (
        "def check(candidate):\n    assert candidate([1, 2], 'ab') == 3\n"
        "    assert candidate([], 'x') == 0\n"
    )
    seeds = call_inputs(tests, "f")
    assert seeds == [[[1, 2], "ab"], [[], "x"]]
    new = mutate_inputs(seeds, 50, "p")
    assert new and all(isinstance(a, list) and isinstance(b, str) for a, b in new)
    assert not any(args in seeds for args in new)
    assert new == mutate_inputs(seeds, 50, "p")
    stdin = mutate_stdin(["3\n1 5 2\n"], 1000, "p")
    assert "4\n1 5 2\n" in stdin and "3\n2 5 1\n" in stdin  # a number changed, reordered
    assert len(mutate_stdin(["3\n1 5 2\n"], 20, "p")) == 20
    assert all(len(t.split("\n")) == 3 for t in stdin)  # the layout is kept


def test_extended_check_code_runs_the_original_then_the_new_asserts():
    tests = "def check(candidate):\n    assert candidate(1) == 2\n"
    code = extend_tests(tests, ["assert candidate(5) == 6"], "f")
    ns: dict = {}
    exec(code, ns)
    ns["check"](lambda x: x + 1)
    with pytest.raises(AssertionError):
        ns["check"](lambda x: 2 if x == 1 else 0)


def _audit(row):
    problem, why = problem_of(row)
    assert problem is not None, why
    return audit_problems([problem], mutants=20, inputs=30, limits=LIMITS)[0]


@pytest.mark.parametrize("row", [WEAK, STDIO], ids=["function", "stdio"])
def test_weak_tests_are_measured_and_strengthened(row):
    audit = _audit(row)
    original, strong = rows_of(audit)
    assert audit.reference_passes and original["mutants"] >= 5
    assert original["kill_rate"] < 1  # one test lets mutants through
    survivors = [i for i, k in enumerate(audit.killed) if not k]
    different = [i for i in survivors if not audit.equivalent[i]]
    killed_now = [i for i in different if audit.killed_strong[i]]
    assert different and len(killed_now) >= 0.9 * len(different)
    assert strong["kill_rate"] > original["kill_rate"]
    assert strong["kept"] > 0 and strong["generated"] >= strong["kept"]
    # the strengthened suite: the original tests first, the reference passes all of it
    import polars as pl

    from thresher.verifiers.code import UnitTests

    reference = json.loads(row["meta"])["reference_solution"]
    batch = pl.DataFrame(
        {
            "candidate_id": ["ref"],
            "text": [reference],
            "prompt": [row["prompt"]],
            "tests": [strong["tests"]],
            "meta": [row["meta"]],
        }
    )
    verdict = UnitTests(timeout_s=20).run(batch).row(0, named=True)
    assert verdict["passed"], verdict["reason"]
    assert json.loads(strong["tests"])[: len(json.loads(row["tests"]))] == json.loads(row["tests"])


def test_a_reference_that_fails_its_tests_is_flagged_not_used():
    row = {**WEAK, "prompt_id": "bad", "tests": json.dumps(["assert f(3) == 5"])}
    audit = _audit(row)
    (only,) = rows_of(audit)
    assert not only["reference_passes"] and only["kill_rate"] is None
    assert "the reference fails its own tests" in only["note"] and not audit.mutants


def test_a_reference_that_hangs_or_crashes_on_a_generated_input_costs_only_that_input():
    code = (
        "def f(x):\n    if x == 4:\n        while True:\n            pass\n"
        "    if x < 0:\n        raise ValueError(x)\n    return x * 2\n"
    )
    row = {
        "prompt_id": "hangs",
        "prompt": "Double x.",
        "tests": json.dumps(["assert f(3) == 6", "assert f(1) == 2"]),
        "meta": json.dumps({"reference_solution": code}),
    }
    audit = _audit(row)
    assert audit.dropped.get("the reference ran out of time", 0) >= 1  # f(4)
    assert audit.dropped.get("the reference failed on it", 0) >= 1  # f(-3)
    answered = [x for x, _ in audit.answers]  # the kept inputs and the held-out ones
    assert [4] not in answered and [-3] not in answered and [0] in answered
    assert all(x in answered for x, _ in audit.kept)


def _lake_with(lake, tmp_path, path, dataset, preset):
    report = ingest(lake, path, dataset, preset=preset)
    assert report.rejected == 0
    return lake


@pytest.mark.parametrize(
    "path, preset", [(DATA / "mbpp.jsonl", "mbpp"), (DATA / "apps.jsonl", "apps")]
)
def test_audit_of_public_layouts_is_recorded_idempotent_and_in_the_views(
    lake, tmp_path, path, preset
):
    _lake_with(lake, tmp_path, path, preset, preset)
    first = audit_dataset(lake, preset, mutants=10, inputs=20, limits=LIMITS)
    n = sum(1 for _ in path.open())
    assert first["audited"] == n and not first["skipped"]
    again = audit_dataset(lake, preset, mutants=10, inputs=20, limits=LIMITS)
    assert again["audited"] == 0 and again["already"] == n  # a re-run audits nothing
    assert lake.count("test_strength") == 2 * n
    summary = {
        r["suite"]: r
        for r in lake.query(
            "SELECT * FROM test_strength_summary WHERE dataset = ?", [preset]
        ).to_dicts()
    }
    assert summary["original"]["prompts"] == n and summary["original"]["reference_fails"] == 0
    assert summary["strengthened"]["kill_rate"] >= summary["original"]["kill_rate"]
    assert summary["strengthened"]["tests_added"] > 0
    more = audit_dataset(lake, preset, mutants=12, inputs=20, limits=LIMITS)
    assert more["audited"] == n  # other settings: a new audit


def test_min_test_strength_drops_candidates_of_weak_and_unaudited_prompts():
    rows = [
        {
            "candidate_id": c,
            "prompt_id": p,
            "passed": True,
            "hinted": False,
            "has_tests": t,
            "text": f"text {c}",
            "finish_reason": "stop",
            "sample_idx": 0,
            "prompt": p,
            "messages": None,
            "n_tokens": 3,
            "score": 1.0,
        }
        for c, p, t in [
            ("a", "strong", True),
            ("b", "weak", True),
            ("c", "new", True),
            ("d", "math", False),
        ]
    ]
    spec = SelectConfig(min_test_strength=0.8, near_dup=False, policy="first")
    decide(rows, spec, kill_rates={"strong": 0.9, "weak": 0.75})
    reasons = {r["candidate_id"]: r["reason"] for r in rows}
    assert reasons == {"a": None, "b": "weak_tests:0.75", "c": "weak_tests:not audited", "d": None}
    # unset, the settings dump (and identify selections) as before
    from thresher.identities import fields_of

    assert "min_test_strength" not in fields_of(SelectConfig(), "selection")
    assert fields_of(SelectConfig(min_test_strength=0.8), "selection")["min_test_strength"] == 0.8


def test_cli_tests_audit_prints_both_suites(lake, tmp_path):
    _lake_with(lake, tmp_path, DATA / "apps.jsonl", "apps", "apps")
    args = [
        "tests-audit",
        "-d",
        "apps",
        "--mutants",
        "6",
        "--inputs",
        "10",
        "--lake",
        str(lake.root),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "5 audited now" in result.output
    assert "original" in result.output and "strengthened" in result.output
    again = CliRunner().invoke(app, args)
    assert "0 audited now, 5 audited before" in again.output
    missing = CliRunner().invoke(app, ["tests-audit", "-d", "nope", "--lake", str(lake.root)])
    assert missing.exit_code == 1 and "no prompts in dataset 'nope'" in missing.output


def test_the_code_verifier_can_judge_by_the_strengthened_tests(lake, tmp_path):
    from thresher.stores.queries import with_strengthened_tests
    from thresher.verifiers.code import UnitTests

    path = tmp_path / "weak.jsonl"
    rows = [{k: WEAK[k] for k in ("prompt", "tests", "meta")}]
    rows.append({**rows[0], "prompt": "Write f(x) again."})  # never audited
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert ingest(lake, path, "weak", task="code").ingested == 2
    audit_dataset(lake, "weak", limit=1, limits=LIMITS)
    prompts = lake.query("SELECT prompt_id, prompt, tests, meta FROM prompts ORDER BY prompt")
    wrong = "def f(x):\n    return x + 1\n"  # passes f(3) == 4, wrong for negatives
    import polars as pl

    batch = prompts.with_columns(
        pl.lit(wrong).alias("text"), pl.col("prompt_id").alias("candidate_id")
    )
    audited = lake.query("SELECT DISTINCT prompt_id FROM test_strength").item()
    original = UnitTests(timeout_s=20).run(batch)
    assert original["passed"].to_list() == [True, True]
    strong = UnitTests(timeout_s=20, tests="strengthened").run(with_strengthened_tests(lake, batch))
    by = {r["candidate_id"]: r for r in strong.to_dicts()}
    assert not by[audited]["passed"] and 0 < by[audited]["score"] < 1
    (other,) = [r for pid, r in by.items() if pid != audited]
    assert other["passed"] and "no strengthened tests for this prompt" in other["reason"]
