"""Metadata: the JSON file describing a database's semantic types, keys, time columns and tasks."""

from confluence.schema.metadata import (
    ColumnMeta,
    DatabaseMeta,
    TableMeta,
    TaskMeta,
    load_metadata,
    save_metadata,
)

__all__ = ["ColumnMeta", "DatabaseMeta", "TableMeta", "TaskMeta", "load_metadata", "save_metadata"]
