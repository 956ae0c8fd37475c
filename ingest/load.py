"""Load prompt files into the `prompts` table; every bad row goes to `rejects` with a reason."""

from __future__ import annotations

import csv
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from thresher.ids import content_id
from thresher.ingest.presets import PRESETS, find_preset, suggest
from thresher.stores.lake import Lake, now
from thresher.stores.queries import existing_prompts
from thresher.stores.schemas import PROMPT_FIELDS
from thresher.stores.tables import reject_row, write_prompts, write_rejects

if TYPE_CHECKING:
    import datasets
    import pyarrow as pa

FIELDS = PROMPT_FIELDS  # the fields of a prompt row
SPLITS = ("train", "eval", "test")  # test is sealed: only a final evaluation reads it
FORMATS = ("jsonl", "json", "csv", "parquet", "dataset")


class IngestError(ValueError):
    """The source as a whole cannot be read (missing, unknown format, unreadable)."""


class RowError(ValueError):
    """One row is malformed; the message is the reason recorded in `rejects`."""


@dataclass
class IngestReport:
    """What one ingest did: read = ingested + already_present + rejected."""

    source: str
    read: int = 0
    ingested: int = 0
    already_present: int = 0
    rejected: int = 0
    reasons: Counter = field(default_factory=Counter)
    hints: Counter = field(default_factory=Counter)  # e.g. "this looks like GSM8K: ..."
    prompt_ids: list[str] = field(default_factory=list)  # the valid rows', in source order

    @property
    def valid(self) -> int:
        return self.ingested + self.already_present


@dataclass
class RawRow:
    line: int  # 1-based line (JSONL, CSV) or row number (JSON, Parquet, dataset)
    raw: str
    record: dict | None = None
    error: str | None = None


def detect_format(path: Path) -> str:
    """The source format from the path: a folder is a saved `datasets` dataset."""
    if path.is_dir():
        return "dataset"
    suffixes = [s.lower() for s in path.suffixes]
    for suffix in reversed(suffixes):
        name = {
            ".jsonl": "jsonl",
            ".ndjson": "jsonl",
            ".json": "json",
            ".csv": "csv",
            ".parquet": "parquet",
            ".pq": "parquet",
        }.get(suffix)
        if name:
            return name
    raise IngestError(
        f"cannot tell the format of {path}: use .jsonl, .json, .csv (each may be .gz), "
        ".parquet or a folder "
        "saved with datasets' save_to_disk (or pass --format)"
    )


# -- readers: each yields RawRow, never raises for one bad row ---------------------------


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RowError(f"undecodable bytes: not UTF-8 at byte {e.start}") from None


def _as_object(value: Any) -> dict:
    if not isinstance(value, dict):
        raise RowError(f"row is not a JSON object (got {type(value).__name__})")
    return value


def _open(path: Path, mode: str = "rb", **kwargs):
    """Open a file, decompressing `.gz` on the fly (HumanEval ships as .jsonl.gz)."""
    if path.suffix.lower() == ".gz":
        import gzip

        return gzip.open(path, mode if "b" in mode else mode + "t", **kwargs)
    return open(path, mode, **kwargs)


def read_jsonl(path: Path) -> Iterator[RawRow]:
    with _open(path) as f:
        for line_no, data in enumerate(f, start=1):
            if not data.strip():
                continue
            raw = data.rstrip(b"\r\n").decode("utf-8", errors="backslashreplace")
            try:
                record = _as_object(json.loads(_decode(data)))
            except RowError as e:
                yield RawRow(line_no, raw, error=str(e))
            except json.JSONDecodeError as e:
                yield RawRow(line_no, raw, error=f"invalid JSON: {e.msg} at column {e.colno}")
            else:
                yield RawRow(line_no, raw, record)


def read_json(path: Path) -> Iterator[RawRow]:
    with _open(path) as f:
        data = f.read()
    try:
        text = _decode(data)
    except RowError as e:
        raise IngestError(f"{path}: {e}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        yield from read_jsonl(path)  # many .json files are really JSON lines
        return
    if isinstance(value, dict):
        value = next((v for v in value.values() if isinstance(v, list)), [value])
    if not isinstance(value, list):
        raise IngestError(f"{path}: expected a JSON array of objects")
    for i, item in enumerate(value, start=1):
        raw = json.dumps(item, ensure_ascii=False, default=str)
        try:
            yield RawRow(i, raw, _as_object(item))
        except RowError as e:
            yield RawRow(i, raw, error=str(e))


def read_csv(path: Path) -> Iterator[RawRow]:
    with _open(path, "r", encoding="utf-8", errors="surrogateescape", newline="") as f:
        reader = csv.DictReader(f)
        start = reader.line_num + 1
        for row in reader:
            values = list(row.values())
            raw = json.dumps(row, ensure_ascii=False, default=str)
            raw = raw.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            if None in row or any(isinstance(v, list) for v in values):
                err = "wrong number of fields for the CSV header"
                yield RawRow(start, raw, error=err)
            elif any(_has_surrogates(v) for v in values if isinstance(v, str)):
                yield RawRow(start, raw, error="undecodable bytes: not UTF-8")
            else:
                # an empty CSV cell means "no value"
                yield RawRow(start, raw, {k: (v if v != "" else None) for k, v in row.items()})
            start = reader.line_num + 1


def _has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def read_table_rows(table: pa.Table | datasets.Dataset) -> Iterator[RawRow]:
    """Rows of an Arrow table or a `datasets.Dataset`."""
    for i, record in enumerate(table.to_pylist(), start=1):
        yield RawRow(i, json.dumps(record, ensure_ascii=False, default=str), record)


def read_parquet(path: Path) -> Iterator[RawRow]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:
        raise IngestError(f"{path}: not a readable Parquet file ({e})") from None
    yield from read_table_rows(table)


def read_saved_dataset(path: Path, split: str) -> Iterator[RawRow]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:
        raise IngestError(f"{path}: not a dataset saved with save_to_disk ({e})") from None
    if isinstance(ds, datasets.DatasetDict):
        if split in ds:
            ds = ds[split]
        elif len(ds) == 1:
            ds = next(iter(ds.values()))
        else:
            raise IngestError(f"{path} holds splits {list(ds)}: none is named {split!r}")
    yield from read_table_rows(ds.data.table)


# -- validation ----------------------------------------------------------------------


def _type_name(v: Any) -> str:
    return type(v).__name__


def _maybe_json(value: Any) -> Any:
    """CSV cells carry lists and objects as JSON text."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def normalise(record: dict, mapping: dict[str, str], default_task: str | None) -> dict:
    """Map source columns onto prompt fields and check their types; raises RowError."""
    used = {mapping.get(f, f) for f in FIELDS}
    get = {f: record.get(mapping.get(f, f)) for f in FIELDS}

    def where(name: str) -> str:
        col = mapping.get(name, name)
        return f"'{col}'" + (f" (mapped to {name})" if col != name else "")

    prompt, messages = get["prompt"], _maybe_json(get["messages"])
    if prompt is None and messages is None:
        raise RowError(f"missing prompt: no {where('prompt')} or {where('messages')} field")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise RowError(
                f"wrong type: {where('prompt')} must be a string, got {_type_name(prompt)}"
            )
        if not prompt.strip():
            raise RowError("empty prompt")
    if messages is not None:
        messages = _check_messages(messages, where("messages"))

    task = get["task"] if get["task"] is not None else default_task
    if task is None:
        raise RowError(f"missing task: no {where('task')} field and no --task default")
    if not isinstance(task, str) or not task.strip():
        raise RowError(f"wrong type: {where('task')} must be a non-empty string")

    answer = get["answer"]
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float, type(None))):
        raise RowError(
            f"wrong type: {where('answer')} must be a string or number, got {_type_name(answer)}"
        )
    if isinstance(answer, float) and answer.is_integer():
        answer = int(answer)
    answer = None if answer is None else str(answer)

    tests = _maybe_json(get["tests"])
    if tests is not None:
        tests = _check_tests(tests, where("tests"))

    meta = _maybe_json(get["meta"])
    if meta is not None and not isinstance(meta, dict):
        raise RowError(f"wrong type: {where('meta')} must be an object, got {_type_name(meta)}")
    extra = {k: v for k, v in record.items() if k not in used and v is not None}
    meta = {**extra, **(meta or {})}

    return {
        "prompt": prompt,
        "messages": json.dumps(messages, ensure_ascii=False) if messages is not None else None,
        "task": task.strip(),
        "answer": answer,
        "tests": tests,
        "meta": json.dumps(meta, ensure_ascii=False, default=str, sort_keys=True),
    }


def _check_tests(tests: Any, where: str) -> str:
    """Test code, assert statements or {input, output} objects as text; never empty tests."""
    if isinstance(tests, str):
        if not tests.strip():
            raise RowError(f"empty tests: {where} is blank")
        return tests
    kinds = "a string, a list of strings, or a list of {input, output} objects"
    if not isinstance(tests, list):
        raise RowError(f"wrong type: {where} must be {kinds}, got {_type_name(tests)}")
    if not tests:
        raise RowError(f"empty tests: {where} is an empty list")
    if all(isinstance(t, str) for t in tests):
        blank = next((i for i, t in enumerate(tests, start=1) if not t.strip()), None)
        if blank:
            raise RowError(f"empty tests: test {blank} of {where} is blank")
    elif all(isinstance(t, dict) for t in tests):
        for i, t in enumerate(tests, start=1):
            _check_io_test(t, f"test {i} of {where}")
    else:
        raise RowError(f"wrong type: {where} must be {kinds}, not a mix")
    return json.dumps(tests, ensure_ascii=False)


def _check_io_test(test: dict, where: str) -> None:
    unknown = sorted(set(test) - {"input", "output"})
    if unknown:
        raise RowError(f"wrong type: {where} has unknown keys {unknown} (allowed: input, output)")
    for key in ("input", "output"):
        if key not in test:
            raise RowError(f"wrong type: {where} has no '{key}'")
        if not isinstance(test[key], str):
            raise RowError(
                f"wrong type: {where}: '{key}' must be a string, got {_type_name(test[key])}"
            )


def _check_messages(messages: Any, where: str) -> list[dict]:
    bad = RowError(f"wrong type: {where} must be a list of {{role, content}} objects")
    if not isinstance(messages, list) or not messages:
        raise bad
    out = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad
        if not isinstance(m.get("content"), str):
            raise bad
        out.append({"role": m["role"], "content": m["content"]})
    if not any(m["content"].strip() for m in out):
        raise RowError("empty prompt: every message is empty")
    return out


CONFLICT_FIELDS = ("split", "task", "answer", "tests")


def _conflict(new: dict, old: dict, where: str) -> str | None:
    diffs = [f for f in CONFLICT_FIELDS if new.get(f) != old.get(f)]
    if not diffs:
        return None
    f = diffs[0]
    return (
        f"conflicting duplicate: same prompt as {where} but {f} differs "
        f"({new.get(f)!r} vs {old.get(f)!r})"
    )


# -- ingest ------------------------------------------------------------------------


def iter_source(path: Path, fmt: str, split: str) -> Iterator[RawRow]:
    """Rows of `path` in format `fmt`."""
    readers = {
        "jsonl": read_jsonl,
        "json": read_json,
        "csv": read_csv,
        "parquet": read_parquet,
        "dataset": lambda p: read_saved_dataset(p, split),
    }
    return readers[fmt](path)


def ingest(
    lake: Lake,
    path: str | Path,
    dataset: str,
    split: str = "train",
    mapping: dict[str, str] | None = None,
    task: str | None = None,
    fmt: str | None = None,
    preset: str | None = None,
) -> IngestReport:
    """Ingest one file or saved dataset into `prompts`; bad rows go to `rejects`."""
    path = Path(path)
    if not path.exists():
        raise IngestError(f"{path}: no such file or folder")
    _check_split(split)
    unknown = set(mapping or {}) - set(FIELDS)
    if unknown:
        raise IngestError(
            f"--map names unknown field(s) {sorted(unknown)}; fields are {', '.join(FIELDS)}"
        )
    # a preset turns each row into prompt fields first; --map and --task still win
    chosen = _find_preset(preset) if preset else None
    if chosen:
        task = task or chosen.task
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise IngestError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    rows = iter_source(path, fmt, split)
    return ingest_rows(lake, rows, str(path.resolve()), dataset, split, mapping, task, chosen)


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise IngestError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")


def ingest_rows(
    lake: Lake,
    rows: Iterable[RawRow],
    source: str,
    dataset: str,
    split: str = "train",
    mapping: dict[str, str] | None = None,
    task: str | None = None,
    chosen: Any = None,
) -> IngestReport:
    """Ingest rows read from `source` (a file, or a generator's description) into `prompts`;
    bad rows go to `rejects`. `chosen`: a preset that turns each record into prompt fields."""
    _check_split(split)
    explicit = mapping or {}
    if chosen:
        mapping = {}
    report = IngestReport(source=source)
    stamp = now()

    valid: dict[str, dict] = {}  # prompt_id -> row, first occurrence wins
    rejects: list[dict] = []

    def reject(row: RawRow, reason: str) -> None:
        report.rejected += 1
        report.reasons[reason.split(":")[0]] += 1
        rejects.append(reject_row(source, row.line, row.raw, reason, dataset))

    for row in rows:
        report.read += 1
        if row.error:
            reject(row, row.error)
            continue
        try:
            record = chosen.transform(row.record, explicit) if chosen else row.record
            fields = normalise(record, mapping or {}, task)
        except RowError as e:
            reject(row, str(e) if chosen else _with_hint(str(e), row.record, report))
            continue
        prompt_id = content_id(dataset, fields["prompt"], fields["messages"])
        new = {
            "prompt_id": prompt_id,
            "dataset": dataset,
            "split": split,
            **fields,
            "source": source,
            "line": row.line,
            "ingested_at": stamp,
        }
        if prompt_id in valid:
            first = valid[prompt_id]
            reason = _conflict(new, first, f"line {first['line']}")
            if reason:
                reject(row, reason)
            else:
                report.already_present += 1
            continue
        valid[prompt_id] = new

    known = existing_prompts(lake, list(valid))
    fresh = []
    for prompt_id, new in valid.items():
        old = known.get(prompt_id)
        if old is None:
            fresh.append(new)
            report.prompt_ids.append(prompt_id)
            continue
        reason = _conflict(new, old, f"prompt {prompt_id} already in the lake")
        if reason:
            reject(RawRow(new["line"], _raw_of(new)), reason)
        else:
            report.already_present += 1
            report.prompt_ids.append(prompt_id)
    report.ingested = write_prompts(lake, fresh)
    write_rejects(lake, rejects)
    return report


def _find_preset(name: str):
    found = find_preset(name)
    if found is None:
        raise IngestError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    return found


def _with_hint(reason: str, record: dict, report: IngestReport) -> str:
    """`reason`, plus which preset (or --map) fits when a known dataset's row lacks a field."""
    missing = next((f for f in ("prompt", "task") if reason.startswith(f"missing {f}")), None)
    if missing is None:
        return reason

    hint = suggest(record, missing)
    if hint is None:
        return reason
    report.hints[hint] += 1
    return f"{reason} ({hint})"


def _raw_of(row: dict) -> str:
    keep = {k: row[k] for k in ("prompt", "messages", "task", "answer", "tests") if row.get(k)}
    return json.dumps(keep, ensure_ascii=False)


def parse_mapping(items: list[str]) -> dict[str, str]:
    """Turn ["prompt=question", ...] into {"prompt": "question", ...}."""
    out = {}
    for item in items:
        name, sep, column = item.partition("=")
        if not sep or not name.strip() or not column.strip():
            raise IngestError(f"--map expects field=column, got {item!r}")
        out[name.strip()] = column.strip()
    return out
