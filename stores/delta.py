"""Each lake table is a Delta Lake table (delta-rs): batches commit exactly once, every read
is one snapshot's file list, any kept version can be read again, small files are compacted.

Commits past the last checkpoints are moved out of `_delta_log` into `<lake>/_history/`:
delta-rs lists the whole log folder on every commit (on a local disk), so a log that keeps
every commit makes each append slower than the one before. Moved commits stay readable
here (`files_at`, `version_at`); other Delta readers see the versions since the
second-to-last checkpoint.
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

import pyarrow as pa

HISTORY = "_history"
CHECKPOINT_INTERVAL = 100  # delta-rs's default: a checkpoint every 100 commits
COMMIT_ATTEMPTS = 20
REOPEN_AFTER = CHECKPOINT_INTERVAL  # commits an open table follows before it is reopened


def _table_config(schema: pa.Schema) -> dict[str, str]:
    """Table properties: file statistics for `round` only. Statistics of every column (answer
    texts included) make each commit slower as files accumulate (delta-rs re-reads them
    with the table's state), and the lake's own reads list files without them."""
    if "round" in schema.names:
        return {"delta.dataSkippingStatsColumns": "round"}
    return {"delta.dataSkippingNumIndexedCols": "0"}


def _writer_properties() -> Any:
    """Parquet files compressed with zstd (answer texts shrink about twice as much as
    with delta-rs's default, snappy)."""
    from deltalake import WriterProperties

    return WriterProperties(compression="ZSTD")


class SnapshotGone(LookupError):
    """The version asked for is older than the history this lake keeps."""


def _version_of(name: str) -> tuple[int, str] | None:
    """(version, kind) of a log file name: kind is "json" or "checkpoint"; None otherwise."""
    head, _, rest = name.partition(".")
    if len(head) != 20 or not head.isdigit():
        return None
    if rest == "json":
        return int(head), "json"
    if rest.startswith("checkpoint") and rest.endswith("parquet"):
        return int(head), "checkpoint"
    return None


def _commit_info(actions: list[dict[str, Any]]) -> dict[str, Any]:
    """A commit's commitInfo action ({} when it has none)."""
    return next((a["commitInfo"] for a in actions if "commitInfo" in a), {})


def _commit_time(info: dict[str, Any]) -> datetime | None:
    """When a commit was made, from its commitInfo (None when it does not say)."""
    if "timestamp" not in info:
        return None
    return datetime.fromtimestamp(info["timestamp"] / 1000, UTC)


class DeltaTables:
    """The Delta tables of one lake, opened once per process and refreshed on demand."""

    def __init__(self, storage: Any):
        self.storage = storage
        self._open: dict[str, Any] = {}
        self._opened_at: dict[str, int] = {}
        self._lock = threading.RLock()

    def uri(self, table: str) -> str:
        """Where `table`'s Delta table lives."""
        return self.storage.join(table)

    def exists(self, table: str) -> bool:
        """True when `table` has a Delta log."""
        return self.storage.exists(self.storage.join(table, "_delta_log"))

    def table(self, table: str, refresh: bool = True) -> Any:
        """The table at its latest version (refreshed from the log unless `refresh` is False).

        An open table is reopened once it has followed a checkpoint interval of commits:
        delta-rs's incremental updates make each later commit through it slower, while a
        table opened from a checkpoint starts fresh.
        """
        from deltalake import DeltaTable

        with self._lock:
            dt = self._open.get(table)
            if dt is not None and refresh:
                found = self._next_commit(table, dt.version())
                if found == "history":  # far behind: open afresh from the latest checkpoint
                    dt = None
                elif found == "log":
                    try:
                        dt.update_incremental()
                    except Exception:  # its log moved on past what it can follow
                        dt = None
            if dt is not None and dt.version() - self._opened_at[table] >= REOPEN_AFTER:
                dt = None  # (its own commits advance it too)
            if dt is None:
                dt = self._open[table] = DeltaTable(
                    self.uri(table), storage_options=self.storage.delta_options()
                )
                self._opened_at[table] = dt.version()
            return dt

    def _next_commit(self, table: str, version: int) -> str | None:
        """Where the commit after `version` is: "log", "history" (moved on: the log went
        past it), or None (not committed yet). A look at one file name, not a listing."""
        name = f"{version + 1:020d}.json"
        if self.storage.exists(self.storage.join(table, "_delta_log", name)):
            return "log"
        if self.storage.exists(self.storage.join(HISTORY, table, name)):
            return "history"
        return None

    def create(self, table: str, schema: pa.Schema) -> None:
        """Create `table` unless it exists; add the columns `schema` has and it lacks."""
        from deltalake import DeltaTable, write_deltalake

        options = self.storage.delta_options()
        config = _table_config(schema)
        if not self.exists(table):
            DeltaTable.create(
                self.uri(table), schema, mode="ignore", storage_options=options,
                configuration=config,
            )  # fmt: skip
        dt = self.table(table)
        if any(dt.metadata().configuration.get(k) != v for k, v in config.items()):
            dt.alter.set_table_properties(config)
        have = {f.name for f in dt.schema().fields}
        if not set(schema.names) <= have:
            write_deltalake(dt, schema.empty_table(), mode="append", schema_mode="merge")

    def version(self, table: str) -> int:
        """The table's latest version."""
        return self.table(table).version()

    def committed(self, table: str, batch_id: str) -> bool:
        """True when a batch with this id has been committed to `table`."""
        return self.table(table).transaction_version(batch_id) is not None

    def commit(self, table: str, data: pa.Table, batch_id: str | None = None) -> bool:
        """Append `data` as one commit, exactly once per `batch_id`; False when that batch
        was committed before. A concurrent commit is retried; a batch that another process
        committed meanwhile is found in the log and not written again."""
        from deltalake import CommitProperties, Transaction, write_deltalake
        from deltalake.exceptions import CommitFailedError

        props = None
        if batch_id is not None:
            props = CommitProperties(app_transactions=[Transaction(app_id=batch_id, version=1)])
        for attempt in range(COMMIT_ATTEMPTS):
            with self._lock:
                dt = self.table(table)
                if batch_id is not None and dt.transaction_version(batch_id) is not None:
                    return False
                try:
                    write_deltalake(
                        dt, data, mode="append", commit_properties=props,
                        writer_properties=_writer_properties(),
                    )  # fmt: skip
                except CommitFailedError:
                    if attempt == COMMIT_ATTEMPTS - 1:
                        raise
                    self._open.pop(table, None)  # read the log afresh and look again
                    continue
                version = dt.version()
            if version % CHECKPOINT_INTERVAL == 0:
                self.prune_log(table)
            return True
        raise AssertionError("unreachable")

    def files(self, table: str, refresh: bool = True) -> tuple[int, list[str]]:
        """The latest version of `table` and the data files it consists of (as of the last
        refresh, when `refresh` is False)."""
        with self._lock:
            dt = self.table(table, refresh)
            return dt.version(), dt.file_uris()

    # -- history -------------------------------------------------------------

    def _entries_in(self, folder: str) -> dict[tuple[int, str], str]:
        """The commit and checkpoint files in `folder`, by (version, kind)."""
        out: dict[tuple[int, str], str] = {}
        for path in self.storage.list(folder):
            found = _version_of(path.rpartition("/")[2])
            if found:
                out[found] = path
        return out

    def _log_entries(self, table: str) -> dict[tuple[int, str], str]:
        """Every commit and checkpoint file of `table`, in the log or moved to history."""
        return {
            **self._entries_in(self.storage.join(HISTORY, table)),
            **self._entries_in(self.storage.join(table, "_delta_log")),
        }

    def prune_log(self, table: str) -> int:
        """Move commits and checkpoints older than the second-to-last checkpoint from the
        log into the lake's history; returns files moved."""
        entries = self._entries_in(self.storage.join(table, "_delta_log"))
        checkpoints = sorted(v for v, kind in entries if kind == "checkpoint")
        if len(checkpoints) < 2:
            return 0
        keep_from = checkpoints[-2]
        old = [p for (v, kind), p in entries.items() if v < keep_from]
        old += [p for (v, kind), p in entries.items() if v == keep_from and kind == "json"]
        history = self.storage.join(HISTORY, table)
        moved = 0
        for path in sorted(old):
            try:
                self.storage.move(path, f"{history}/{path.rpartition('/')[2]}")
                moved += 1
            except FileNotFoundError:  # another writer moved it first
                pass
        return moved

    def _read_log_file(self, table: str, path: str) -> bytes:
        """A commit or checkpoint file, also when it moved to the history since listed."""
        try:
            return self.storage.read_bytes(path)
        except FileNotFoundError:
            name = path.rpartition("/")[2]
            return self.storage.read_bytes(self.storage.join(HISTORY, table, name))

    def _actions(self, table: str, path: str) -> list[dict[str, Any]]:
        """The actions (add, remove, commitInfo, ...) of one commit file."""
        return [json.loads(line) for line in self._read_log_file(table, path).decode().splitlines()]

    def files_at(self, table: str, version: int) -> list[str]:
        """The data files of `table` at `version`, from the log and the lake's history."""
        entries = self._log_entries(table)
        checkpoints = [v for v, kind in entries if kind == "checkpoint" and v <= version]
        start = max(checkpoints, default=-1)
        live: dict[str, None] = {}
        if start >= 0:
            import pyarrow.parquet as pq

            state = pq.read_table(
                pa.BufferReader(self._read_log_file(table, entries[(start, "checkpoint")])),
                columns=["add"],
            )
            for add in state.column("add").to_pylist():
                if add:
                    live[add["path"]] = None
        for v in range(start + 1, version + 1):
            path = entries.get((v, "json"))
            if path is None:
                raise SnapshotGone(
                    f"{table} version {version} is not in the lake's history "
                    f"(versions {self.oldest_version(table)}..{self.version(table)} are)"
                )
            for action in self._actions(table, path):
                if "add" in action:
                    live[action["add"]["path"]] = None
                elif "remove" in action:
                    live.pop(action["remove"]["path"], None)
        return [self.storage.join(table, unquote(p)) for p in live]

    def oldest_version(self, table: str) -> int:
        """The oldest version `files_at` can read."""
        entries = self._log_entries(table)
        jsons = sorted(v for v, kind in entries if kind == "json")
        if not jsons:
            return 0
        first, have = jsons[-1], set(jsons)
        while first - 1 in have:  # the unbroken run of commits back from the latest
            first -= 1
        if first == 0:
            return 0
        bases = [v for v, kind in entries if kind == "checkpoint" and v >= first - 1]
        return min(bases, default=jsons[-1])

    def version_at(self, table: str, when: datetime) -> int | None:
        """The latest version of `table` committed at or before `when`; None when the
        table did not exist yet."""
        entries = self._log_entries(table)
        versions = sorted(v for v, kind in entries if kind == "json")
        lo, hi, found = 0, len(versions) - 1, None
        while lo <= hi:  # commit times grow with versions: a binary search reads few files
            mid = (lo + hi) // 2
            info = _commit_info(self._actions(table, entries[(versions[mid], "json")]))
            stamp = _commit_time(info)
            if stamp is not None and stamp <= when:
                found, lo = versions[mid], mid + 1
            else:
                hi = mid - 1
        return found

    # -- maintenance ---------------------------------------------------------

    def small_files(self, table: str, target_size: int) -> int:
        """How many of the table's files are under half the target file size."""
        actions = self.table(table).get_add_actions(flatten=True)
        sizes = pa.table(actions).column("size_bytes").to_pylist()
        return sum(1 for s in sizes if s < target_size // 2)

    def compact(self, table: str, target_size: int) -> dict[str, Any]:
        """Rewrite small files into files of about `target_size` bytes (one commit)."""
        with self._lock:
            metrics = self.table(table).optimize.compact(
                target_size=target_size, writer_properties=_writer_properties()
            )
        self.prune_log(table)
        return metrics

    def vacuum(self, table: str, retain_hours: float) -> list[str]:
        """Delete files no version of the last `retain_hours` needs, and files no commit
        ever referenced (a writer killed before its commit); returns what was deleted."""
        with self._lock:
            return self.table(table).vacuum(
                retention_hours=int(retain_hours),
                dry_run=False,
                enforce_retention_duration=False,
                full=True,
            )

    def history(self, table: str, limit: int | None = None) -> list[dict[str, Any]]:
        """The table's commits, newest first: version, time, operation, rows and files added."""
        entries = self._log_entries(table)
        versions = sorted((v for v, kind in entries if kind == "json"), reverse=True)
        out = []
        for v in versions[:limit]:
            actions = self._actions(table, entries[(v, "json")])
            info = _commit_info(actions)
            adds = [a["add"] for a in actions if "add" in a]
            rows = sum(json.loads(a.get("stats") or "{}").get("numRecords", 0) for a in adds)
            out.append(
                {
                    "table": table,
                    "version": v,
                    "committed_at": _commit_time(info),
                    "operation": info.get("operation"),
                    "files_added": len(adds),
                    "rows_added": rows,
                }
            )
        return out
