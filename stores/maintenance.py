"""Keeping a lake fast and small: compaction, vacuum, snapshots of the past, migration of
lakes written as plain Parquet folders by older thresher versions."""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from thresher.stores.lake import Lake
from thresher.stores.schemas import KEYS, SCHEMAS, TABLES

MIB = 1024 * 1024
# vacuum keeps a week of history unless told otherwise (Delta's own default)
DEFAULT_RETAIN_HOURS = 168
# below this, a query that started before a compaction could lose files it is reading
MIN_SAFE_RETAIN_HOURS = 1


def _tables(table: str | None) -> Iterable[str]:
    if table is None:
        return TABLES
    if table not in TABLES:
        raise ValueError(f"no table {table!r}: tables are {', '.join(TABLES)}")
    return (table,)


def compact(lake: Lake, table: str | None = None, target_mb: int = 128) -> dict[str, dict]:
    """Rewrite each table's small files into files of about `target_mb` MiB; returns, per
    table, the files before and after (queries return the same rows)."""
    out = {}
    for t in _tables(table):
        before = len(lake.tables.files(t)[1])
        metrics = lake.tables.compact(t, target_mb * MIB) if before > 1 else {}
        out[t] = {
            "files_before": before,
            "files_after": len(lake.tables.files(t)[1]),
            "files_removed": metrics.get("numFilesRemoved", 0),
            "files_added": metrics.get("numFilesAdded", 0),
        }
    return out


def maybe_compact(lake: Lake, small_files: int, target_mb: int = 128) -> dict[str, dict]:
    """Compact the tables with at least `small_files` files under half the target size
    (0: never); returns what was compacted."""
    if small_files <= 0:
        return {}
    due = [t for t in TABLES if lake.tables.small_files(t, target_mb * MIB) >= small_files]
    return {t: compact(lake, t, target_mb)[t] for t in due}


def vacuum(
    lake: Lake, retain_hours: float = DEFAULT_RETAIN_HOURS, table: str | None = None,
    force: bool = False,
) -> dict[str, int]:  # fmt: skip
    """Delete the files no version of the last `retain_hours` needs (and files of commits
    that never happened); returns files deleted per table."""
    if retain_hours < MIN_SAFE_RETAIN_HOURS and not force:
        raise ValueError(
            f"--retain {retain_hours:g} could delete files a running query is reading "
            f"(anything under {MIN_SAFE_RETAIN_HOURS} h); pass --force if nothing reads the lake"
        )
    return {t: len(lake.tables.vacuum(t, retain_hours)) for t in _tables(table)}


def history(lake: Lake, table: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
    """The latest commits of each table (newest first)."""
    return [row for t in _tables(table) for row in lake.tables.history(t, limit)]


class BadSnapshot(ValueError):
    """An --as-of value that names no snapshot of the lake."""


def as_of_versions(lake: Lake, as_of: str) -> dict[str, int]:
    """The table versions an --as-of value names: a time (each table as it was then),
    TABLE=VERSION[,TABLE=VERSION] (others at their latest), or run:RUN_ID (the versions
    that run read). A table that did not exist at that time maps to -1 (empty)."""
    as_of = as_of.strip()
    if as_of.startswith("run:"):
        import json

        run_id = as_of[4:]
        rows = lake.query(
            "SELECT read_versions FROM runs WHERE run_id = ? OR run_id LIKE ? || '%'",
            [run_id, run_id],
        )["read_versions"].to_list()
        if not rows:
            raise BadSnapshot(f"no run {run_id!r} in the lake")
        if rows[0] is None:
            raise BadSnapshot(f"run {run_id!r} was recorded before runs kept table versions")
        return {t: int(v) for t, v in json.loads(rows[0]).items()}
    if "=" in as_of:
        out = {}
        for part in as_of.split(","):
            name, _, version = part.partition("=")
            name = name.strip()
            if name not in TABLES or not version.strip().isdigit():
                raise BadSnapshot(f"{part!r}: expected TABLE=VERSION with a table of the lake")
            latest = lake.tables.version(name)
            if int(version) > latest:
                raise BadSnapshot(f"{name} has versions 0..{latest}, not {version.strip()}")
            out[name] = int(version)
        return out
    if as_of.isdigit():
        raise BadSnapshot(
            f"--as-of {as_of}: each table has its own versions; name them (candidates={as_of}), "
            "give a time (2026-12-01T14:00), or a run (run:RUN_ID); `thresher history` "
            "lists every table's versions"
        )
    try:
        when = datetime.fromisoformat(as_of)
    except ValueError:
        raise BadSnapshot(
            f"--as-of {as_of!r}: expected a time (2026-12-01T14:00, UTC unless it has an "
            "offset), TABLE=VERSION or run:RUN_ID"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    out = {}
    for t in TABLES:
        version = lake.tables.version_at(t, when)
        out[t] = -1 if version is None else version
    return out


LEGACY_PART = re.compile(r"^part-\d{20}-[0-9a-f]{8}\.parquet$")


def migrate(location: Any) -> dict[str, int]:
    """Convert a lake of plain Parquet folders (older thresher) into Delta tables, one
    commit per table, exactly once; returns rows per table. Legacy files are deleted
    once their table is committed, so an interrupted migration is simply run again."""
    import duckdb

    lake = Lake(location, create=False)
    storage, tables = lake.storage, lake.tables
    out = {}
    for t in TABLES:
        folder = storage.join(t)
        legacy = [p for p in storage.list(folder) if LEGACY_PART.match(p.rpartition("/")[2])]
        schema_file = storage.join(t, "_schema.parquet")
        if not legacy and not storage.exists(schema_file):
            continue
        tables.create(t, SCHEMAS[t])
        rows = 0
        if legacy:
            con = duckdb.connect()
            storage.attach(con)
            listed = ", ".join("'" + p.replace("'", "''") + "'" for p in legacy)
            data = con.sql(
                f"SELECT * FROM read_parquet([{listed}], union_by_name = true)"
            ).to_arrow_table()
            con.close()
            data = lake._to_arrow(t, data)
            if KEYS[t]:  # older appends could race: keep one row per key
                data = lake._first_of_keys(data, KEYS[t])
            rows = data.num_rows
            tables.commit(t, data, batch_id=f"{t}:migrate")
        for path in [*legacy, schema_file]:
            storage.delete(path)
        for path in storage.list(folder):  # temp files of writers killed long ago
            if path.rpartition("/")[2].endswith(".tmp"):
                storage.delete(path)
        out[t] = rows
    Lake(location)  # every table present, schema files current
    return out
