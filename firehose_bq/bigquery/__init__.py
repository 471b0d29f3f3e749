"""BigQuery: client, error classification, tables, and the write paths."""
