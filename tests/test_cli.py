import json
import subprocess
import sys

HEAVY = ("torch", "vllm", "transformers", "prefect", "datasets")

PROBE = """
import json, sys
from thresher.flows.cli import app
try:
    app(sys.argv[1:], standalone_mode=False)
except SystemExit:
    pass
print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)), file=sys.stderr)
"""


def loaded_after(args, tmp_path):
    res = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    return res, json.loads(res.stderr.strip().splitlines()[-1])


def test_help_and_sql_do_not_import_heavy_libraries(tmp_path, lake):
    res, loaded = loaded_after(["--help"], tmp_path)
    assert "curate" in res.stdout and loaded == []
    for cmd in (
        "ingest",
        "sql",
        "curate",
        "eval",
        "train",
        "tables",
        "verify",
        "export",
        "tiny-model",
    ):
        res, loaded = loaded_after([cmd, "--help"], tmp_path)
        assert "Usage" in res.stdout and loaded == [], (cmd, loaded)
    res, loaded = loaded_after(
        ["sql", "SELECT count(*) FROM prompts", "--lake", str(lake.root)], tmp_path
    )
    assert "count_star()" in res.stdout
    assert loaded == []


def test_curate_reports_bad_config_clearly(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: x\nmodel: m\nprompts: {dataset: d}\nsampling: {k: 0, temprature: 1}\n")
    res = subprocess.run(
        [sys.executable, "-m", "thresher.flows.cli", "curate", "-c", str(cfg)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2
    assert "sampling.k" in res.stderr and "sampling.temprature" in res.stderr
    assert "Traceback" not in res.stderr


def test_executor_option_is_validated(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "name: x\nmodel: m\nprompts: {dataset: d}\nserver: {base_url: 'http://127.0.0.1:1/v1'}\n"
    )
    run = [sys.executable, "-m", "thresher.flows.cli", "curate", "-c", str(cfg), "--executor"]
    res = subprocess.run([*run, "gpu"], capture_output=True, text=True)
    assert res.returncode == 2 and "'local' or 'ray'" in res.stderr
    res = subprocess.run([*run, "ray"], capture_output=True, text=True)  # ray runs engines
    assert res.returncode == 2 and "does not apply to a server" in res.stderr
    assert "Traceback" not in res.stderr


def test_verify_command_scores_an_external_file(tmp_path):
    src = tmp_path / "cands.jsonl"
    src.write_text(
        json.dumps({"id": "a", "prompt": "1+1?", "answer": "2", "completion": r"\boxed{2}"})
        + "\n"
        + json.dumps({"prompt": "2+2?", "answer": 4, "completion": "The answer is 5"})
        + "\n"
        + "not json\n"
        + json.dumps({"prompt": "no completion"})
        + "\n"
    )
    out = tmp_path / "verdicts.jsonl"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "thresher.flows.cli",
            "verify",
            str(src),
            "-v",
            "math",
            "-v",
            "format",
            "--options",
            '{"format": {"required": ["boxed"]}}',
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    errors = {r["line"]: r["error"] for r in rows if "error" in r}
    assert errors[3].startswith("invalid JSON") and errors[4].startswith("missing completion")
    got = {(r["candidate_id"], r["verifier"]): r["passed"] for r in rows if "verifier" in r}
    assert got == {
        ("a", "math"): True,
        ("line-2", "math"): False,
        ("a", "format"): True,
        ("line-2", "format"): False,
    }
    assert "math: 1/2 passed" in res.stderr and "2 malformed rows" in res.stderr


def test_export_command(lake, tmp_path):
    from thresher.config import SelectConfig
    from thresher.plan import RoundPlan
    from thresher.selection.select import select_batch

    lake.append(
        "prompts",
        [{"prompt_id": "p", "dataset": "d", "split": "train", "task": "t", "prompt": "Q?"}],
    )
    lake.append(
        "candidates",
        [
            {
                "candidate_id": "c",
                "prompt_id": "p",
                "run_id": "r",
                "round": 0,
                "sample_idx": 0,
                "text": "A.",
            }
        ],
    )
    lake.append("verdicts", [{"candidate_id": "c", "verifier": "exact", "passed": True}])
    select_batch(
        lake,
        RoundPlan(run_id=None, selection_id="r", round=0, rule=None, verifiers=()),
        SelectConfig(cap=1),
        ["c"],
    )
    cmd = [
        sys.executable,
        "-m",
        "thresher.flows.cli",
        "export",
        "--round",
        "0",
        "--to",
        str(tmp_path / "out"),
        "--lake",
        str(lake.root),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "wrote 1 sft rows" in res.stdout
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 1 and "not empty" in again.stderr
    none = subprocess.run(
        cmd[:5] + ["3", "--to", str(tmp_path / "x"), "--lake", str(lake.root)],
        capture_output=True,
        text=True,
    )
    assert none.returncode == 1 and "no kept candidates" in none.stderr


def test_export_best_copies_the_model_best_json_points_at(lake, tmp_path):
    import json

    models = lake.root / "models" / "star"
    for r in (0, 1, 2):
        (models / f"round-{r}" / "model").mkdir(parents=True)
        (models / f"round-{r}" / "model" / "config.json").write_text(json.dumps({"round": r}))
    (models / "best.json").write_text(
        json.dumps({"round": 1, "model": str(models / "round-1" / "model")})
    )
    base = [sys.executable, "-m", "thresher.flows.cli", "export", "--lake", str(lake.root)]
    out = tmp_path / "best"
    res = subprocess.run([*base, "--best", "--name", "star", "--to", str(out)],
                         capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "round 1" in res.stdout
    assert json.loads((out / "config.json").read_text()) == {"round": 1}
    nameless = subprocess.run([*base, "--best", "--to", str(tmp_path / "x")],
                              capture_output=True, text=True)  # fmt: skip
    assert nameless.returncode == 2 and "--name" in nameless.stderr
    unknown = subprocess.run([*base, "--best", "--name", "nobody", "--to", str(tmp_path / "y")],
                             capture_output=True, text=True)  # fmt: skip
    assert unknown.returncode == 1 and "no best model" in unknown.stderr
    neither = subprocess.run([*base, "--to", str(tmp_path / "z")], capture_output=True, text=True)
    assert neither.returncode == 2 and "--round" in neither.stderr
