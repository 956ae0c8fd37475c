import json
import os
import subprocess
import sys
import textwrap

import pytest

from thresher.stores.sql import QueryRefused, check_read_only, run_sql

THRESHER = [sys.executable, "-m", "thresher.flows.cli"]


@pytest.mark.parametrize(
    "query",
    [
        "INSERT INTO prompts VALUES (1)",
        "CREATE TABLE x AS SELECT 1",
        "COPY (SELECT 1) TO 'out.csv'",
        "DELETE FROM prompts",
        "ATTACH 'other.db'",
        "SET threads = 1",
        "SELECT 1; SELECT 2",
    ],
)
def test_writes_and_multiple_statements_are_refused(query):
    with pytest.raises(QueryRefused):
        check_read_only(query)


@pytest.mark.parametrize(
    "query",
    [
        "SELECT 1",
        "WITH a AS (SELECT 1) SELECT * FROM a",
        "DESCRIBE prompts",
        "SHOW TABLES",
        "EXPLAIN SELECT 1",
        "FROM prompts",
    ],
)
def test_reads_are_allowed(lake, query):
    run_sql(lake, query)


def cli(args, lake_dir, **kw):
    env = {**os.environ, "THRESHER_LAKE": str(lake_dir)}
    return subprocess.run(THRESHER + args, capture_output=True, text=True, env=env, **kw)


def test_cli_formats_and_errors(lake):
    lake.append("prompts", [{"prompt_id": "a", "dataset": "d", "task": "t", "prompt": "x"}])
    out = cli(["sql", "SELECT prompt_id, task FROM prompts", "--format", "json"], lake.root)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [{"prompt_id": "a", "task": "t"}]
    out = cli(["sql", "SELECT prompt_id, task FROM prompts", "-f", "csv"], lake.root)
    assert out.stdout.splitlines() == ["prompt_id,task", "a,t"]
    out = cli(["sql", "SELECT prompt_id FROM prompts"], lake.root)
    assert "a" in out.stdout and "1 rows" in out.stdout

    bad = cli(["sql", "SELECT nope FROM prompts"], lake.root)
    assert bad.returncode == 1
    assert "nope" in bad.stderr and "Traceback" not in bad.stderr + bad.stdout
    refused = cli(["sql", "DROP VIEW prompts"], lake.root)
    assert refused.returncode == 2 and "read-only" in refused.stderr
    assert "Traceback" not in refused.stderr


WRITER = textwrap.dedent(
    """
    import sys
    from thresher.stores.lake import Lake
    lake = Lake(sys.argv[1])
    print("ready", flush=True)
    for i in range(int(sys.argv[2])):
        rows = [{"candidate_id": f"c{i}-{j}", "prompt_id": f"p{i}", "round": 0,
                 "sample_idx": j, "text": "x" * 200} for j in range(200)]
        assert lake.append("candidates", rows) == 200
    print("done", flush=True)
    """
)


def test_sql_while_another_process_writes(lake):
    batches = 60
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(lake.root), str(batches)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout.readline().strip() == "ready"
    seen = []
    while writer.poll() is None or not seen:
        out = cli(
            [
                "sql",
                "SELECT count(*) AS n, count(DISTINCT candidate_id) AS d FROM candidates",
                "-f",
                "json",
            ],
            lake.root,
        )
        assert out.returncode == 0, out.stderr
        row = json.loads(out.stdout)[0]
        assert row["n"] == row["d"] and row["n"] % 200 == 0  # never a half-written batch
        seen.append(row["n"])
    stdout, stderr = writer.communicate(timeout=120)
    assert writer.returncode == 0, stderr
    assert "done" in stdout
    assert seen == sorted(seen)
    assert lake.count("candidates") == batches * 200
