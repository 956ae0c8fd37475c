"""`thresher eval`: pass@k of the tiny model on held-out prompts, into `evals`."""

import subprocess
import sys
from pathlib import Path

from thresher.ingest.load import ingest
from thresher.stores.lake import Lake

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "arithmetic"


def test_eval_writes_pass_at_k_and_resumes(tiny_model, tmp_path):
    lake = Lake(tmp_path / "lake")
    ingest(
        lake,
        EXAMPLES / "train.jsonl",
        dataset="arith",
        split="eval",
        mapping={"prompt": "question"},
        task="arithmetic",
    )
    cmd = [
        sys.executable,
        "-m",
        "thresher.flows.cli",
        "eval",
        "--model",
        str(tiny_model),
        "--dataset",
        "arith",
        "-k",
        "1",
        "-k",
        "4",
        "--n",
        "4",
        "--limit",
        "24",
        "--max-tokens",
        "24",
        "--dtype",
        "float32",
        "--lake",
        str(lake.root),
        "--no-progress",
    ]
    first = subprocess.run(cmd, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    evals = lake.query("SELECT task, metric, value, prompts, samples FROM evals ORDER BY 1, 2")
    got = {(r["task"], r["metric"]): r for r in evals.iter_rows(named=True)}
    assert set(got) == {
        ("all", "pass@1"),
        ("all", "pass@4"),
        ("arithmetic", "pass@1"),
        ("arithmetic", "pass@4"),
    }
    p1, p4 = got["all", "pass@1"]["value"], got["all", "pass@4"]["value"]
    assert 0 < p1 <= p4 <= 1 and got["all", "pass@1"]["prompts"] == 24
    # pass@1 is the plain pass rate of the samples
    rate = lake.query("SELECT avg(passed::INT) AS r FROM verdicts")["r"][0]
    assert abs(p1 - rate) < 1e-9
    assert lake.count("selections") == 0  # evaluation selects nothing
    assert "pass@4" in first.stdout

    second = subprocess.run(cmd, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr[-3000:]
    assert lake.count("candidates") == 24 * 4 and lake.count("evals") == 4
