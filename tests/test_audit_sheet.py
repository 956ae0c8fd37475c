"""The audit sheet as a person uses it: drawn from a real lake, opened in headless
Chromium, a few rows marked, the CSV exported by the page and imported by the CLI; and
the stratified draw itself."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest
from selenium.webdriver.common.by import By
from typer.testing import CliRunner

from thresher.evaluators.audit_sheet import allocate, write_sheet
from thresher.flows.cli import app

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def sheet_lake(lake):
    """Pipeline `demo`, round 0: 6 prompts x 4 candidates, verified by math and format,
    selected (cap 1); one answer cut at max_tokens, one text with HTML and a comma."""
    prompts, cands, verdicts, sels = [], [], [], []
    for p in range(6):
        pid = f"p{p}"
        prompts.append({"prompt_id": pid, "dataset": "d", "split": "train", "task": "arith",
                        "prompt": f"What is {p} + {p}?", "answer": str(2 * p)})  # fmt: skip
        kept = False
        for i in range(4):
            cid = f"{pid}-{i}"
            answer = 2 * p if i % 2 == 0 else 2 * p + 1
            text = f" {p} + {p} = {answer}. The answer is {answer}."
            if p == 5 and i == 3:
                text = ' <b>"tricky"</b>, with a comma and\na newline'
            cands.append({"candidate_id": cid, "prompt_id": pid, "round": 0, "model": "m",
                          "sample_idx": i, "text": text, "created_at": T0,
                          "finish_reason": "length" if (p, i) == (4, 0) else "stop"})  # fmt: skip
            right = answer == 2 * p and "tricky" not in text
            fmt = i < 2  # the format verifier fails the last two of each prompt
            for name, ok in (("math", right), ("format", fmt)):
                verdicts.append({"candidate_id": cid, "verifier": name, "options_digest": "d",
                                 "passed": ok, "score": float(ok), "reason": f"{name} says {ok}",
                                 "created_at": T0})  # fmt: skip
            passed = right and fmt
            reason = None if passed and not kept else ("capped" if passed else "failed")
            kept = kept or passed
            sels.append({"selection_id": "s0", "round": 0, "candidate_id": cid,
                         "prompt_id": pid, "kept": reason is None, "drop_reason": reason,
                         "created_at": T0})  # fmt: skip
    lake.append("prompts", prompts)
    lake.append("candidates", cands)
    lake.append("verdicts", verdicts)
    lake.append("selections", sels)
    config = {"name": "demo", "verify": {"verifiers": ["math", "format"]}}
    lake.append("runs", [{"run_id": "r0", "flow": "curate", "round": 0, "selection_id": "s0",
                          "config": json.dumps(config), "status": "completed",
                          "started_at": T0, "updated_at": T0}])  # fmt: skip
    return lake


def test_allocation_spreads_what_small_strata_leave():
    assert allocate({"a": 1, "b": 50, "c": 50}, 21) == {"a": 1, "b": 10, "c": 10}
    assert allocate({"a": 3, "b": 4}, 100) == {"a": 3, "b": 4}
    assert sum(allocate({"a": 7, "b": 9, "c": 30}, 20).values()) == 20


def test_the_draw_covers_every_stratum(sheet_lake, tmp_path):
    sheet = write_sheet(sheet_lake, 0, tmp_path, "demo", n=8)
    assert sheet.rows == 8
    assert {"verifiers disagree", "cut at max_tokens"} <= set(sheet.strata)
    assert any("kept" in s for s in sheet.strata) and any("dropped" in s for s in sheet.strata)
    again = write_sheet(sheet_lake, 0, tmp_path / "again", "demo", n=8)
    assert again.sheet_id == sheet.sheet_id  # the same draw, the same sheet


def _wait_for(path, seconds: float = 20.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size > 0:
            return path
        time.sleep(0.1)
    raise AssertionError(f"{path} was not written")


def test_label_in_the_browser_export_and_import(sheet_lake, tmp_path, browser):
    sheet = write_sheet(sheet_lake, 0, tmp_path, "demo", n=24)
    browser.get(sheet.html.as_uri())
    cards = browser.find_elements(By.CSS_SELECTOR, ".row")
    assert len(cards) == 24
    progress = browser.find_element(By.ID, "progress")
    assert progress.text == "0 of 24 labelled"
    tricky = browser.find_element(By.CSS_SELECTOR, '.row[data-id="p5-3"]')
    assert '<b>"tricky"</b>' in tricky.text  # shown as text, not markup
    browser.find_element(By.ID, "who").send_keys("ana")
    marks = {"p0-0": "correct", "p0-1": "incorrect", "p5-3": "incorrect"}
    for cid, label in marks.items():
        card = browser.find_element(By.CSS_SELECTOR, f'.row[data-id="{cid}"]')
        card.find_element(By.CSS_SELECTOR, f'input[value="{label}"]').click()
    tricky.find_element(By.CSS_SELECTOR, "input.note").send_keys("markup, not an answer")
    assert progress.text == "3 of 24 labelled"

    browser.refresh()  # choices survive a reload
    checked = browser.find_elements(By.CSS_SELECTOR, "input[type=radio]:checked")
    assert len(checked) == 3
    assert browser.find_element(By.ID, "progress").text == "3 of 24 labelled"

    browser.find_element(By.ID, "export").click()
    exported = _wait_for(browser.download_dir / f"labels-{sheet.csv.name}")
    res = CliRunner().invoke(
        app, ["audit", "import", str(exported), "--lake", str(sheet_lake.root)]
    )
    assert res.exit_code == 0, res.output
    assert "3 labels imported" in res.output and "21 rows without a label" in res.output
    got = sheet_lake.query("SELECT candidate_id, label, who, note, sheet_id FROM labels")
    assert {r["candidate_id"]: r["label"] for r in got.to_dicts()} == marks
    assert set(got["who"]) == {"ana"} and set(got["sheet_id"]) == {sheet.sheet_id}
    assert got.filter(got["candidate_id"] == "p5-3")["note"][0] == "markup, not an answer"
    again = CliRunner().invoke(
        app, ["audit", "import", str(exported), "--lake", str(sheet_lake.root)]
    )
    assert "0 labels imported, 3 already in the lake" in again.output
