"""JSON input's schema layer: schema files, payload columns, and the settings that go with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.cloud.bigquery import SchemaField

from firehose_bq.config import Config
from firehose_bq.errors import ConfigError, SchemaError
from firehose_bq.json_tables import payload_columns, read_schema_file, schema_fields, schema_json
from firehose_bq.schema import MetadataColumns
from tests.unit.test_config import MINIMAL

FIELDS = [{"name": "id", "type": "STRING", "mode": "REQUIRED"},
          {"name": "client", "type": "RECORD", "fields": [{"name": "os", "type": "STRING"}]}]


@pytest.mark.parametrize("document", [FIELDS, {"fields": FIELDS}, {"schema": {"fields": FIELDS}}])
def test_schema_files_in_the_forms_bigquery_prints(tmp_path: Path, document: object) -> None:
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(document))
    columns = read_schema_file(path)
    assert [(c.name, c.field_type, c.mode) for c in columns] == [("id", "STRING", "REQUIRED"),
                                                                  ("client", "RECORD", "NULLABLE")]
    assert schema_fields(schema_json(columns)) == columns


@pytest.mark.parametrize("text", ["not json", "[]", '{"fields": 3}', '[{"type": "STRING"}]'])
def test_bad_schema_files_say_what_is_wrong(tmp_path: Path, text: str) -> None:
    path = tmp_path / "schema.json"
    path.write_text(text)
    with pytest.raises(SchemaError, match="SINK_BIGQUERY_TABLE_SCHEMA_FILE"):
        read_schema_file(path)


def test_payload_columns_leave_out_what_the_sink_fills() -> None:
    live = [SchemaField("id", "STRING"), SchemaField("Message_Offset", "INTEGER"), SchemaField("load_time", "TIMESTAMP"),
            SchemaField("additional_properties", "STRING")]
    assert [c.name for c in payload_columns(live, MetadataColumns())] == ["id", "additional_properties"]
    assert [c.name for c in payload_columns(live, MetadataColumns(enabled=False))] == [c.name for c in live]


def test_json_input_needs_no_descriptors_and_refuses_protobuf_only_settings() -> None:
    env = {k: v for k, v in MINIMAL.items() if k not in ("SCHEMA_REGISTRY_STENCIL_URLS", "INPUT_SCHEMA_PROTO_CLASS")}
    cfg = Config.from_env({**env, "INPUT_SCHEMA_DATA_TYPE": "JSON"})
    assert cfg.router.default_class is None and cfg.router.is_static
    with pytest.raises(ConfigError) as failed:
        Config.from_env({**env, "INPUT_SCHEMA_DATA_TYPE": "JSON", "INPUT_SCHEMA_PROTO_KEY_CLASS": "k.K"})
    assert "INPUT_SCHEMA_PROTO_KEY_CLASS: protobuf only" in str(failed.value)
    with pytest.raises(ConfigError, match="INPUT_SCHEMA_PROTO_CLASS: required"):
        Config.from_env(env)
