import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from thresher.flows.cli import app
from thresher.ingest.load import IngestError, ingest

MIXED = [
    b'{"prompt": "What is 1 + 1?", "task": "math", "answer": "2"}',  # 1 valid
    b'{"prompt": "What is 2 + 2?", "task": "math", "answer": 4}',  # 2 valid (numeric answer)
    b'{"task": "math", "answer": "1"}',  # 3 missing prompt
    b'{"prompt": "   ", "task": "math"}',  # 4 empty prompt
    b'{"prompt": 42, "task": "math"}',  # 5 wrong type
    b'{"prompt": "x?", "task": "math", "answer": [1, 2]}',  # 6 wrong type (answer)
    b'{"prompt": "caf\xe9", "task": "math"}',  # 7 undecodable bytes (latin-1)
    b'{"prompt": "oops", "task": ',  # 8 JSON syntax error
    b'{"prompt": "What is 1 + 1?", "task": "math", "answer": "3"}',  # 9 conflicting duplicate
    b'{"prompt": "What is 2 + 2?", "task": "math", "answer": "4"}',  # 10 exact duplicate
    b"[1, 2]",  # 11 not an object
    b'{"messages": [{"role": "user", "content": "Hi?"}], "task": "chat"}',  # 12 valid chat
    b'{"messages": "hello", "task": "chat"}',  # 13 wrong type (messages)
    b'{"prompt": "no task here"}',  # 14 missing task
    b"",  # blank line: not a row
]

EXPECTED_REASONS = {
    3: "missing prompt",
    4: "empty prompt",
    5: "wrong type: 'prompt' must be a string, got int",
    6: "wrong type: 'answer' must be a string or number, got list",
    7: "undecodable bytes",
    8: "invalid JSON",
    9: "conflicting duplicate: same prompt as line 1 but answer differs",
    11: "row is not a JSON object",
    13: "wrong type: 'messages' must be a list of {role, content} objects",
    14: "missing task",
}


@pytest.fixture
def mixed_file(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join(MIXED) + b"\n")
    return path


def test_mixed_file_counts_and_reasons(lake, mixed_file):
    report = ingest(lake, mixed_file, dataset="toy")
    assert (report.read, report.ingested, report.already_present, report.rejected) == (14, 3, 1, 10)
    assert report.read == report.ingested + report.already_present + report.rejected

    prompts = lake.query("SELECT line, task, answer, prompt, messages FROM prompts ORDER BY line")
    assert prompts["line"].to_list() == [1, 2, 12]
    assert prompts["answer"].to_list() == ["2", "4", None]
    assert json.loads(prompts["messages"][2]) == [{"role": "user", "content": "Hi?"}]

    rejects = lake.query("SELECT line, reason, raw FROM rejects ORDER BY line")
    assert rejects["line"].to_list() == sorted(EXPECTED_REASONS)
    for line, reason, raw in rejects.iter_rows():
        assert reason.startswith(EXPECTED_REASONS[line]), (line, reason)
        assert raw  # the raw row is kept
    raw7 = rejects.filter(rejects["line"] == 7)["raw"][0]
    assert "caf\\xe9" in raw7  # undecodable bytes survive, escaped


def test_reingest_adds_nothing(lake, mixed_file):
    ingest(lake, mixed_file, dataset="toy")
    again = ingest(lake, mixed_file, dataset="toy")
    assert (again.ingested, again.already_present, again.rejected) == (0, 4, 10)
    assert lake.count("prompts") == 3
    assert lake.count("rejects") == 10  # the same rejects are not recorded twice


def test_conflict_with_prompt_already_in_lake(lake, tmp_path):
    a = tmp_path / "a.jsonl"
    a.write_text('{"prompt": "Q?", "task": "math", "answer": "1"}\n')
    b = tmp_path / "b.jsonl"
    b.write_text('{"prompt": "Q?", "task": "math", "answer": "2"}\n')
    assert ingest(lake, a, dataset="d").ingested == 1
    report = ingest(lake, b, dataset="d")
    assert (report.ingested, report.rejected) == (0, 1)
    reason = lake.query("SELECT reason FROM rejects")["reason"][0]
    assert reason.startswith("conflicting duplicate") and "already in the lake" in reason
    # the same prompt under another dataset name is another prompt
    assert ingest(lake, b, dataset="other").ingested == 1


def test_mapping_task_default_and_meta(lake, tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": "What is 3 * 3?", "final": 9, "id": "x1"}\n')
    report = ingest(
        lake, path, dataset="d", mapping={"prompt": "question", "answer": "final"}, task="math"
    )
    assert report.ingested == 1
    row = lake.query("SELECT prompt, answer, task, meta FROM prompts").row(0, named=True)
    assert (row["prompt"], row["answer"], row["task"]) == ("What is 3 * 3?", "9", "math")
    assert json.loads(row["meta"]) == {"id": "x1"}  # unmapped columns are kept in meta


def test_csv_parquet_json_and_saved_dataset(lake, tmp_path):
    import datasets

    csv_path = tmp_path / "p.csv"
    csv_path.write_bytes(
        b'prompt,task,answer,tests\n"multi\nline?",code,,"[""assert f()""]"\nok?,math,1,,extra\n'
        b"bad\xff,math,2\n,math,3\n"
    )
    r = ingest(lake, csv_path, dataset="csv")
    assert (r.read, r.ingested, r.rejected) == (4, 1, 3)
    reasons = lake.query("SELECT line, reason FROM rejects ORDER BY line").rows()
    assert reasons[0][0] == 4 and reasons[0][1].startswith("wrong number of fields")
    assert reasons[1][0] == 5 and reasons[1][1].startswith("undecodable bytes")
    assert reasons[2][0] == 6 and reasons[2][1].startswith("missing prompt")

    table = pa.table({"prompt": ["a?", "b?", None], "task": ["t", "t", "t"]})
    pq.write_table(table, tmp_path / "p.parquet")
    r = ingest(lake, tmp_path / "p.parquet", dataset="pq")
    assert (r.read, r.ingested, r.rejected) == (3, 2, 1)

    (tmp_path / "p.json").write_text(json.dumps([{"prompt": "j?", "task": "t"}, "nope"]))
    r = ingest(lake, tmp_path / "p.json", dataset="js")
    assert (r.read, r.ingested, r.rejected) == (2, 1, 1)

    ds = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"prompt": ["d1?", "d2?"], "task": ["t", "t"]}),
            "eval": datasets.Dataset.from_dict({"prompt": ["e1?"], "task": ["t"]}),
        }
    )
    ds.save_to_disk(tmp_path / "saved")
    r = ingest(lake, tmp_path / "saved", dataset="hf", split="eval")
    assert (r.read, r.ingested) == (1, 1)
    assert lake.query("SELECT split FROM prompts WHERE dataset = 'hf'")["split"].to_list() == [
        "eval"
    ]


def test_whole_source_errors(lake, tmp_path):
    with pytest.raises(IngestError, match="no such file"):
        ingest(lake, tmp_path / "missing.jsonl", dataset="d")
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(IngestError, match="cannot tell the format"):
        ingest(lake, tmp_path / "x.txt", dataset="d")
    (tmp_path / "ok.jsonl").write_text("{}\n")
    with pytest.raises(IngestError, match="unknown field"):
        ingest(lake, tmp_path / "ok.jsonl", dataset="d", mapping={"promt": "q"})


def test_cli_exit_codes(tmp_path, mixed_file):
    runner = CliRunner()
    lake_dir = str(tmp_path / "cli-lake")
    ok = runner.invoke(app, ["ingest", str(mixed_file), "-d", "toy", "--lake", lake_dir])
    assert ok.exit_code == 0, ok.output
    assert "14 rows: 3 ingested, 1 already present, 10 rejected" in ok.output

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task": "x"}\nnot json\n')
    res = runner.invoke(app, ["ingest", str(bad), "-d", "toy", "--lake", lake_dir])
    assert res.exit_code == 1
    assert "2 rejected" in res.output and "no valid rows" in res.output
