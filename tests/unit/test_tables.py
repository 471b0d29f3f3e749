"""Schema evolution rules: add and relax, keep what the proto lost, refuse what BigQuery cannot do."""

from __future__ import annotations

import pytest
from google.api_core import exceptions as api_exceptions
from google.cloud import bigquery
from google.cloud.bigquery import SchemaField

from firehose_bq.bigquery.tables import UPDATE_ATTEMPTS, ensure_table, merge_schema, schema_changes
from firehose_bq.errors import ErrorType, SchemaEvolutionError, SinkError


def f(name: str, kind: str = "STRING", mode: str = "NULLABLE", fields: tuple = ()) -> SchemaField:
    return SchemaField(name, kind, mode=mode, fields=fields)


def test_unchanged_schema_is_returned_as_is() -> None:
    current = [f("a"), f("n", "RECORD", fields=(f("x", "INTEGER"),))]
    assert merge_schema(current, [f("a"), f("n", "RECORD", fields=(f("x", "INT64"),))]) == current


def test_new_fields_are_appended_nullable_or_repeated_also_nested() -> None:
    current = [f("a"), f("n", "RECORD", fields=(f("x", "INTEGER"),))]
    wanted = [f("a"), f("n", "RECORD", fields=(f("x", "INTEGER"), f("y", mode="REQUIRED"))),
              f("r", "INTEGER", "REPEATED"), f("req", mode="REQUIRED")]
    merged = merge_schema(current, wanted)
    assert [x.to_api_repr() for x in merged] == [
        {"name": "a", "type": "STRING", "mode": "NULLABLE"},
        {"name": "n", "type": "RECORD", "mode": "NULLABLE", "fields": [
            {"name": "x", "type": "INTEGER", "mode": "NULLABLE"},
            {"name": "y", "type": "STRING", "mode": "NULLABLE"}]},
        {"name": "r", "type": "INTEGER", "mode": "REPEATED"},
        {"name": "req", "type": "STRING", "mode": "NULLABLE"},
    ]


def test_fields_missing_from_the_proto_are_kept() -> None:
    current = [f("old"), f("a")]
    assert [x.name for x in merge_schema(current, [f("a")])] == ["old", "a"]


def test_required_fields_missing_from_the_proto_relax_to_nullable_also_nested() -> None:
    # A proto2 `required` field deleted from the proto: the rows written from then on have no value for
    # it, and a column left REQUIRED would refuse every one of them (to the DLQ, or a MERGE that fails).
    current = [f("gone", mode="REQUIRED"), f("a"), f("n", "RECORD", fields=(f("x", mode="REQUIRED"), f("y")))]
    merged = merge_schema(current, [f("a"), f("n", "RECORD", fields=(f("y"),))])
    assert [(x.name, x.mode) for x in merged] == [("gone", "NULLABLE"), ("a", "NULLABLE"), ("n", "NULLABLE")]
    assert [(x.name, x.mode) for x in merged[2].fields] == [("x", "NULLABLE"), ("y", "NULLABLE")]
    assert schema_changes(current, merged) == ["relax gone REQUIRED -> NULLABLE", "relax n.x REQUIRED -> NULLABLE"]
    # A JSON table's columns that its schema file lacks are still filled by the documents: they stay.
    assert merge_schema(current, [f("a"), f("n", "RECORD", fields=(f("y"),))], relax_missing=False) == current


def test_required_relaxes_to_nullable_but_never_tightens() -> None:
    assert merge_schema([f("a", mode="REQUIRED")], [f("a")])[0].mode == "NULLABLE"
    assert merge_schema([f("a")], [f("a", mode="REQUIRED")])[0].mode == "NULLABLE"


@pytest.mark.parametrize(
    ("current", "wanted", "message"),
    [
        ([f("a", "STRING")], [f("a", "INTEGER")], "field a: type STRING in the table, INTEGER in the proto"),
        ([f("n", "RECORD", fields=(f("x", "INTEGER"),))], [f("n", "RECORD", fields=(f("x", "FLOAT"),))],
         "field n.x: type INTEGER in the table, FLOAT in the proto"),
        ([f("a")], [f("a", mode="REPEATED")], "field a: mode NULLABLE in the table, REPEATED in the proto"),
        ([f("a", mode="REPEATED")], [f("a")], "field a: mode REPEATED in the table, NULLABLE in the proto"),
    ],
)
def test_changes_bigquery_cannot_apply_name_the_field(current, wanted, message: str) -> None:
    with pytest.raises(SchemaEvolutionError, match=message):
        merge_schema(current, wanted)


def test_changes_bigquery_cannot_apply_name_where_the_new_schema_came_from() -> None:
    # JSON input's table comes from a schema file, not a proto: the message names what the user must edit.
    source = "SINK_BIGQUERY_TABLE_SCHEMA_FILE /etc/schema.json"
    with pytest.raises(SchemaEvolutionError) as failed:
        merge_schema([f("n", "RECORD", fields=(f("x", "INTEGER"),))], [f("n", "RECORD", fields=(f("x"),))],
                     source=source)
    assert str(failed.value) == (f"field n.x: type INTEGER in the table, STRING in {source}; BigQuery cannot change a "
                                 f"column's type (add a new field in {source} instead)")
    assert "proto" not in str(failed.value)


def test_merge_leaves_the_live_schema_untouched() -> None:
    current = [f("id", mode="REQUIRED"), f("n", "RECORD", fields=(f("x"),))]
    before = [x.to_api_repr() for x in current]
    merged = merge_schema(current, [f("id"), f("n", "RECORD", fields=(f("x"), f("y")))])
    assert [x.to_api_repr() for x in current] == before
    assert schema_changes(current, merged) == ["relax id REQUIRED -> NULLABLE", "add n.y NULLABLE STRING"]


def test_an_update_that_keeps_conflicting_is_a_retryable_sink_error_not_a_schema_error() -> None:
    # Other workers evolving the same table at once: a race a restart settles. A SchemaError would make a
    # routed destination "unusable" and dead-letter its records as ROUTING_ERRORs over a transient conflict.
    class Racing:
        updates = 0

        def get_table(self, ref: str) -> bigquery.Table:
            return bigquery.Table(ref, schema=[SchemaField("a", "STRING")])

        def update_table(self, table: bigquery.Table, fields: list[str]) -> bigquery.Table:
            self.updates += 1
            raise api_exceptions.PreconditionFailed("etag mismatch")

    client = Racing()
    wanted = bigquery.Table("p.d.t", schema=[SchemaField("a", "STRING"), SchemaField("b", "INTEGER")])
    with pytest.raises(SinkError) as raised:
        ensure_table(client, wanted)  # type: ignore[arg-type]
    assert raised.value.error_type is ErrorType.SINK_RETRYABLE_ERROR and "kept conflicting" in raised.value.message
    assert client.updates == UPDATE_ATTEMPTS
