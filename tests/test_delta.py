"""The lake's Delta tables: exactly-once batches, concurrent writers, killed writers,
snapshots of the past, compaction, vacuum, other readers, migration of older lakes."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import run_two_writers

from thresher.stores.lake import Lake, LegacyLake
from thresher.stores.maintenance import (
    LEGACY_PART,
    as_of_versions,
    compact,
    maybe_compact,
    migrate,
    vacuum,
)
from thresher.stores.runs import record_run
from thresher.stores.schemas import SCHEMAS, TABLES

THRESHER = [sys.executable, "-m", "thresher.flows.cli"]


def cands(batch: int, n: int = 20, prompt: str | None = None) -> list[dict]:
    return [
        {"candidate_id": f"c{batch}-{j}", "prompt_id": prompt or f"p{batch}", "round": 0,
         "sample_idx": j, "text": f"answer {batch} {j}"}
        for j in range(n)
    ]  # fmt: skip


def sels(batch: int, selection: str = "s1", n: int = 20) -> list[dict]:
    return [
        {"selection_id": selection, "round": 0, "candidate_id": f"c{batch}-{j}",
         "prompt_id": f"p{batch}", "kept": j % 2 == 0, "drop_reason": None if j % 2 == 0
         else "failed"}
        for j in range(n)
    ]  # fmt: skip


def cli(*args, lake=None) -> subprocess.CompletedProcess:
    extra = ["--lake", str(lake)] if lake is not None else []
    return subprocess.run([*THRESHER, *map(str, args), *extra], capture_output=True, text=True)


def sql_json(lake, query: str, *flags) -> list[dict]:
    res = cli("sql", query, "-f", "json", *flags, lake=lake.root)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_a_batch_commits_once_by_its_id_without_reading_the_table(lake):
    assert lake.append("candidates", cands(0)) == 20
    version = lake.versions()["candidates"]
    assert lake.append("candidates", cands(0)) == 0  # the same batch: found in the log
    assert lake.versions()["candidates"] == version  # nothing committed
    # an explicit batch id decides, whatever the rows
    assert lake.append("candidates", cands(1), batch_id="b-1") == 20
    assert lake.append("candidates", cands(2), batch_id="b-1") == 0
    assert lake.tables.committed("candidates", "candidates:b-1")
    assert lake.count("candidates") == 40
    # repeated keys within a batch keep the first row
    assert lake.append("candidates", cands(3) + cands(3)) == 20


def test_two_writers_on_one_table_at_once(lake):
    n = 25
    run_two_writers(str(lake.root), n)
    row = lake.query("SELECT count(*) AS n, count(DISTINCT candidate_id) AS d FROM candidates").row(
        0
    )
    assert row == (3 * n * 20, 3 * n * 20)  # shared batches once, own batches each


KILLED = textwrap.dedent(
    """
    import sys, os
    from thresher.stores.lake import Lake
    lake = Lake(sys.argv[1])
    start = int(sys.argv[2])
    print("ready", flush=True)
    for b in range(start, start + 10_000):
        rows = [{"candidate_id": f"k{b}-{j}", "prompt_id": f"p{b}", "text": "z" * 300}
                for j in range(400)]
        lake.append("candidates", rows)
    """
)


def test_a_writer_killed_mid_commit_leaves_the_previous_version(lake):
    before = 0
    for attempt in range(5):
        writer = subprocess.Popen(
            [sys.executable, "-c", KILLED, str(lake.root), str(attempt * 10_000)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert writer.stdout.readline().strip() == "ready"
        time.sleep(1.0 + 0.37 * attempt)  # somewhere inside some commit
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        version, files = Lake(lake.root).tables.files("candidates")
        n, d = (
            Lake(lake.root)
            .query("SELECT count(*), count(DISTINCT candidate_id) FROM candidates")
            .row(0)
        )
        assert n == d and n % 400 == 0 and n > before  # whole batches, none twice
        assert n == sum(pq.read_metadata(f).num_rows for f in files)
        before = n
    # files of the commits that never happened: vacuum deletes them, rows stay
    folder = lake.root / "candidates"
    on_disk = {p.name for p in folder.glob("*.parquet")}
    live = {f.rpartition("/")[2] for f in lake.tables.files("candidates")[1]}
    vacuum(lake, retain_hours=0, table="candidates", force=True)
    assert {p.name for p in folder.glob("*.parquet")} == live
    assert on_disk >= live
    assert lake.count("candidates") == before


def test_sql_as_of_reads_the_earlier_snapshot(lake):
    lake.append("candidates", cands(0))
    lake.append("candidates", cands(1))
    v = lake.versions()["candidates"]
    time.sleep(0.05)
    middle = datetime.now(UTC)
    time.sleep(0.05)
    record_run(
        lake, "run-a", flow="train", round_=1, model="m", config={}, status="completed",
        started_at=middle, read_versions=lake.versions(),
    )  # fmt: skip
    lake.append("candidates", cands(2))
    count = "SELECT count(*) AS n FROM candidates"
    assert sql_json(lake, count) == [{"n": 60}]
    assert sql_json(lake, count, "--as-of", f"candidates={v}") == [{"n": 40}]
    assert sql_json(lake, count, "--as-of", middle.isoformat()) == [{"n": 40}]
    assert sql_json(lake, count, "--as-of", "run:run-a") == [{"n": 40}]
    assert sql_json(lake, count, "--as-of", "2000-01-01") == [{"n": 0}]  # before the lake
    for bad in ("7", "candidates=999", "nope=1", "run:missing", "yesterday"):
        res = cli("sql", count, "--as-of", bad, lake=lake.root)
        assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert (
        "each table has its own versions"
        in cli("sql", count, "--as-of", "7", lake=lake.root).stderr
    )
    with pytest.raises(PermissionError):
        Lake(lake.root, as_of={"candidates": v}).append("candidates", cands(9))


def test_runs_record_the_versions_they_read(lake):
    from thresher.stores.runs import tracked_run

    lake.append("candidates", cands(0))
    lake.count("candidates")  # the run's input, read before it starts
    read = lake.versions()
    with tracked_run(lake, "r1", flow="train", round_=1, model="m", config={}):
        lake.append("candidates", cands(1))  # written while it runs: not what it read
    recorded = json.loads(lake.query("SELECT read_versions FROM runs").item())
    assert recorded == read
    assert as_of_versions(lake, "run:r1") == read


def test_a_failed_run_keeps_its_summary_so_far_and_the_error(lake):
    from thresher.stores.runs import latest_run, tracked_run

    with pytest.raises(RuntimeError):
        with tracked_run(lake, "r2", flow="curate", round_=0, model="m", config={}) as summary:
            summary["verifier_digests"] = {"math": "d"}
            raise RuntimeError("engine died")
    run = latest_run(lake, "r2")
    assert run["status"] == "failed"
    error = "RuntimeError: engine died"
    assert run["summary"] == {"verifier_digests": {"math": "d"}, "error": error}


def test_compaction_and_vacuum_change_no_query_result(lake):
    for b in range(30):
        lake.append("candidates", cands(b, prompt=f"p{b % 7}"))
        lake.append("selections", sels(b))
    record_run(
        lake, "r", flow="curate", round_=0, model="m", config={"name": "x"},
        status="completed", started_at=datetime.now(UTC), selection_id="s1",
    )  # fmt: skip
    queries = [
        "SELECT * FROM funnel",
        "SELECT prompt_id, count(*) AS n FROM candidates GROUP BY 1 ORDER BY 1",
        "SELECT * FROM yield_by_round",
        "SELECT count(*) AS n, count(DISTINCT candidate_id) AS d FROM candidates",
    ]
    before = [lake.query(q).rows() for q in queries]
    v = lake.versions()["candidates"]
    done = compact(lake)
    assert done["candidates"]["files_before"] == 30 and done["candidates"]["files_after"] == 1
    assert [lake.query(q).rows() for q in queries] == before
    old = Lake(lake.root, as_of={"candidates": v})  # the pre-compaction files still exist
    assert old.count("candidates") == 600
    res = cli("vacuum", "--retain", "0", lake=lake.root)
    assert res.returncode == 2 and "--force" in res.stderr  # unsafe without --force
    res = cli("vacuum", "--retain", "0", "--force", lake=lake.root)
    assert res.returncode == 0, res.stderr
    assert "30 files deleted" in res.stdout
    assert [lake.query(q).rows() for q in queries] == before
    assert len(list((lake.root / "candidates").glob("*.parquet"))) == 1


def test_pipelines_compact_past_their_small_file_limit(lake):
    for b in range(12):
        lake.append("candidates", cands(b))
    assert maybe_compact(lake, small_files=0) == {}  # 0: never
    assert maybe_compact(lake, small_files=20) == {}
    done = maybe_compact(lake, small_files=10)
    assert list(done) == ["candidates"] and done["candidates"]["files_after"] == 1
    assert lake.count("candidates") == 240


def test_the_log_stays_short_and_old_versions_stay_readable(lake):
    for b in range(230):
        lake.append("selections", sels(b, n=2))
    log = lake.root / "selections" / "_delta_log"
    names = [p.name for p in log.iterdir()]
    assert len(names) < 150  # commits before the second-to-last checkpoint moved out
    assert len(list((lake.root / "_history" / "selections").iterdir())) > 90
    assert lake.count("selections") == 460
    early = Lake(lake.root, as_of={"selections": 5})  # version 0 created the table
    assert early.count("selections") == 10
    res = cli("history", "--table", "selections", "-n", "3", "-f", "json", lake=lake.root)
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert [r["version"] for r in rows] == [230, 229, 228]
    assert all(r["rows_added"] == 2 and r["operation"] == "WRITE" for r in rows)
    from datetime import timedelta

    when = datetime.now(UTC) - timedelta(seconds=0)
    assert as_of_versions(lake, when.isoformat())["selections"] == 230


def test_polars_reads_the_lake_tables(lake):
    import polars as pl

    lake.append("candidates", cands(0))
    lake.append("candidates", cands(1))
    frame = pl.scan_delta(str(lake.root / "candidates")).select("candidate_id").collect()
    assert sorted(frame["candidate_id"]) == sorted(
        lake.query("SELECT candidate_id FROM candidates")["candidate_id"]
    )


def _legacy_lake(root) -> dict[str, int]:
    """A lake as older thresher versions wrote it: per table a schema file and parts."""
    counts = {}
    for t in TABLES:
        (root / t).mkdir(parents=True)
        pq.write_table(SCHEMAS[t].empty_table(), root / t / "_schema.parquet")
        counts[t] = 0
    parts = {
        "prompts": [[{"prompt_id": f"p{i}", "task": "t", "prompt": f"q{i}"} for i in range(5)],
                    [{"prompt_id": "p9", "task": "t", "prompt": "q9"}]],
        "candidates": [cands(0), cands(1)],
        "runs": [[{"run_id": "r", "flow": "curate", "status": "running",
                   "updated_at": datetime(2026, 1, 1, tzinfo=UTC)}],
                 [{"run_id": "r", "flow": "curate", "status": "completed",
                   "updated_at": datetime(2026, 1, 2, tzinfo=UTC)}]],
    }  # fmt: skip
    for t, batches in parts.items():
        for i, rows in enumerate(batches):
            table = pa.Table.from_pylist(rows, schema=SCHEMAS[t])
            pq.write_table(table, root / t / f"part-{1_000 + i:020d}-0000000{i}.parquet")
            counts[t] += len(rows)
    (root / "candidates" / ".part-x.parquet.1234abcd.tmp").write_bytes(b"half a file")
    return counts


def test_migrate_converts_an_older_lake_once(tmp_path):
    root = tmp_path / "old"
    counts = _legacy_lake(root)
    with pytest.raises(LegacyLake, match="thresher migrate"):
        Lake(root)
    res = cli("sql", "SELECT 1", lake=root)
    assert res.returncode == 1 and "thresher migrate" in res.stderr
    res = cli("migrate", lake=root)
    assert res.returncode == 0, res.stderr
    lake = Lake(root)
    assert {t: lake.count(t) for t in TABLES if t != "runs"} == {
        t: n for t, n in counts.items() if t != "runs"
    }
    assert lake.query("SELECT status FROM runs").rows() == [("completed",)]
    assert lake.count("candidates") == 40
    assert not list(root.glob("*/_schema.parquet")) and not list(root.glob("*/.*.tmp"))
    again = cli("migrate", lake=root)
    assert again.returncode == 0 and "already" in again.stdout
    assert lake.count("candidates") == 40


def test_an_interrupted_migration_is_finished_without_doubles(tmp_path):
    root = tmp_path / "old"
    _legacy_lake(root)
    legacy = sorted((root / "candidates").glob("part-*.parquet"))
    kept = [p.read_bytes() for p in legacy]
    migrate(root)
    for p, body in zip(legacy, kept, strict=True):  # as if it died before deleting them
        p.write_bytes(body)
    (root / "candidates" / "_schema.parquet").write_bytes(b"")
    pq.write_table(SCHEMAS["candidates"].empty_table(), root / "candidates" / "_schema.parquet")
    assert Lake(root, create=False).legacy() == []  # a Delta table already
    migrate(root)
    assert Lake(root).count("candidates") == 40
    assert not [p for p in (root / "candidates").iterdir() if LEGACY_PART.match(p.name)]


MANY = textwrap.dedent(
    """
    import sys
    from thresher.stores.lake import Lake
    lake = Lake(sys.argv[1])
    for b in range(230):
        lake.append("selections", [{"selection_id": "s", "candidate_id": f"c{b}"}])
    """
)


def test_an_open_lake_follows_another_process_past_moved_commits(lake):
    assert lake.count("selections") == 0  # opened at the first version
    res = subprocess.run([sys.executable, "-c", MANY, str(lake.root)], capture_output=True)
    assert res.returncode == 0, res.stderr
    assert not (lake.root / "selections" / "_delta_log" / f"{1:020d}.json").exists()
    assert lake.count("selections") == 230  # its next commit moved on: reopened
