"""The lake: table schemas, atomic appends, DuckDB views, ingest, SQL and selection."""
