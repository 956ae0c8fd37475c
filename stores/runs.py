"""The `runs` table: one row per status change of a flow run; the view shows the latest."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, NotRequired, TypedDict, Unpack

from thresher.stores.lake import Lake, now
from thresher.tracking import dotted


class Run(TypedDict):
    """What identifies a tracked run besides its id (record_run checks the names)."""

    flow: str
    round_: int
    model: str
    config: dict[str, Any]
    selection_id: NotRequired[str | None]


def record_run(
    lake: Lake,
    run_id: str,
    *,
    flow: str,
    round_: int,
    model: str,
    config: dict[str, Any],
    status: str,
    started_at: datetime,
    summary: dict[str, Any] | None = None,
    finished: bool = False,
    selection_id: str | None = None,
    read_versions: dict[str, int] | None = None,
) -> None:
    """Append the run's current status (with the table versions it read, when known)."""
    stamp = now()
    lake.append(
        "runs",
        [
            {
                "run_id": run_id,
                "flow": flow,
                "round": round_,
                "model": model,
                "config": json.dumps(config, sort_keys=True, default=str),
                "selection_id": selection_id,
                "read_versions": json.dumps(read_versions, sort_keys=True)
                if read_versions
                else None,
                "status": status,
                "summary": json.dumps(summary or {}, sort_keys=True, default=str),
                "started_at": started_at,
                "finished_at": stamp if finished else None,
                "updated_at": stamp,
            }
        ],
    )


@contextmanager
def tracked_run(lake: Lake, run_id: str, **run: Unpack[Run]) -> Iterator[dict[str, Any]]:
    """Record a run as running, then completed with the summary the body puts in the
    yielded dict, or failed with that summary so far and the error that escaped it. Every
    row records the table versions of the lake snapshot read last before the run began (a
    train run's data)."""
    fixed = dict(started_at=now(), read_versions=lake.read_versions() or lake.versions())
    record_run(lake, run_id, status="running", **fixed, **run)
    summary: dict[str, Any] = {}
    try:
        yield summary
    except BaseException as e:
        # what the body recorded before it failed stays (which verdicts it read, ...)
        error = {**summary, "error": f"{type(e).__name__}: {e}"}
        record_run(lake, run_id, status="failed", summary=error, finished=True, **fixed, **run)
        raise
    record_run(lake, run_id, status="completed", summary=summary, finished=True, **fixed, **run)


def latest_run(lake: Lake, run_id: str) -> dict[str, Any] | None:
    """The run's latest status row (config and summary parsed), or None."""
    rows = lake.query(
        "SELECT * FROM runs WHERE run_id = ? ORDER BY updated_at DESC LIMIT 1", [run_id]
    ).to_dicts()
    if not rows:
        return None
    row = rows[0]
    row["config"] = json.loads(row["config"] or "{}")
    row["summary"] = json.loads(row["summary"] or "{}")
    return row


def config_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The settings `after` changes, as "select.cap 1 -> 3" (keys only `after` has count
    when they differ from nothing)."""
    old, new = dotted(before), dotted(after)
    return [
        f"{key} {json.dumps(old.get(key), default=str)} -> {json.dumps(value, default=str)}"
        for key, value in sorted(new.items())
        if old.get(key) != value
    ]


def latest_rm_check(lake: Lake, model: str) -> dict[str, Any] | None:
    """The latest completed `rm-check` of reward model `model` (as the runs table records
    it): its summary (pairs, accuracy, low, high, ...) with run_id and checked_at, or None."""
    rows = lake.query(
        """SELECT run_id, summary, finished_at FROM runs
           WHERE flow = 'rm-check' AND model = ? AND status = 'completed'
           ORDER BY finished_at DESC LIMIT 1""",
        [model],
    ).to_dicts()
    if not rows:
        return None
    row = rows[0]
    checked_at = row["finished_at"].astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return {**json.loads(row["summary"] or "{}"), "run_id": row["run_id"], "checked_at": checked_at}
