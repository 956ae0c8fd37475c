"""Stores: the Delta lake (schemas, storage, upkeep), a writer per table, views, queries, export."""
