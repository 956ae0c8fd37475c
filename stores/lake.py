"""The lake: a folder of Parquet tables, appended atomically, queried through DuckDB views."""

from __future__ import annotations

import atexit
import os
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from thresher.ids import content_id  # noqa: F401  (re-exported for stores)
from thresher.stores.schemas import KEYS, PASSED_SQL, SCHEMAS, TABLES, DropReason
from thresher.stores.storage import is_url, local_path, open_storage

DEFAULT_LAKE = "./lake"


def resolve_lake(path: str | os.PathLike | None = None) -> Path | str:
    """The lake's location: `path`, else $THRESHER_LAKE, else ./lake; a local folder as a
    Path (file:// URLs included), any other fsspec URL (s3://bucket/prefix) as a string."""
    location = path or os.environ.get("THRESHER_LAKE") or DEFAULT_LAKE
    return str(location).rstrip("/") if is_url(location) else local_path(location)


def now() -> datetime:
    """The current time in UTC (the lake's timestamp type)."""
    return datetime.now(UTC)


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


# The selection each round of each pipeline reads by default: the one written by the
# pipeline's latest curate run of that round. A run records its selection_id (lakes
# written before selections had ids used the run id); selections written outside any
# run count as a pipeline of their own (NULL), the latest by time.
CURRENT_SELECTIONS_SQL = """
        WITH curated AS (
            SELECT coalesce(selection_id, run_id) AS sid, round, started_at,
                   json_extract_string(config, '$.name') AS pipeline
            FROM runs WHERE flow = 'curate'),
        written AS (
            SELECT coalesce(selection_id, run_id) AS sid, round, max(created_at) AS at
            FROM selections GROUP BY ALL),
        latest AS (
            SELECT w.sid, w.round, c.pipeline FROM written w
            LEFT JOIN curated c ON c.sid = w.sid AND c.round = w.round
            QUALIFY row_number() OVER (
                PARTITION BY c.pipeline, w.round
                ORDER BY coalesce(c.started_at, w.at) DESC, w.sid) = 1)
        SELECT l.pipeline, s.* FROM selections s
        JOIN latest l ON coalesce(s.selection_id, s.run_id) = l.sid AND s.round = l.round"""

# Queries over a selections source (the current selections, or a pipeline's, for reports).
PROMPT_DIFFICULTY_SQL = f"""
        SELECT s.round, s.prompt_id, count(*) AS candidates,
               count(*) FILTER (WHERE {PASSED_SQL}) AS passed,
               avg(({PASSED_SQL})::INT) AS pass_rate,
               CASE WHEN bool_and({PASSED_SQL}) THEN 'all_pass'
                    WHEN bool_and(NOT ({PASSED_SQL})) THEN 'all_fail'
                    ELSE 'mixed' END AS kind
        FROM {{selections}} s JOIN candidates c USING (candidate_id)
        WHERE NOT coalesce(c.hinted, false)
        GROUP BY s.round, s.prompt_id"""
# over a `prompt_difficulty` source
DIFFICULTY_BY_ROUND_SQL = """
        SELECT round, count(*) AS prompts,
               count(*) FILTER (WHERE kind = 'all_pass') AS all_pass,
               count(*) FILTER (WHERE kind = 'all_fail') AS all_fail,
               count(*) FILTER (WHERE kind = 'mixed') AS mixed,
               round(avg(pass_rate), 4) AS mean_pass_rate
        FROM {difficulty} GROUP BY round ORDER BY round"""
ROUND_FUNNEL_SQL = f"""
        SELECT s.round, count(*) AS sampled,
               count(*) FILTER (WHERE coalesce(c.hinted, false)) AS hinted,
               count(*) FILTER (WHERE {PASSED_SQL}) AS passed,
               count(*) FILTER (WHERE {DropReason.too_easy.sql()}) AS too_easy,
               count(*) FILTER (WHERE {DropReason.contaminated.sql()}) AS contaminated,
               count(*) FILTER (WHERE {DropReason.duplicate_of.sql()}) AS duplicates,
               count(*) FILTER (WHERE {DropReason.capped.sql()}) AS capped,
               count(*) FILTER (WHERE {DropReason.hint_share.sql()}) AS hint_share,
               count(*) FILTER (WHERE s.kept) AS kept,
               count(*) FILTER (WHERE s.kept AND coalesce(c.hinted, false)) AS kept_hinted
        FROM {{selections}} s JOIN candidates c USING (candidate_id)
        GROUP BY s.round ORDER BY s.round"""

# Views built on the base tables: the everyday questions, answered in SQL.
DERIVED_VIEWS = {
    "current_selections": CURRENT_SELECTIONS_SQL,
    # One row per candidate: passed when it has verdicts and every verifier passed it
    # (each verifier's latest verdict, whatever its options).
    "candidate_outcomes": """
        SELECT c.candidate_id, c.prompt_id, c.round, c.model, c.run_id,
               count(v.verifier) AS n_verdicts,
               coalesce(bool_and(v.passed), false) AND count(v.verifier) > 0 AS passed
        FROM candidates c LEFT JOIN (
            SELECT * FROM verdicts QUALIFY row_number() OVER (
                PARTITION BY candidate_id, verifier ORDER BY created_at DESC) = 1
        ) v USING (candidate_id)
        GROUP BY ALL""",
    "pass_rate": """
        SELECT prompt_id, round, count(*) AS candidates,
               count(*) FILTER (WHERE passed) AS passed,
               avg(passed::INT) AS pass_rate
        FROM candidate_outcomes GROUP BY prompt_id, round""",
    "funnel": """
        SELECT round, coalesce(split_part(drop_reason, ':', 1), 'kept') AS outcome,
               count(*) AS candidates
        FROM current_selections GROUP BY ALL ORDER BY round, outcome""",
    # passed = the selection rule held (evaluation runs select nothing)
    "yield_by_round": f"""
        SELECT round, count(DISTINCT prompt_id) AS prompts, count(*) AS candidates,
               count(*) FILTER (WHERE {PASSED_SQL}) AS passed,
               round(avg(({PASSED_SQL})::INT), 4) AS pass_rate,
               count(*) FILTER (WHERE kept) AS kept,
               count(DISTINCT prompt_id) FILTER (WHERE kept) AS prompts_with_kept
        FROM current_selections GROUP BY round ORDER BY round""",
    # Per curated round and prompt, from unhinted candidates: how often the round's model
    # solved it (passed = the selection rule held), and whether it was all-pass / all-fail.
    "prompt_difficulty": PROMPT_DIFFICULTY_SQL.format(selections="current_selections"),
    # All-pass and all-fail prompts carry no signal about pass-rate changes: count them.
    "difficulty_by_round": DIFFICULTY_BY_ROUND_SQL.format(difficulty="prompt_difficulty"),
    # One row per curated round: how many candidates each stage let through.
    "round_funnel": ROUND_FUNNEL_SQL.format(selections="current_selections"),
}


_DATABASES: dict[str, duckdb.DuckDBPyConnection] = {}
_DATABASES_LOCK = threading.Lock()


@atexit.register
def _close_databases() -> None:
    # DuckDB's bindings report leaks when connections outlive interpreter shutdown
    with _DATABASES_LOCK:
        for db in _DATABASES.values():
            db.close()
        _DATABASES.clear()


class Lake:
    """A lake rooted at one folder or URL; every table is a folder of immutable Parquet files.

    `root` is the folder (a Path) of a local lake, the URL (a string) of a remote one
    (s3://bucket/prefix or any fsspec URL); `Lake(lake.root)` opens the same lake.
    """

    def __init__(self, root: str | os.PathLike | None = None, create: bool = True):
        self.root = resolve_lake(root)
        self.storage = open_storage(self.root)
        if create:
            self.init()

    @property
    def location(self) -> str:
        """Where the lake is, for messages and as a key: an absolute folder path or a URL."""
        return self.storage.location

    @property
    def remote(self) -> bool:
        """True when the lake is not a local folder (its files are not on this disk)."""
        return self.storage.remote

    def local_dir(self, *parts: str) -> Path:
        """A folder on this machine for what must live on a disk (models, reports):
        <lake>/<parts> for a local lake, ./<parts> (in the current directory) for a remote one."""
        return Path(*parts).absolute() if self.remote else Path(self.root, *parts)

    def init(self) -> None:
        """Create the table folders, each with an empty file carrying its schema.

        A lake written by an older thresher gets the current schema file, so columns
        added since read as NULL in the old files (the views union columns by name).
        """
        for table in TABLES:
            self.storage.ensure_schema(self.storage.join(table, "_schema.parquet"), SCHEMAS[table])

    def exists(self) -> bool:
        """True when the folder is a lake (a lake from an older thresher counts)."""
        return self.storage.exists(self.storage.join("prompts", "_schema.parquet"))

    def glob(self, table: str) -> str:
        """The DuckDB glob that reads every committed file of `table` (never a temp file)."""
        return self.storage.join(table, "*.parquet")

    # -- writing -------------------------------------------------------------

    def append(self, table: str, rows: pa.Table | Sequence[dict] | Any) -> int:
        """Append rows (list of dicts, Arrow or polars) as one new file; returns rows written.

        Rows whose key is already in the table, or repeated in `rows`, are skipped,
        so re-running a step adds nothing.
        """
        data = self._to_arrow(table, rows)
        keys = KEYS[table]
        if keys and data.num_rows:
            data = self._drop_known(table, data, keys)
        if data.num_rows == 0:
            return 0
        name = f"part-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.parquet"
        self.storage.write_parquet(data, self.storage.join(table, name))
        return data.num_rows

    def _to_arrow(self, table: str, rows: Any) -> pa.Table:
        schema = SCHEMAS[table]
        if isinstance(rows, pa.Table):
            data = rows
        elif hasattr(rows, "to_arrow"):  # polars DataFrame
            data = rows.to_arrow()
        else:
            rows = list(rows)
            data = pa.Table.from_pylist(rows, schema=schema)
        missing = [f.name for f in schema if f.name not in data.column_names]
        for name in missing:
            data = data.append_column(name, pa.nulls(data.num_rows, schema.field(name).type))
        return data.select(schema.names).cast(schema)

    def _drop_known(self, table: str, data: pa.Table, keys: tuple[str, ...]) -> pa.Table:
        con = self.connect()
        con.register("incoming", data)
        cols = ", ".join(keys)
        on = " AND ".join(f"i.{k} IS NOT DISTINCT FROM e.{k}" for k in keys)
        # row_number keeps the first of repeated keys within the batch
        query = f"""
            WITH numbered AS (
                SELECT *, row_number() OVER () AS _pos FROM incoming
            ), firsts AS (
                SELECT * EXCLUDE (_rn) FROM (
                    SELECT *, row_number() OVER (PARTITION BY {cols} ORDER BY _pos) AS _rn
                    FROM numbered) WHERE _rn = 1
            ), existing AS (
                SELECT DISTINCT {cols} FROM {table}
            )
            SELECT i.* EXCLUDE (_pos) FROM firsts i
            WHERE NOT EXISTS (SELECT 1 FROM existing e WHERE {on})
            ORDER BY i._pos"""
        out = con.sql(query).to_arrow_table()
        con.close()
        return out.select(data.column_names).cast(data.schema)

    # -- reading -------------------------------------------------------------

    def connect(self) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection with a view per table and the derived views; close it after use.

        Views read the Parquet files at query time, so every query sees every committed
        append. The views are built once per lake and process; each call returns a cheap
        cursor on them (opening a DuckDB database costs more than most queries here).
        A remote lake's filesystem is registered with DuckDB and its cached listings are
        dropped on each call, so appends by other processes are seen too.
        """
        key = self.location
        self.storage.refresh()
        with _DATABASES_LOCK:
            db = _DATABASES.get(key)
            if db is None:
                if not self.exists():
                    raise FileNotFoundError(
                        f"no lake at {self.root} (run `thresher ingest` first, or pass --lake)"
                    )
                self.init()  # tables added since the lake was made, current schema files
                db = duckdb.connect()
                self.storage.attach(db)
                db = _DATABASES[key] = self._create_views(db)
        return db.cursor()

    def _create_views(self, con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
        for table in TABLES:
            source = f"read_parquet({_sql_str(self.glob(table))}, union_by_name = true)"
            if table == "runs":  # append-only status updates: show the latest per run
                source = (
                    f"(SELECT * FROM {source} QUALIFY row_number() OVER "
                    "(PARTITION BY run_id ORDER BY updated_at DESC) = 1)"
                )
            con.execute(f"CREATE VIEW {table} AS SELECT * FROM {source}")
        for name, body in DERIVED_VIEWS.items():
            con.execute(f"CREATE VIEW {name} AS {body}")
        return con

    def query(self, sql: str, params: Iterable[Any] | dict[str, Any] | None = None):
        """Run SQL over the lake's views and return a polars DataFrame ($name params
        from a dict, ? params from a sequence)."""
        con = self.connect()
        try:
            if params is not None and not isinstance(params, dict):
                params = list(params)
            return con.sql(sql, params=params or None).pl()
        finally:
            con.close()

    def count(self, table: str) -> int:
        """Rows in `table`."""
        return int(self.query(f"SELECT count(*) AS n FROM {table}")["n"][0])
