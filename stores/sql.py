"""Read-only SQL over the lake."""

from __future__ import annotations

from typing import TYPE_CHECKING

import duckdb

from thresher.stores.lake import Lake

if TYPE_CHECKING:
    import polars as pl

READ_ONLY = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}


class QueryRefused(ValueError):
    """The query would change something, or is not a single statement."""


def check_read_only(sql: str) -> None:
    """Raise QueryRefused unless `sql` is one read-only statement."""
    statements = duckdb.extract_statements(sql)
    if len(statements) != 1:
        raise QueryRefused(f"expected one SQL statement, got {len(statements)}")
    kind = statements[0].type
    if kind not in READ_ONLY:
        name = kind.name.replace("_STATEMENT", "").replace("_", " ")
        raise QueryRefused(
            f"{name} statements are refused: `thresher sql` is read-only "
            "(SELECT, WITH ... SELECT, DESCRIBE, SHOW, EXPLAIN)"
        )


def run_sql(lake: Lake, sql: str) -> pl.DataFrame:
    """Run one read-only statement over the lake; returns a polars DataFrame.

    Raises QueryRefused for writes and duckdb.Error for a bad query.
    """
    check_read_only(sql)
    return lake.query(sql)
