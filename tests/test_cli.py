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
    for cmd in ("ingest", "sql", "curate", "tables", "tiny-model"):
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
