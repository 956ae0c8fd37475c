"""Import human labels of candidates (an audit sheet's CSV) into the `labels` table, and
labels of prompts' references (its `reference_label` and `right_answer` columns, filled
for suspect references) into `reference_labels`.

A row with an empty label is skipped; a row whose label or candidate cannot be read goes
to `rejects` with its reason. A label is identified by its candidate, who gave it, the
label and the note, so importing the same file twice adds nothing and a changed label
is a new row (a candidate's label is its latest).
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from thresher.ids import content_id
from thresher.ingest.load import read_csv
from thresher.stores.lake import Lake, now
from thresher.stores.queries import existing_candidates, existing_prompts
from thresher.stores.tables import (
    reject_row,
    write_labels,
    write_reference_labels,
    write_rejects,
)

LABELS = {
    "correct": "correct",
    "right": "correct",
    "yes": "correct",
    "y": "correct",
    "true": "correct",
    "1": "correct",
    "c": "correct",
    "incorrect": "incorrect",
    "wrong": "incorrect",
    "no": "incorrect",
    "n": "incorrect",
    "false": "incorrect",
    "0": "incorrect",
    "i": "incorrect",
}


class LabelFileError(ValueError):
    """A file that is not a label sheet at all (no candidate_id or label column)."""


@dataclass
class LabelImport:
    """What an import did."""

    source: str
    read: int = 0
    imported: int = 0
    already: int = 0
    unlabelled: int = 0
    references: int = 0  # reference labels imported
    rejected: int = 0
    reasons: list[str] = field(default_factory=list)


REFERENCE_LABELS = {"right": "right", "correct": "right", "yes": "right", "wrong": "wrong",
                    "incorrect": "wrong", "no": "wrong"}  # fmt: skip


def normalise_label(value: str | None) -> str | None:
    """`correct` or `incorrect` from the spellings a person types; None when unknown."""
    return LABELS.get((value or "").strip().lower().rstrip("."))


def default_who() -> str:
    """Who labels when the file does not say: $THRESHER_USER, else the login name."""
    try:
        return os.environ.get("THRESHER_USER") or getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _when(value: str | None, fallback: datetime) -> datetime:
    if not value:
        return fallback
    try:
        t = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return fallback
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def import_labels(lake: Lake, path: str | Path, who: str | None = None) -> LabelImport:
    """Read a label CSV (columns candidate_id and label; note, who, sheet_id and
    labelled_at when present) into `labels`; returns what happened."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    source = str(path.resolve())
    report = LabelImport(source=source)
    rows = list(read_csv(path))
    header = set(rows[0].record) if rows and rows[0].record else set()
    if rows and rows[0].record is not None and not {"candidate_id", "label"} <= header:
        raise LabelFileError(
            f"{path}: not a label sheet: it needs candidate_id and label columns "
            f"(it has {', '.join(sorted(header)) or 'none'})"
        )
    stamp = now()
    fallback_who = who or default_who()
    known = existing_candidates(
        lake, [r.record["candidate_id"] for r in rows if r.record and r.record["candidate_id"]]
    )
    prompts = existing_prompts(
        lake, [r.record["prompt_id"] for r in rows if r.record and r.record.get("prompt_id")]
    )
    labels, rejects, references = [], [], []

    def reject(line: int, raw: str, reason: str) -> None:
        report.rejected += 1
        report.reasons.append(f"line {line}: {reason}")
        rejects.append(reject_row(source, line, raw, reason, "labels"))

    for row in rows:
        report.read += 1
        if row.error:
            reject(row.line, row.raw, row.error)
            continue
        rec = row.record
        person = (rec.get("who") or "").strip() or fallback_who
        if (rec.get("reference_label") or "").strip():
            ref = reference_label(rec, person, source, row.line, stamp, prompts)
            if isinstance(ref, str):
                reject(row.line, row.raw, ref)
                continue
            references.append(ref)
        if not (rec.get("label") or "").strip():
            report.unlabelled += not (rec.get("reference_label") or "").strip()
            continue
        label = normalise_label(rec["label"])
        cid = rec.get("candidate_id")
        if label is None:
            reject(row.line, row.raw, f"label {rec['label']!r} is not correct or incorrect")
            continue
        if not cid or cid not in known:
            reject(row.line, row.raw, f"candidate_id {cid!r} is not in the lake")
            continue
        note = (rec.get("note") or "").strip() or None
        labels.append(
            {
                "label_id": content_id("label", cid, person, label, note),
                "candidate_id": cid,
                "label": label,
                "who": person,
                "note": note,
                "sheet_id": rec.get("sheet_id"),
                "source": source,
                "line": row.line,
                "labelled_at": _when(rec.get("labelled_at"), stamp),
            }
        )
    report.references = write_reference_labels(lake, references)
    report.imported = write_labels(lake, labels)
    report.already = len(labels) - report.imported
    write_rejects(lake, rejects)
    return report


def reference_label(
    rec: dict, who: str, source: str, line: int, stamp: datetime, prompts: dict[str, dict]
) -> dict | str:
    """The `reference_labels` row of a sheet row's reference_label (right, or wrong with
    right_answer), or why it cannot be read."""
    label = REFERENCE_LABELS.get(rec["reference_label"].strip().lower().rstrip("."))
    pid = rec.get("prompt_id")
    answer = (rec.get("right_answer") or "").strip() or None
    if label is None:
        return f"reference_label {rec['reference_label']!r} is not right or wrong"
    if not pid or pid not in prompts:
        return f"prompt_id {pid!r} is not in the lake"
    if label == "wrong" and answer is None:
        return "reference_label wrong needs the right answer in right_answer"
    note = (rec.get("note") or "").strip() or None
    return {
        "label_id": content_id("reference-label", pid, who, label, answer, note),
        "prompt_id": pid,
        "label": label,
        "answer": answer if label == "wrong" else None,
        "reference": prompts[pid]["answer"],
        "who": who,
        "note": note,
        "sheet_id": rec.get("sheet_id"),
        "source": source,
        "line": line,
        "labelled_at": _when(rec.get("labelled_at"), stamp),
    }
