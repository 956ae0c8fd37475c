"""The lake on object storage: Delta tables on a real S3 API (moto's server on 127.0.0.1)."""

import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from helpers import free_port, run_two_writers

from thresher.stores.lake import Lake

THRESHER = [sys.executable, "-m", "thresher.flows.cli"]
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "arithmetic"
BUCKET = "thresher-lakes"


class HoldPartTwo:
    """WSGI middleware: while armed, holds the request uploading part 2 of a multipart
    upload until released, then fails it without storing anything (its writer is gone)."""

    def __init__(self, app):
        self.app = app
        self.armed = False
        self.holding = threading.Event()
        self.released = threading.Event()

    def __call__(self, environ, start_response):
        query = parse_qs(environ.get("QUERY_STRING", ""))
        if self.armed and environ["REQUEST_METHOD"] == "PUT" and query.get("partNumber") == ["2"]:
            self.holding.set()
            self.released.wait(300)
            start_response("503 Service Unavailable", [("Content-Length", "0")])
            return [b""]
        return self.app(environ, start_response)


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server with one bucket; the AWS_* variables point every process at it."""
    import boto3
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request
    gate = HoldPartTwo(DomainDispatcherApplication(create_backend_app))
    server = make_server(
        "127.0.0.1", free_port(), gate, threaded=True, request_handler=MotoRequestHandler
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.server_port}",
    }
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        mp.delenv("AWS_ENDPOINT_URL_S3", raising=False)
        mp.delenv("THRESHER_STORAGE_OPTIONS", raising=False)
        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        yield client, gate
        gate.released.set()
        server.shutdown()
        thread.join()


def lake_url(prefix: str) -> str:
    return f"s3://{BUCKET}/{prefix}"


def cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([*THRESHER, *map(str, args)], capture_output=True, text=True, cwd=cwd)


def sql_json(query: str, lake) -> list[dict]:
    res = cli("sql", query, "-f", "json", "--lake", lake)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def keys(client, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def ingest_examples(lake, bad_file: Path) -> list[str]:
    """Ingest the example prompts and a file with bad rows; returns what ingest printed."""
    good = cli(
        "ingest", EXAMPLES / "eval.jsonl", "-d", "arith", "--split", "eval",
        "-m", "prompt=question", "--task", "arithmetic", "--lake", lake,
    )  # fmt: skip
    bad = cli("ingest", bad_file, "-d", "bad", "--task", "arithmetic", "--lake", lake)
    assert good.returncode == 0 and bad.returncode == 0, good.stderr + bad.stderr
    return [good.stdout.split(": ", 1)[1], bad.stdout.split(": ", 1)[1]]


SUMMARY_SQL = (
    "SELECT dataset, split, count(*) AS n, count(DISTINCT prompt_id) AS ids, "
    "min(prompt_id) AS first_id FROM prompts GROUP BY ALL ORDER BY ALL"
)


def test_ingest_sql_and_tables_match_a_local_lake(s3, tmp_path):
    client, _ = s3
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "What is 1 + 2?", "answer": "3"}\nnot json\n{"answer": "4"}\n')
    local, remote = tmp_path / "lake", lake_url("ingest")

    assert ingest_examples(local, bad) == ingest_examples(remote, bad)
    again = cli(
        "ingest", EXAMPLES / "eval.jsonl", "-d", "arith", "--split", "eval",
        "-m", "prompt=question", "--task", "arithmetic", "--lake", remote,
    )  # fmt: skip
    assert "0 ingested, 40 already present" in again.stdout  # keys read back from S3

    summary = sql_json(SUMMARY_SQL, remote)
    assert summary == sql_json(SUMMARY_SQL, local)
    assert [(r["dataset"], r["split"], r["n"]) for r in summary] == [
        ("arith", "eval", 40),
        ("bad", "train", 1),
    ]
    rejects = sql_json("SELECT line, reason FROM rejects ORDER BY line", remote)
    assert len(rejects) == 2
    assert rejects == sql_json("SELECT line, reason FROM rejects ORDER BY line", local)

    tables = cli("tables", "--lake", remote)
    assert tables.returncode == 0, tables.stderr
    head, counts = tables.stdout.split("\n", 1)
    assert head == f"lake: {remote}"
    assert counts == cli("tables", "--lake", local).stdout.split("\n", 1)[1]
    assert not any(Path(k).name.startswith(".") for k in keys(client, "ingest/"))


def test_missing_remote_lake_is_a_clear_error(s3):
    res = cli("sql", "SELECT 1 FROM prompts", "--lake", lake_url("nothing-here"))
    assert res.returncode == 1
    assert "no lake at s3://" in res.stderr and "Traceback" not in res.stderr


APPENDER = textwrap.dedent(
    """
    import sys
    from thresher.stores.lake import Lake
    rows = [{"prompt_id": f"{sys.argv[2]}-{i}", "task": "t", "prompt": "x"} for i in range(50)]
    print(Lake(sys.argv[1]).append("prompts", rows))
    """
)


def test_an_open_lake_sees_another_process_append(s3):
    url = lake_url("listing")
    lake = Lake(url)
    lake.append("prompts", [{"prompt_id": "first", "task": "t", "prompt": "x"}])
    assert lake.count("prompts") == 1  # views built, filesystem listed once
    # the other process finds the endpoint through THRESHER_STORAGE_OPTIONS instead
    env = {k: v for k, v in os.environ.items() if k != "AWS_ENDPOINT_URL"}
    options = {"client_kwargs": {"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}}
    env["THRESHER_STORAGE_OPTIONS"] = json.dumps(options)
    for n, batch in enumerate(("a", "b"), start=1):
        res = subprocess.run(
            [sys.executable, "-c", APPENDER, url, batch], capture_output=True, text=True, env=env
        )
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == "50"
        assert lake.count("prompts") == 1 + 50 * n  # the same open lake, next query
    # idempotent appends see the other process's keys too
    assert lake.append("prompts", [{"prompt_id": "a-3", "task": "t", "prompt": "x"}]) == 0


# About 150 MiB of text that zstd cannot shrink much: over s3fs's 100 MiB limit for one
# PUT, so the part is sent as a multipart upload (parts of 50 MiB).
BIG_WRITER = textwrap.dedent(
    """
    import base64, os, sys
    import pyarrow as pa
    from thresher.stores.lake import Lake
    text = pa.array([base64.b64encode(os.urandom(3 << 18)).decode() for _ in range(150)])
    rows = pa.table({"candidate_id": [f"big-{i}" for i in range(150)], "text": text})
    print("writing", flush=True)
    Lake(sys.argv[1]).append("candidates", rows)
    print("done", flush=True)
    """
)


def stored_part(client, prefix: str, timeout: float = 180) -> dict:
    """The multipart upload under `prefix` once a part of it is stored on the server."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for upload in client.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get(
            "Uploads", []
        ):
            ids = {"Bucket": BUCKET, "Key": upload["Key"], "UploadId": upload["UploadId"]}
            if client.list_parts(**ids).get("Parts"):
                return upload
        time.sleep(0.05)
    raise AssertionError("no part of the upload reached the server")


def test_a_writer_killed_mid_upload_leaves_nothing_visible(s3):
    client, gate = s3
    url, prefix = lake_url("killed"), "killed/candidates/"
    lake = Lake(url)
    rows = [{"candidate_id": f"c{i}", "prompt_id": "p", "text": "x"} for i in range(200)]
    assert lake.append("candidates", rows) == 200
    version = lake.versions()["candidates"]
    before = keys(client, prefix)

    gate.armed = True
    try:
        writer = subprocess.Popen(
            [sys.executable, "-c", BIG_WRITER, url], stdout=subprocess.PIPE, text=True
        )
        assert writer.stdout.readline().strip() == "writing"
        assert gate.holding.wait(180), "the writer never reached part 2 of a multipart upload"
        upload = stored_part(client, prefix)  # part 1's data is on the server, part 2 held
        assert writer.poll() is None
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
    finally:
        gate.armed = False
        gate.released.set()

    uploads = client.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", [])
    assert uploads == [upload]  # the killed upload: started, never completed
    assert Path(upload["Key"]).name.startswith("part-")
    assert keys(client, prefix) == before  # none of its data is an object, no commit

    assert sql_json("SELECT count(*) AS n FROM candidates", url) == [{"n": 200}]
    assert Lake(url).versions()["candidates"] == version  # the previous version, readable
    data = [k for k in keys(client, prefix) if "/_delta_log/" not in k]
    rows_in_objects = 0
    for key in data:  # every data object is a whole Parquet file
        body = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        rows_in_objects += pq.read_table(pa.BufferReader(body)).num_rows
    assert rows_in_objects == 200
    client.abort_multipart_upload(Bucket=BUCKET, Key=upload["Key"], UploadId=upload["UploadId"])
    # a later writer commits the next version as if nothing happened
    more = [{"candidate_id": f"d{i}", "prompt_id": "p", "text": "y"} for i in range(10)]
    assert Lake(url).append("candidates", more) == 10
    assert sql_json("SELECT count(*) AS n FROM candidates", url) == [{"n": 210}]


def test_two_writers_on_s3_at_once_lose_and_double_nothing(s3):
    url = lake_url("two-writers")
    Lake(url)
    batches = 15
    run_two_writers(url, batches)
    counts = sql_json(
        "SELECT count(*) AS n, count(DISTINCT candidate_id) AS d FROM candidates", url
    )
    assert counts == [{"n": 3 * batches * 20, "d": 3 * batches * 20}]


K, PROMPTS = 4, 12


@pytest.mark.engine
def test_curate_export_report_and_train_on_s3(s3, tiny_model, tmp_path):
    client, _ = s3
    url = lake_url("flows")
    for path, split in ((EXAMPLES / "train.jsonl", "train"), (EXAMPLES / "eval.jsonl", "eval")):
        res = cli(
            "ingest", path, "-d", "arith", "--split", split, "-m", "prompt=question",
            "--task", "arithmetic", "--lake", url,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
    curate_cfg = {
        "name": "s3",
        "model": str(tiny_model),
        "batch_size": 8,
        "prompts": {"dataset": "arith", "limit": PROMPTS},
        "sampling": {"k": K, "max_tokens": 24, "temperature": 0.8},
        "engine": {"dtype": "float32", "max_model_len": 256},
        "select": {"cap": 1},
    }
    (tmp_path / "curate.yaml").write_text(yaml.safe_dump(curate_cfg))
    res = cli("curate", "-c", tmp_path / "curate.yaml", "--lake", url, "--no-progress")
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"{PROMPTS} prompts, {PROMPTS * K} candidates" in res.stdout

    counts = sql_json(
        "SELECT (SELECT count(*) FROM candidates) AS c, (SELECT count(*) FROM verdicts) AS v, "
        "(SELECT count(*) FROM selections) AS s, "
        "(SELECT count(*) FROM selections WHERE kept) AS kept, "
        "(SELECT list(status) FROM runs) AS runs",
        url,
    )[0]
    assert counts["c"] == counts["v"] == counts["s"] == PROMPTS * K
    assert counts["runs"] == ["completed"]
    assert 0 < counts["kept"] <= PROMPTS
    assert not any(Path(k).name.startswith(".") for k in keys(client, "flows/"))

    res = cli("export", "--round", "0", "--to", tmp_path / "sft", "--lake", url)
    assert res.returncode == 0, res.stderr
    assert f"wrote {counts['kept']} sft rows" in res.stdout
    lines = (tmp_path / "sft" / "data.jsonl").read_text().splitlines()
    assert len(lines) == counts["kept"]

    work = tmp_path / "work"  # models and reports of a remote lake go under ./
    work.mkdir()
    res = cli("report", "--lake", url, cwd=work)
    assert res.returncode == 0, res.stderr
    assert url in (work / "report" / "index.html").read_text()

    train_cfg = {
        "name": "s3",
        "base_model": str(tiny_model),
        "max_steps": 2,
        "batch_size": 4,
        "max_len": 64,
        "eval_fraction": 0.0,
        "log_every": 1,
        "lora": {"r": 4, "alpha": 8},
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(train_cfg))
    res = cli("train", "-c", tmp_path / "train.yaml", "--lake", url, "--no-progress", cwd=work)
    assert res.returncode == 0, res.stderr[-3000:]
    model = work / "models" / "s3" / "round-1" / "model"
    assert (model / "config.json").exists()
    assert str(model) in res.stdout
    assert sql_json("SELECT count(*) AS n FROM train_metrics", url) == [{"n": 2}]


# -- other locations: file:// URLs are local folders; stores delta-rs cannot write are refused


def test_a_file_url_is_a_local_folder(tmp_path):
    lake = Lake(f"file://{tmp_path}/lake")
    assert lake.root == tmp_path / "lake" and not lake.remote
    lake.append("prompts", [{"prompt_id": "a", "task": "t", "prompt": "x"}])
    assert len(list((tmp_path / "lake" / "prompts").glob("part-*.parquet"))) == 1
    assert Lake(tmp_path / "lake").count("prompts") == 1


def test_a_store_delta_tables_cannot_live_on_is_a_clear_error():
    with pytest.raises(ValueError, match="a lake cannot live at memory://"):
        Lake("memory://thresher/lake")


def test_storage_errors_say_what_to_do(monkeypatch):
    monkeypatch.setenv("THRESHER_STORAGE_OPTIONS", "{not json")
    with pytest.raises(ValueError, match="THRESHER_STORAGE_OPTIONS is not JSON"):
        Lake("s3://thresher/options")
    monkeypatch.delenv("THRESHER_STORAGE_OPTIONS")
    if importlib.util.find_spec("gcsfs") is None:  # an implementation that is not installed
        with pytest.raises(ImportError, match="pip install 'gcsfs'"):
            Lake("gs://bucket/lake")


def test_a_views_file_list_is_read_without_listing_the_store():
    import duckdb
    import fsspec

    from thresher.stores.storage import remember_part_info

    fs = fsspec.filesystem("memory", skip_instance_cache=True)
    files = [f"memory://listing-test/t/part-{i}.parquet" for i in range(5)]
    for i, path in enumerate(files):
        with fs.open(path, "wb") as f:
            pq.write_table(pa.table({"x": [i]}), f)
    asked = {"ls": 0, "info": 0}
    ls, info = fs.ls, fs.info
    fs.ls = lambda *a, **k: asked.__setitem__("ls", asked["ls"] + 1) or ls(*a, **k)
    fs.info = lambda *a, **k: asked.__setitem__("info", asked["info"] + 1) or info(*a, **k)
    con = duckdb.connect()
    con.register_filesystem(remember_part_info(fs))
    query = f"SELECT sum(x) FROM read_parquet({files}, union_by_name = true)"
    assert con.sql(query).fetchall() == [(10,)]
    assert asked == {"ls": 0, "info": 5}  # one look per part file, no listing per file
    assert con.sql(query).fetchall() == [(10,)]
    assert asked == {"ls": 0, "info": 5}  # part files never change: nothing asked again
    con.close()
    fs.rm("memory://listing-test", recursive=True)
