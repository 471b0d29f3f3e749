"""firehose-bq: a protobuf-driven Kafka → Spark → BigQuery sink."""
