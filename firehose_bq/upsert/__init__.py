"""Upsert and delete: a keyed changelog applied to BigQuery through intermediate tables and MERGE flushes."""
