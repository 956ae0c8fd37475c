"""Verify candidates produced anywhere: a JSONL of prompt fields plus a `completion`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl

from thresher.stores.schemas import PROMPT_FIELDS
from thresher.verifiers import get_verifier

FIELDS = PROMPT_FIELDS


def read_rows(path: Path) -> Iterator[tuple[int, dict | None, str | None]]:
    """(line, row, error) for every non-blank line of a JSONL file."""
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                yield line_no, None, "undecodable bytes: not UTF-8"
                continue
            except json.JSONDecodeError as e:
                yield line_no, None, f"invalid JSON: {e.msg}"
                continue
            if not isinstance(row, dict):
                yield line_no, None, "row is not a JSON object"
            elif not isinstance(row.get("completion"), str):
                yield line_no, None, "missing completion: each row needs a 'completion' string"
            else:
                yield line_no, row, None


def _as_text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def verify_file(
    path: str | Path, names: list[str], options: dict[str, dict] | None = None
) -> Iterator[dict]:
    """One verdict row per (row, verifier); a bad row gives one row with `error` set."""
    rows, errors = [], []
    for line, row, error in read_rows(Path(path)):
        if error:
            errors.append({"line": line, "error": error})
            continue
        answer = row.get("answer")
        rows.append(
            {
                "candidate_id": str(row.get("id", f"line-{line}")),
                "prompt_id": str(row.get("prompt_id", f"line-{line}")),
                "line": line,
                "text": row["completion"],
                **{f: _as_text(row.get(f)) for f in FIELDS if f != "answer"},
                "answer": None if answer is None else str(answer),
            }
        )
    yield from errors
    if not rows:
        return
    batch = pl.DataFrame(rows, schema={k: pl.Int64 if k == "line" else pl.String for k in rows[0]})
    for name in names:
        verdicts = get_verifier(name, (options or {}).get(name)).run(batch)
        for line, verdict in zip(batch["line"], verdicts.iter_rows(named=True), strict=True):
            yield {"line": line, **verdict}
