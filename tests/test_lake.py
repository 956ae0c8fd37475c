from datetime import UTC, datetime

import pyarrow as pa
import pytest

from thresher.stores.lake import Lake
from thresher.stores.runs import record_run
from thresher.stores.schemas import TABLES


def test_every_table_is_queryable_when_empty(lake):
    for table in TABLES:
        assert lake.count(table) == 0
    assert lake.query("SELECT * FROM yield_by_round").height == 0


def test_append_skips_known_and_repeated_keys(lake):
    rows = [{"prompt_id": "a", "dataset": "d", "split": "train", "task": "t", "prompt": "x"}]
    assert lake.append("prompts", rows) == 1
    assert lake.append("prompts", rows + [dict(rows[0], prompt_id="b")] * 2) == 1
    assert sorted(lake.query("SELECT prompt_id FROM prompts")["prompt_id"]) == ["a", "b"]


def test_each_append_is_one_delta_commit(lake):
    before = lake.versions()["prompts"]
    lake.append("prompts", [{"prompt_id": "a", "task": "t", "prompt": "x"}])
    assert lake.versions()["prompts"] == before + 1
    version, files = lake.tables.files("prompts")
    assert len(files) == 1 and files[0].endswith(".parquet")
    assert (lake.root / "prompts" / "_delta_log").is_dir()


def test_wrong_column_types_are_refused(lake):
    with pytest.raises(pa.ArrowInvalid):
        lake.append("candidates", [{"candidate_id": "c", "sample_idx": "not a number"}])
    assert lake.count("candidates") == 0


def test_runs_view_shows_latest_status(lake):
    start = datetime.now(UTC)
    common = dict(flow="curate", round_=0, model="m", config={}, started_at=start)
    record_run(lake, "r1", status="running", **common)
    record_run(lake, "r1", status="completed", finished=True, **common)
    rows = lake.query("SELECT run_id, status, finished_at FROM runs")
    assert rows.height == 1
    assert rows["status"][0] == "completed" and rows["finished_at"][0] is not None


def test_missing_lake_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no lake at"):
        Lake(tmp_path / "nowhere", create=False).connect()


def test_lake_location_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("THRESHER_LAKE", str(tmp_path / "env"))
    assert Lake(tmp_path / "flag", create=False).root == tmp_path / "flag"
    assert Lake(create=False).root == tmp_path / "env"
    monkeypatch.delenv("THRESHER_LAKE")
    assert str(Lake(create=False).root) == "lake"


def test_a_lake_from_an_older_schema_gains_new_columns(tmp_path):
    from deltalake import write_deltalake

    from thresher.stores.schemas import SCHEMAS

    root = tmp_path / "old"  # an evals table made by a thresher without the `task` column
    old_schema = SCHEMAS["evals"].remove(SCHEMAS["evals"].get_field_index("task"))
    old = [{"round": 0, "metric": "pass@1", "value": 0.5}]
    write_deltalake(root / "evals", pa.Table.from_pylist(old, schema=old_schema))
    lake = Lake(root)  # opening it adds the column to the table's schema
    lake.append(
        "evals", [{"round": 1, "task": "all", "metric": "pass@1", "value": 0.7, "run_id": "r"}]
    )
    rows = lake.query("SELECT round, task, value FROM evals ORDER BY round").rows()
    assert rows == [(0, None, 0.5), (1, "all", 0.7)]
    assert "task" in {f.name for f in lake.tables.table("evals").schema().fields}


def test_a_lake_missing_a_newer_table_still_opens(tmp_path):
    import shutil

    root = tmp_path / "older"
    Lake(root)
    shutil.rmtree(root / "train_metrics")  # as a lake made before that table existed
    lake = Lake(root, create=False)
    assert lake.count("train_metrics") == 0 and lake.count("prompts") == 0
