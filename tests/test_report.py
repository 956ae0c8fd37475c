"""The round report: per-round numbers from a real lake, the HTML page, its plots, the CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from typer.testing import CliRunner

from thresher.evaluators.page import PLOTS, write_report
from thresher.evaluators.report import (
    difficulty_by_round,
    eval_by_round,
    forgetting_by_round,
    funnel_by_round,
    pass_rates_by_round,
    round_table,
    signal_by_round,
    tokens_by_round,
)
from thresher.flows.cli import app

T0 = datetime(2025, 1, 1, tzinfo=UTC)
PROMPTS = ("p0", "p1", "p2", "p3")

# Drop reason of each unhinted candidate (sample_idx 0..3) of each prompt, per round of
# pipeline "alpha". None = kept.
DUP, CAP, FAIL, CONT = "duplicate_of:x", "capped", "failed", "contaminated:e1"
ALPHA = {
    0: {
        "p0": [None, DUP, CAP, CAP],
        "p1": [FAIL] * 4,
        "p2": [None, CONT, FAIL, FAIL],
        "p3": [FAIL] * 4,
    },
    1: {
        "p0": [None, DUP, CAP, CAP],
        "p1": [None, FAIL, FAIL, FAIL],
        "p2": [None, DUP, CAP, FAIL],
        "p3": [FAIL] * 4,
    },
    2: {
        "p0": [None, DUP, CAP, CAP],
        "p1": [None, DUP, CAP, CAP],
        "p2": [None, DUP, CAP, CAP],
        "p3": [None, DUP, FAIL, FAIL],
    },
}
# Held-out pass@1 / pass@8 of model r of pipeline "alpha".
ALPHA_EVALS = {0: (0.25, 0.5), 1: (0.4, 0.6), 2: (0.55, 0.7), 3: (0.6, 0.8)}


def _run(run_id: str, flow: str, round_: int, name: str) -> dict:
    return {
        "run_id": run_id,
        "flow": flow,
        "round": round_,
        "model": f"m{round_}",
        "config": json.dumps({"name": name, "round": round_}),
        "status": "completed",
        "summary": "{}",
        "started_at": T0,
        "finished_at": T0,
        "updated_at": T0,
    }


def _curate(lake, name: str, round_: int, plan: dict, hinted: dict | None = None) -> None:
    """One curate run: a candidate per planned drop reason (plus hinted ones), selected."""
    run_id = f"{name}-curate-{round_}"
    cands, sels = [], []
    rows = [
        (p, i, reason, False) for p, reasons in plan.items() for i, reason in enumerate(reasons)
    ]
    rows += [
        (p, 100 + i, reason, True)
        for p, reasons in (hinted or {}).items()
        for i, reason in enumerate(reasons)
    ]
    for prompt_id, idx, reason, is_hinted in rows:
        cid = f"{run_id}-{prompt_id}-{idx}"
        # round 2's p3 came from a server that reported no token counts
        tokens = None if (round_ == 2 and prompt_id == "p3") else 10 * (round_ + 1) + idx % 100
        cands.append(
            {
                "candidate_id": cid,
                "prompt_id": prompt_id,
                "run_id": run_id,
                "round": round_,
                "model": f"m{round_}",
                "sample_idx": idx,
                "text": f"answer {cid}",
                "n_tokens": tokens,
                "finish_reason": "stop",
                "hinted": is_hinted,
                "created_at": T0,
            }
        )
        sels.append(
            {
                "round": round_,
                "candidate_id": cid,
                "prompt_id": prompt_id,
                "kept": reason is None,
                "drop_reason": reason,
                "run_id": run_id,
                "created_at": T0,
            }
        )
    lake.append("candidates", cands)
    lake.append("selections", sels)
    lake.append("runs", [_run(run_id, "curate", round_, name)])


def _eval(lake, name: str, round_: int, values: tuple[float, float], at: datetime, tag=""):
    run_id = f"{name}-eval-{round_}{tag}"
    rows = [
        {
            "round": round_,
            "model": f"m{round_}",
            "split": "eval",
            "task": "all",
            "metric": metric,
            "value": value,
            "prompts": 40,
            "samples": 8,
            "run_id": run_id,
            "created_at": at,
        }
        for metric, value in zip(("pass@8", "pass@1"), values[::-1], strict=True)
    ]
    lake.append("evals", rows)
    lake.append("runs", [_run(run_id, "evaluate", round_, name)])


def _audit(lake, name: str, round_: int, wrong: set[str]) -> None:
    """A `math` verdict (passed = not dropped as failed) and a label (correct = passed,
    except the candidates in `wrong`) for every candidate of one curate run."""
    run_id = f"{name}-curate-{round_}"
    rows = lake.query(
        "SELECT candidate_id, drop_reason FROM selections WHERE run_id = ?", [run_id]
    ).rows()
    verdicts, labels = [], []
    for cid, reason in rows:
        passed = reason != FAIL
        verdicts.append({"candidate_id": cid, "verifier": "math", "options_digest": "d",
                         "score": float(passed), "passed": passed, "reason": "r",
                         "created_at": T0})  # fmt: skip
        label = "correct" if passed != (cid in wrong) else "incorrect"
        labels.append({"label_id": cid, "candidate_id": cid, "who": "ana", "label": label,
                       "labelled_at": T0})  # fmt: skip
    lake.append("verdicts", verdicts)
    lake.append("labels", labels)


# Labelled wrongly by `math` in alpha's round 0: a pass that is wrong, a fail that is right.
ALPHA_WRONG = {"alpha-curate-0-p0-0", "alpha-curate-0-p1-0"}


@pytest.fixture
def rounds_lake(lake):
    """Pipeline alpha: 3 curated rounds and evals of models 0..3; pipeline beta: one round."""
    lake.append(
        "prompts",
        [{"prompt_id": p, "dataset": "d", "split": "train", "task": "math"} for p in PROMPTS],
    )
    for r, plan in ALPHA.items():
        _curate(lake, "alpha", r, plan, hinted={"p1": [None]} if r == 0 else None)
    for r, values in ALPHA_EVALS.items():
        _eval(lake, "alpha", r, values, T0 + timedelta(hours=r + 1))
    # an earlier evaluation of model 1, superseded by the later one
    _eval(lake, "alpha", 1, (0.1, 0.2), T0, tag="-old")
    # rows the report ignores: a per-task row, a train-split row
    lake.append(
        "evals",
        [
            {"round": 0, "split": "eval", "task": "math", "metric": "pass@1", "value": 0.99,
             "run_id": "alpha-eval-0", "created_at": T0 + timedelta(days=1)},
            {"round": 0, "split": "train", "task": "all", "metric": "pass@1", "value": 0.98,
             "run_id": "alpha-eval-0-train", "created_at": T0 + timedelta(days=1)},
        ],
    )  # fmt: skip
    # another pipeline in the same lake: round 0 only, all failed, evaluated later
    _audit(lake, "alpha", 0, ALPHA_WRONG)
    _audit(lake, "alpha", 1, set())
    _curate(lake, "beta", 0, {"p0": [FAIL] * 4})
    _eval(lake, "beta", 0, (0.9, 0.95), T0 + timedelta(days=2))
    from thresher.evaluators.monitors import record_monitors

    for name, rounds in (("alpha", ALPHA), ("beta", [0])):
        for r in rounds:
            record_monitors(lake, name, r, None)
    return lake


def _rows(df) -> dict[int, dict]:
    return {row["round"]: row for row in df.iter_rows(named=True)}


def test_round_table_of_one_pipeline(rounds_lake):
    table = round_table(rounds_lake, "alpha")
    assert table.columns[:3] == ["round", "pass@1", "pass@8"]
    rows = _rows(table)
    assert sorted(rows) == [0, 1, 2, 3]
    for r, (p1, p8) in ALPHA_EVALS.items():  # model 1's later eval wins over the earlier one
        assert rows[r]["pass@1"] == pytest.approx(p1) and rows[r]["pass@8"] == pytest.approx(p8)
    expected = {  # sampled, hinted, passed, duplicates, capped, contaminated, kept
        0: (17, 1, 7, 1, 2, 1, 3),
        1: (16, 0, 8, 2, 3, 0, 3),
        2: (16, 0, 14, 4, 6, 0, 4),
    }
    cols = ("sampled", "hinted", "passed", "duplicates", "capped", "contaminated", "kept")
    for r, counts in expected.items():
        assert tuple(rows[r][c] for c in cols) == counts, r
    # all_pass / all_fail by unhinted candidates: round 0's p1 passed only with a hint
    assert [(rows[r]["prompts"], rows[r]["all_pass"], rows[r]["all_fail"]) for r in (0, 1, 2)] == [
        (4, 1, 2),
        (4, 1, 1),
        (4, 3, 0),
    ]
    # model 3 was evaluated, but its round was never curated
    assert rows[3]["sampled"] is None and rows[3]["kept"] is None


def test_name_filter_excludes_other_pipelines(rounds_lake):
    alpha, everything = _rows(round_table(rounds_lake, "alpha")), _rows(round_table(rounds_lake))
    assert alpha[0]["pass@1"] == pytest.approx(0.25)
    assert everything[0]["pass@1"] == pytest.approx(0.9)  # beta's eval of round 0 is newer
    assert alpha[0]["sampled"] == 17 and everything[0]["sampled"] == 17 + 4
    # pooled with beta's four failures, alpha's all-pass p0 reads mixed
    assert (alpha[0]["all_pass"], alpha[0]["all_fail"]) == (1, 2)
    assert (everything[0]["all_pass"], everything[0]["all_fail"]) == (0, 2)
    beta = _rows(round_table(rounds_lake, "beta"))
    assert sorted(beta) == [0]
    assert (beta[0]["pass@1"], beta[0]["sampled"], beta[0]["kept"]) == (0.9, 4, 0)
    assert set(pass_rates_by_round(rounds_lake, "beta")["prompt_id"]) == {"p0"}
    assert round_table(rounds_lake, "nobody").is_empty()


def test_funnel_matches_the_lake_view(rounds_lake):
    # without a name the report counts exactly what the SQL view shows
    assert funnel_by_round(rounds_lake).equals(rounds_lake.query("SELECT * FROM round_funnel"))


def test_difficulty_matches_the_lake_views(rounds_lake):
    assert difficulty_by_round(rounds_lake).equals(
        rounds_lake.query("SELECT * FROM difficulty_by_round")
    )
    view = rounds_lake.query(
        "SELECT round, prompt_id, pass_rate, kind FROM prompt_difficulty ORDER BY round, prompt_id"
    )
    assert pass_rates_by_round(rounds_lake).equals(view)


def test_per_prompt_rates_and_tokens(rounds_lake):
    rates = pass_rates_by_round(rounds_lake, "alpha").filter(round=1)
    got = {r["prompt_id"]: (r["pass_rate"], r["kind"]) for r in rates.iter_rows(named=True)}
    assert got == {
        "p0": (1.0, "all_pass"),
        "p1": (0.25, "mixed"),  # one kept, three failed
        "p2": (0.75, "mixed"),
        "p3": (0.0, "all_fail"),
    }
    tokens = tokens_by_round(rounds_lake, "alpha")
    counts = dict(tokens.group_by("round").len().iter_rows())
    assert counts == {0: 17, 1: 16, 2: 12}  # round 2's p3 has no token counts
    assert tokens.filter(round=1)["n_tokens"].sort().to_list() == sorted([20, 21, 22, 23] * 4)
    assert tokens.filter(round=0, kept=True).height == 3


def test_eval_columns_are_sorted_by_k(lake):
    rows = [
        {"round": 0, "split": "eval", "task": "all", "metric": m, "value": v, "run_id": "e"}
        for m, v in (("pass@16", 0.9), ("pass@2", 0.5), ("pass@1", 0.3), ("pass@8", 0.8))
    ]
    lake.append("evals", rows)
    assert eval_by_round(lake).columns == ["round", "pass@1", "pass@2", "pass@8", "pass@16"]


def _assert_png(path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    assert len(data) > 5000, (path, len(data))


def test_write_report_is_self_contained(rounds_lake, tmp_path):
    page = write_report(rounds_lake, tmp_path / "out", name="alpha")
    assert page == tmp_path / "out" / "index.html"
    for plot in PLOTS:
        _assert_png(page.parent / plot)
    text = page.read_text()
    assert "<td>0.5500</td>" in text and "<td>0.8000</td>" in text  # pass@1 of 2, pass@8 of 3
    assert "<td>17</td>" in text and "alpha" in text
    assert "<td>0.9000</td>" not in text  # beta's eval is not alpha's
    # every picture is embedded; nothing is fetched from elsewhere
    images = re.findall(r'<img [^>]*src="([^"]*)"', text)
    assert len(images) == len(PLOTS)
    assert all(src.startswith("data:image/png;base64,") for src in images)
    refs = re.findall(r"(?:src|href)\s*=\s*[\"']?([^\"'\s>]*)", text, re.IGNORECASE)
    assert len(refs) == len(PLOTS) and all(ref.startswith("data:") for ref in refs)
    assert "<link" not in text and "<script" not in text and "url(" not in text


def test_report_escapes_names(rounds_lake, tmp_path):
    name = "<b>x</b>"
    _eval(rounds_lake, name, 0, (0.5, 0.75), T0)
    text = write_report(rounds_lake, tmp_path / "out", name=name).read_text()
    assert "<b>x</b>" not in text and "&lt;b&gt;x&lt;/b&gt;" in text


def test_evals_without_curated_rounds_skip_those_plots(lake, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "funnel.png").write_bytes(b"stale")  # from an earlier report
    _eval(lake, "only-evals", 0, (0.3, 0.6), T0)
    _eval(lake, "only-evals", 1, (0.4, 0.7), T0)
    page = write_report(lake, out)
    _assert_png(out / "passk.png")
    for plot in ("funnel.png", "pass_rates.png", "tokens.png"):
        assert not (out / plot).exists(), plot
    text = page.read_text()
    assert "No curated rounds" in text and "<td>0.7000</td>" in text


def test_rounds_without_token_counts_skip_the_token_plot(lake, tmp_path):
    _curate(lake, "server", 2, {"p3": [None, FAIL, FAIL]})  # round 2's p3: n_tokens null
    page = write_report(lake, tmp_path / "out")
    for plot in ("funnel.png", "pass_rates.png"):
        _assert_png(page.parent / plot)
    assert not (page.parent / "tokens.png").exists() and not (page.parent / "passk.png").exists()
    text = page.read_text()
    assert "No token counts" in text and "No held-out evals" in text


def test_empty_lake_raises_a_clear_error(lake, tmp_path):
    with pytest.raises(ValueError, match="thresher bootstrap") as err:
        write_report(lake, tmp_path / "out")
    assert str(lake.root) in str(err.value)
    assert not (tmp_path / "out").exists()


def test_cli_report_prints_the_table_and_paths(rounds_lake, tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["report", "--lake", str(rounds_lake.root), "--name", "alpha"])
    assert res.exit_code == 0, res.output
    out = rounds_lake.root / "report"
    assert f"wrote {out / 'index.html'}" in res.output
    for plot in PLOTS:
        assert str(out / plot) in res.output
    header = next(line for line in res.output.splitlines() if "pass@1" in line)
    assert "sampled" in header and "all_fail" in header
    row2 = next(line for line in res.output.splitlines() if re.match(r"│ 2\s+┆", line))
    cells = [c.strip() for c in row2.strip("│").split("┆")]
    assert cells[:4] == ["2", "0.55", "0.7", "16"]
    # --out elsewhere
    res = runner.invoke(
        app, ["report", "--lake", str(rounds_lake.root), "--out", str(tmp_path / "r")]
    )
    assert res.exit_code == 0 and (tmp_path / "r" / "index.html").is_file()


def test_cli_report_on_an_empty_or_missing_lake_fails_clearly(lake, tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["report", "--lake", str(lake.root)])
    assert res.exit_code == 1
    assert "thresher bootstrap" in res.output and "Traceback" not in res.output
    res = runner.invoke(app, ["report", "--lake", str(tmp_path / "nowhere")])
    assert res.exit_code == 1 and "no lake at" in res.output
    assert not (tmp_path / "nowhere").exists()


def test_cli_report_names_the_pipelines_when_the_name_matches_nothing(rounds_lake):
    res = CliRunner().invoke(app, ["report", "--lake", str(rounds_lake.root), "--name", "gamma"])
    assert res.exit_code == 1
    assert "'gamma'" in res.output and "alpha, beta" in res.output


PROBE = """
import json, sys
from thresher.flows.cli import app
try:
    app(sys.argv[1:], standalone_mode=False)
except SystemExit:
    pass
heavy = ("torch", "vllm", "transformers", "prefect", "datasets", "matplotlib")
print(json.dumps(sorted(m for m in heavy if m in sys.modules)), file=sys.stderr)
"""


def test_report_loads_only_what_it_needs(rounds_lake, tmp_path):
    def loaded(*args):
        res = subprocess.run(
            [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=tmp_path
        )
        return res, json.loads(res.stderr.strip().splitlines()[-1])

    res, mods = loaded("report", "--help")
    assert "--name" in res.stdout and mods == []
    res, mods = loaded("report", "--lake", str(rounds_lake.root))
    assert "wrote" in res.stdout and mods == ["matplotlib"]


def test_verifier_quality_per_round_against_a_hand_count(rounds_lake, tmp_path):
    from thresher.evaluators.audit import verifier_quality

    # round 0: 17 candidates, 7 passed; one pass labelled incorrect, one fail labelled correct
    q = verifier_quality(rounds_lake, "alpha")
    for verifier in ("math", "rule"):
        row = q.filter((q["verifier"] == verifier) & (q["round"] == 0)).row(0, named=True)
        assert (row["true_pass"], row["false_pass"], row["true_fail"], row["false_fail"]) == (
            6, 1, 9, 1)  # fmt: skip
        assert row["false_pass_rate"] == 0.1 and row["false_fail_rate"] == round(1 / 7, 4)
        assert row["false_pass_rate_low"] < 0.1 < row["false_pass_rate_high"] < 0.5
    one = q.filter(q["round"] == 1).row(0, named=True)
    assert one["false_pass"] == one["false_fail"] == 0 and one["precision"] == 1.0
    assert set(q["round"]) == {0, 1}  # round 2 has no labels
    text = write_report(rounds_lake, tmp_path / "out", name="alpha").read_text()
    assert "<h2>Verifier quality</h2>" in text and "<td>0.1 [0.018, 0.404]</td>" in text
    _assert_png(tmp_path / "out" / "verifier_quality.png")


def test_the_page_fits_the_window_in_a_browser(rounds_lake, tmp_path, browser):
    page = write_report(rounds_lake, tmp_path / "out", name="alpha")
    browser.set_window_size(1000, 900)
    browser.get(page.as_uri())
    width = browser.execute_script("return document.documentElement.clientWidth")
    # nothing sticks out of the page: no table or plot is cut at the right edge
    assert browser.execute_script("return document.documentElement.scrollWidth") <= width
    rights = browser.execute_script(
        "return Array.from(document.querySelectorAll('table, img'))"
        ".map(e => e.getBoundingClientRect().right)"
    )
    assert len(rights) >= 3 + len(PLOTS) and max(rights) <= width
    boxes = browser.execute_script(  # and no table needs scrolling in its own box either
        "return Array.from(document.querySelectorAll('.table'))"
        ".map(e => e.scrollWidth - e.clientWidth)"
    )
    assert len(boxes) >= 3 and max(boxes) <= 0
    images = browser.execute_script(
        "return Array.from(document.images).map(i => [i.complete, i.naturalWidth])"
    )
    assert len(images) == len(PLOTS) and all(done and w > 0 for done, w in images)
    shot = tmp_path / "report.png"
    assert browser.save_screenshot(str(shot))
    _assert_png(shot)


def test_forgetting_checks_and_the_signal_band_are_reported_apart(lake, tmp_path):
    for r in range(3):
        _curate(lake, "alpha", r, ALPHA[r])
    for r, values in ALPHA_EVALS.items():
        _eval(lake, "alpha", r, values, T0)
    # the forgetting check's evaluations are filed as alpha~general/eval
    drops = {0: 0.5, 1: 0.45, 2: 0.3}
    for r, value in drops.items():
        run_id = f"forget-{r}"
        lake.append("runs", [_run(run_id, "evaluate", r, "alpha~general/eval")])
        lake.append(
            "evals",
            [{"round": r, "model": f"m{r}", "split": "eval", "task": "all", "metric": "pass@1",
              "value": value, "prompts": 4, "samples": 8, "run_id": run_id,
              "created_at": T0}],
        )  # fmt: skip
    table = forgetting_by_round(lake, "alpha")
    assert table.to_dicts() == [
        {"check": "general/eval", "round": r, "pass@1": v, "drop": round(0.5 - v, 4)}
        for r, v in drops.items()
    ]
    # the rounds' own metric never mixes a forgetting check in, named or not
    want = [v[0] for v in ALPHA_EVALS.values()]
    assert eval_by_round(lake, "alpha")["pass@1"].to_list() == want
    assert eval_by_round(lake)["pass@1"].to_list() == want
    # retired prompts and the band's share come from each round's curate summary
    summaries = {
        0: {"retired": 0, "band": {"share": 0.25}},
        1: {"retired": 2, "band": {"share": 0.5}},
    }
    for r, summary in summaries.items():
        row = _run(f"alpha-curate-{r}", "curate", r, "alpha")
        later = T0 + timedelta(hours=1)
        lake.append("runs", [{**row, "summary": json.dumps(summary), "finished_at": later,
                              "updated_at": later}])  # fmt: skip
    signal = signal_by_round(lake, "alpha")
    assert signal["retired"].to_list() == [0, 2, None]
    assert signal["in_band"].to_list() == [0.25, 0.5, None]
    page = write_report(lake, tmp_path / "report", "alpha").read_text()
    assert "<h2>Forgetting checks</h2>" in page and "general/eval" in page
    assert "<h2>Prompts with signal</h2>" in page


def test_per_task_rates_read_an_evaluation_that_reused_anothers_samples(lake):
    """An evaluation re-run with other verifier options samples nothing: its candidates
    carry the first run's id, and its per-task rates still come from them."""
    from thresher.config import EvalConfig
    from thresher.evaluators.report import eval_prompt_rates, task_pass_by_round
    from thresher.identities import expected_ids
    from thresher.plan import plan_eval

    prompts = {"e0": "a", "e1": "a", "e2": "b"}
    lake.append(
        "prompts",
        [
            {"prompt_id": p, "dataset": "d", "split": "eval", "task": t, "prompt": p}
            for p, t in prompts.items()
        ],
    )
    first = EvalConfig(
        name="alpha", model="m0", prompts={"dataset": "d", "split": "eval"}, n=2, ks=[1, 2]
    )
    again = first.model_copy(update={"verify": {"verifiers": ["exact"]}})
    again = EvalConfig(**again.model_dump())
    cur = plan_eval(again)
    ids = expected_ids(list(prompts), cur.model_id, 0, 2, cur.params)
    lake.append(
        "candidates",
        [
            {
                "candidate_id": c,
                "prompt_id": list(prompts)[i // 2],
                "run_id": "eval-first",
                "round": 0,
                "model": cur.model_id,
                "sample_idx": i % 2,
                "text": "x",
            }
            for i, c in enumerate(ids)
        ],  # fmt: skip
    )
    digest = cur.digests["exact"]
    passed = [True, False, True, True, False, False]
    lake.append(
        "verdicts",
        [
            {
                "candidate_id": c,
                "verifier": "exact",
                "options_digest": digest,
                "score": float(p),
                "passed": p,
                "reason": "",
                "run_id": "eval-again",
            }
            for c, p in zip(ids, passed, strict=True)
        ],  # fmt: skip
    )
    run = _run("eval-again", "evaluate", 0, "alpha") | {"config": again.model_dump_json()}
    lake.append("runs", [run])
    rates = eval_prompt_rates(lake, "alpha").sort("prompt_id")
    assert rates["rate"].to_list() == [0.5, 1.0, 0.0]
    table = task_pass_by_round(lake, "alpha")
    assert dict(zip(table["task"], table["pass_at_1"], strict=True)) == {
        "all": pytest.approx(0.5),
        "a": 0.75,
        "b": 0.0,
    }


def test_the_report_shows_test_strength_when_audited(rounds_lake, tmp_path):
    from thresher.stores.tables import write_test_strength

    page = write_report(rounds_lake, tmp_path / "before", name="alpha")
    assert "Test strength" not in page.read_text()
    row = {"dataset": "code", "tests": "[]", "mutants": 10, "equivalent": 1, "survivors": "[]"}
    write_test_strength(
        rounds_lake,
        [
            {
                **row,
                "audit_id": "a1",
                "prompt_id": "p1",
                "suite": "original",
                "reference_passes": True,
                "killed": 6,
                "kill_rate": 6 / 9,
            },
            {
                **row,
                "audit_id": "a1",
                "prompt_id": "p1",
                "suite": "strengthened",
                "reference_passes": True,
                "killed": 9,
                "kill_rate": 1.0,
                "kept": 12,
            },
            {
                **row,
                "audit_id": "a2",
                "prompt_id": "p2",
                "suite": "original",
                "reference_passes": False,
                "mutants": 0,
                "killed": 0,
                "equivalent": 0,
                "note": "the reference fails its own tests: 0/1 tests passed",
            },
        ],
        run_id=None,
    )
    text = write_report(rounds_lake, tmp_path / "after", name="alpha").read_text()
    assert "<h2>Test strength</h2>" in text
    assert "<td>0.6667</td>" in text  # p1's original kill rate, a weak prompt
    assert "the reference fails its own tests" in text  # p2, flagged
    assert "<td>12</td>" in text  # tests added by the strengthened suite


def test_lenient_rates_judge_without_the_asked_format(lake):
    """An evaluation judged by `exact` and `answer_format`: its rates need both verdicts,
    the lenient ones only `exact`'s (what `compare --lenient` pairs)."""
    from thresher.config import EvalConfig
    from thresher.evaluators.report import eval_prompt_rates
    from thresher.identities import expected_ids
    from thresher.plan import plan_eval

    prompt = {"prompt_id": "e0", "dataset": "d", "split": "eval", "task": "a", "prompt": "q"}
    lake.append("prompts", [prompt])
    cfg = EvalConfig(
        name="fmt", model="m0", prompts={"dataset": "d", "split": "eval"}, n=4, ks=[1],
        verify={"verifiers": ["exact", "answer_format"]},
    )  # fmt: skip
    cur = plan_eval(cfg)
    ids = expected_ids(["e0"], cur.model_id, 0, 4, cur.params)
    lake.append(
        "candidates",
        [{"candidate_id": c, "prompt_id": "e0", "run_id": "ev", "round": 0,
          "model": cur.model_id, "sample_idx": i, "text": "x"} for i, c in enumerate(ids)],
    )  # fmt: skip
    digests = cur.digests
    right, in_format = [True, True, True, False], [True, False, False, True]
    lake.append(
        "verdicts",
        [{"candidate_id": c, "verifier": v, "options_digest": digests[v], "score": float(p),
          "passed": p, "reason": "", "run_id": "ev"}
         for v, col in (("exact", right), ("answer_format", in_format))
         for c, p in zip(ids, col, strict=True)],
    )  # fmt: skip
    lake.append("runs", [_run("ev", "evaluate", 0, "fmt") | {"config": cfg.model_dump_json()}])
    assert eval_prompt_rates(lake, "fmt")["rate"].to_list() == [0.25]
    assert eval_prompt_rates(lake, "fmt", lenient=True)["rate"].to_list() == [0.75]
