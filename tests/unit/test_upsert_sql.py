"""MERGE text for upsert-only, delete-only and both; nested keys; names that must never reach SQL."""

from __future__ import annotations

import pytest
from google.cloud.bigquery import SchemaField as F

from firehose_bq.upsert.sql import IdentifierError, MergePlan, TableRef, _literal, check_identifier, key_leaves

DEST = TableRef("my-project", "kcbq", "demo")
TMP = TableRef("my-project", "kcbq", "demo_tmp_1_0123456789abcdef0123456789abcdef_1700000000000")
FLAT_KEY = (F("k1", "INTEGER", "REQUIRED"), F("k2", "STRING"))
NESTED_KEY = (F("id", "STRING"), F("region", "RECORD", fields=[F("country", "STRING"),
                                                             F("zone", "RECORD", fields=[F("n", "INTEGER")])]))


def plan(upsert: bool, delete: bool, key: tuple[F, ...] = FLAT_KEY, partitioning: str | None = None) -> MergePlan:
    return MergePlan(DEST, TMP, "customKeyField", key, ("f1", "f2"), upsert, delete, partitioning)


DEDUP = ("USING (SELECT latest.* FROM (SELECT ARRAY_AGG(x ORDER BY x.`i` DESC, x.`kafkaPartition` DESC, "
         "x.`kafkaTopic` DESC LIMIT 1)"
         "[OFFSET(0)] AS latest "
         f"FROM {TMP.sql} AS x WHERE x.`batchNumber` = 2 GROUP BY x.`key`.`k1`, x.`key`.`k2`)) AS src")
ON = ("ON dst.`customKeyField`.`k1` IS NOT DISTINCT FROM src.`key`.`k1` AND "
      "dst.`customKeyField`.`k2` IS NOT DISTINCT FROM src.`key`.`k2`")
UPDATE = "UPDATE SET `f1` = src.`value`.`f1`, `f2` = src.`value`.`f2`"
INSERT = "INSERT (`customKeyField`, `f1`, `f2`) VALUES (src.`key`, src.`value`.`f1`, src.`value`.`f2`)"


def test_upsert_and_delete_merge() -> None:
    assert plan(True, True).merge(2).splitlines() == [
        "MERGE `my-project`.`kcbq`.`demo` AS dst", DEDUP, ON,
        f"WHEN MATCHED AND src.`value` IS NOT NULL THEN {UPDATE}",
        "WHEN MATCHED AND src.`value` IS NULL THEN DELETE",
        f"WHEN NOT MATCHED AND src.`value` IS NOT NULL THEN {INSERT}",
    ]


def test_upsert_only_merge_has_no_delete_branch() -> None:
    assert plan(True, False).merge(2).splitlines() == [
        "MERGE `my-project`.`kcbq`.`demo` AS dst", DEDUP, ON,
        f"WHEN MATCHED THEN {UPDATE}",
        f"WHEN NOT MATCHED THEN {INSERT}",
    ]


def test_delete_only_merge_appends_values_after_the_last_tombstone() -> None:
    lines = plan(False, True).merge(7).splitlines()
    assert lines[0] == "MERGE `my-project`.`kcbq`.`demo` AS dst"
    # One row per record (key, partition and offset), then each key's records from its last tombstone on.
    once = (f"SELECT one.* FROM (SELECT ARRAY_AGG(x LIMIT 1)[OFFSET(0)] AS one FROM {TMP.sql} AS x "
            "WHERE x.`batchNumber` = 7 GROUP BY x.`key`.`k1`, x.`key`.`k2`, x.`kafkaTopic`, x.`kafkaPartition`, x.`i`)")
    assert lines[1] == (
        "USING (SELECT x.* FROM (SELECT r.*, MAX(CASE WHEN r.`value` IS NULL THEN r.`i` END) OVER (PARTITION BY "
        f"r.`key`.`k1`, r.`key`.`k2`) AS last_delete FROM ({once}) AS r) AS x "
        "WHERE x.last_delete IS NULL OR x.`i` >= x.last_delete) AS src")
    assert lines[2:] == [
        "ON src.`value` IS NULL AND " + ON.removeprefix("ON "),
        "WHEN MATCHED THEN DELETE",
        f"WHEN NOT MATCHED AND src.`value` IS NOT NULL THEN {INSERT}",
    ]


@pytest.mark.parametrize("upsert,delete", [(True, False), (True, True), (False, True)])
def test_no_statement_has_an_outer_join(upsert: bool, delete: bool) -> None:
    """Real BigQuery refuses a LEFT/RIGHT/FULL OUTER JOIN whose condition is not an equality of fields from
    both sides ("LEFT OUTER JOIN cannot be used without a condition that is an equality of fields from both
    sides of the join"); the NULL-safe key match (IS NOT DISTINCT FROM) is not one. The emulator (DuckDB)
    accepts it, so only the text can show it: the statements join nothing besides the MERGE itself."""
    sql = plan(upsert, delete, NESTED_KEY).merge(3).upper()
    assert " JOIN " not in sql.replace("\n", " ")


def test_delete_only_partitions_float_key_fields_by_their_text() -> None:
    """BigQuery refuses FLOAT64 in a window's PARTITION BY ("Partitioning by expressions of type FLOAT64 is
    not allowed"); it groups and matches them as they are."""
    key = (F("id", "STRING"), F("geo", "RECORD", fields=[F("lat", "FLOAT"), F("zone", "INTEGER")]))
    sql = plan(False, True, key).merge(1)
    assert "PARTITION BY r.`key`.`id`, CAST(r.`key`.`geo`.`lat` AS STRING), r.`key`.`geo`.`zone`)" in sql
    assert "GROUP BY x.`key`.`id`, x.`key`.`geo`.`lat`, x.`key`.`geo`.`zone`, x.`kafkaTopic`, x.`kafkaPartition`, x.`i`" in sql


def test_nested_key_groups_and_matches_on_every_leaf() -> None:
    assert key_leaves(NESTED_KEY) == [("id",), ("region", "country"), ("region", "zone", "n")]
    sql = plan(True, True, NESTED_KEY).merge(3)
    assert "GROUP BY x.`key`.`id`, x.`key`.`region`.`country`, x.`key`.`region`.`zone`.`n`)" in sql
    assert ("ON dst.`customKeyField`.`id` IS NOT DISTINCT FROM src.`key`.`id` AND "
            "dst.`customKeyField`.`region`.`country` IS NOT DISTINCT FROM src.`key`.`region`.`country` AND "
            "dst.`customKeyField`.`region`.`zone`.`n` IS NOT DISTINCT FROM src.`key`.`region`.`zone`.`n`\n") in sql


def test_ingestion_time_partitioned_destination_gets_partitiontime() -> None:
    sql = plan(True, True, partitioning="HOUR").merge(1)
    assert ("INSERT (`customKeyField`, `f1`, `f2`, _PARTITIONTIME) VALUES (src.`key`, src.`value`.`f1`, "
            "src.`value`.`f2`, TIMESTAMP_TRUNC(src.`partitionTime`, HOUR))") in sql
    assert "_PARTITIONTIME" not in plan(True, True).merge(1)


def test_cleanup_spares_streaming_buffer_rows_only_when_there_is_a_buffer() -> None:
    assert plan(True, True).cleanup(4, False) == f"DELETE FROM {TMP.sql} WHERE `batchNumber` <= 4"
    assert plan(True, True).cleanup(4, True) == (f"DELETE FROM {TMP.sql} WHERE `batchNumber` <= 4 "
                                                 "AND _PARTITIONTIME IS NOT NULL")


@pytest.mark.parametrize("name", ["a`b", "a b", "a.b", "1abc", "", "x" * 301, "_PARTITIONTIME", "_table_x",
                                  "a;DROP", "é", "a-b"])
def test_bad_column_names_are_rejected(name: str) -> None:
    with pytest.raises(IdentifierError):
        check_identifier(name)


@pytest.mark.parametrize("parts", [("my-project", "ds`x", "t"), ("my-project", "ds", "t`; DROP TABLE x"),
                                   ("My_Project", "ds", "t"), ("p", "ds", "t"), ("my-project", "d.s", "t"),
                                   ("my-project", "ds", "")])
def test_bad_table_references_are_rejected(parts: tuple[str, str, str]) -> None:
    with pytest.raises(IdentifierError):
        TableRef(*parts)


def test_table_names_with_dashes_are_backtick_quoted() -> None:
    """BigQuery allows dashes in table names (not in datasets'): quoted, they are one identifier."""
    ref = TableRef("my-project", "ds", "orders-v2")
    assert ref.sql == "`my-project`.`ds`.`orders-v2`"
    plan = MergePlan(ref, TableRef("my-project", "ds", "orders-v2_tmp"), "key", FLAT_KEY, ("f1",), True, True)
    assert f"MERGE {ref.sql} AS dst" in plan.merge(1)
    with pytest.raises(IdentifierError):
        TableRef("my-project", "d-s", "t")


def test_bad_names_stop_the_plan_before_any_sql() -> None:
    with pytest.raises(IdentifierError, match="value"):
        MergePlan(DEST, TMP, "key", FLAT_KEY, ("ok", "bad`value"), True, True)
    with pytest.raises(IdentifierError):
        MergePlan(DEST, TMP, "key`", FLAT_KEY, ("f1",), True, True)
    with pytest.raises(IdentifierError, match="k`2"):
        MergePlan(DEST, TMP, "key", (F("k`2", "STRING"),), ("f1",), True, True)


def test_keys_merge_cannot_group_on_are_rejected() -> None:
    with pytest.raises(IdentifierError, match="tags is repeated"):
        key_leaves((F("id", "STRING"), F("tags", "STRING", "REPEATED")))
    with pytest.raises(IdentifierError, match="doc is JSON"):
        key_leaves((F("doc", "JSON"),))
    with pytest.raises(IdentifierError, match="no fields"):
        key_leaves(())


def test_domain_scoped_project_and_parse() -> None:
    ref = TableRef.parse("example.com:my-project.ds.t")
    assert ref.sql == "`example.com:my-project`.`ds`.`t`"
    with pytest.raises(IdentifierError):
        TableRef.parse("ds.t")


def test_key_fields_without_presence_match_the_tables_null_as_their_default() -> None:
    """A key field the key class gained later: rows written before hold NULL, a record whose key bytes still
    lack it decodes the default: the same key. Fields not listed (with presence) stay matched NULL-safe."""
    absent = MergePlan(DEST, TMP, "customKeyField", FLAT_KEY, ("f1", "f2"), True, True,
                       absent_key=(("k2", ""),))
    assert ("ON dst.`customKeyField`.`k1` IS NOT DISTINCT FROM src.`key`.`k1` AND "
            "IFNULL(dst.`customKeyField`.`k2`, '') IS NOT DISTINCT FROM src.`key`.`k2`\n") in absent.merge(1)
    assert "IFNULL(dst.`customKeyField`.`k2`, '')" in MergePlan(
        DEST, TMP, "customKeyField", FLAT_KEY, ("f1",), False, True, absent_key=(("k2", ""),)).merge(1)


@pytest.mark.parametrize("kind,value,literal", [
    ("INTEGER", 0, "0"), ("FLOAT", 0.0, "0.0"), ("BOOLEAN", False, "FALSE"), ("STRING", "", "''"),
    ("STRING", "REGION_UNSPECIFIED", "'REGION_UNSPECIFIED'"), ("BYTES", b"", "b''"), ("NUMERIC", 0, "NUMERIC '0'"),
    ("STRING", "it's", None), ("STRING", "a\\nb", None), ("INTEGER", True, None), ("TIMESTAMP", 0, None),
    ("FLOAT", float("nan"), None)])
def test_defaults_become_literals_only_when_plainly_safe(kind: str, value: object, literal: str | None) -> None:
    assert _literal(kind, value) == literal
