"""The generated MERGE statements with hostile names: columns and key fields named like the statement's own
aliases (`dst`, `src`, `x`, ...) and the intermediate table's columns, SQL keywords, NULL and FLOAT key fields."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from google.cloud import bigquery
from google.cloud.bigquery import SchemaField as F

from firehose_bq.upsert.sql import MergePlan, TableRef

pytestmark = pytest.mark.integration

# Key fields and value columns named like every alias the statements use, the intermediate table's own
# columns and reserved keywords.
KEY = [F("src", "STRING"), F("dst", "INTEGER"), F("select", "RECORD", fields=[F("x", "STRING"), F("r", "FLOAT")])]
VALUES = ["dst", "src", "x", "key", "value", "i", "latest", "one", "d", "order", "batchNumber"]


@pytest.fixture
def tables(bq_client: bigquery.Client, bq_dataset: str) -> Iterator[tuple[TableRef, TableRef]]:
    project = bq_client.project
    dest = TableRef(project, bq_dataset, "dest-v2")  # a table name may hold dashes
    tmp = TableRef(project, bq_dataset, "dest-v2_tmp")
    bq_client.create_table(bigquery.Table(dest.api, schema=[F("k", "RECORD", fields=KEY),
                                                            *(F(v, "STRING") for v in VALUES)]))
    bq_client.create_table(bigquery.Table(tmp.api, schema=[
        F("key", "RECORD", fields=KEY), F("value", "RECORD", fields=[F(v, "STRING") for v in VALUES]),
        F("partitionTime", "TIMESTAMP"), F("i", "INTEGER", "REQUIRED"), F("kafkaPartition", "INTEGER", "REQUIRED"),
        F("kafkaTopic", "STRING", "REQUIRED"),
        F("batchNumber", "INTEGER", "REQUIRED")]))
    yield dest, tmp


def key(src: str | None, dst: int | None, x: str | None = None) -> dict[str, object]:
    return {"src": src, "dst": dst, "select": None if x is None else {"x": x, "r": 0.5}}


def stage(client: bigquery.Client, tmp: TableRef, batch: int, rows: list[tuple[dict[str, object], str | None]],
          first_i: int) -> None:
    assert client.insert_rows_json(tmp.api, [
        {"key": k, "value": None if v is None else {name: f"{v}:{name}" for name in VALUES}, "i": first_i + n,
         "kafkaPartition": 0, "kafkaTopic": "t", "batchNumber": batch} for n, (k, v) in enumerate(rows)]) == []


def content(client: bigquery.Client, dest: TableRef) -> list[tuple[object, ...]]:
    rows = client.query(f"SELECT k.src AS ks, k.dst AS kd, k.`select`.x AS kx, * EXCEPT (k) FROM {dest.sql}").result()
    out = []
    for r in rows:
        values = {name: r[name] for name in VALUES}
        tag = values["dst"].split(":")[0]
        assert values == {name: f"{tag}:{name}" for name in VALUES}, values  # every column from its own field
        out.append((r["ks"], r["kd"], r["kx"], tag))
    return sorted(out, key=repr)


def run(client: bigquery.Client, plan: MergePlan, batch: int) -> None:
    client.query(plan.merge(batch)).result()
    client.query(plan.cleanup(batch, streaming_buffer=False)).result()


@pytest.mark.parametrize("upsert,delete", [(True, False), (True, True), (False, True)])
def test_columns_named_like_the_statements_aliases(bq_client, tables, upsert: bool, delete: bool) -> None:
    dest, tmp = tables
    plan = MergePlan(dest, tmp, "k", tuple(KEY), tuple(VALUES), upsert=upsert, delete=delete)
    stage(bq_client, tmp, 1, [(key("a", 1, "p"), "a1"), (key("a", 2), "a2"), (key("a", 1, "p"), "a1b")], 0)
    run(bq_client, plan, 1)
    later = [(key("a", 2), "a2b")] + ([(key("a", 1, "p"), None)] if delete else [])
    stage(bq_client, tmp, 2, later, 10)
    run(bq_client, plan, 2)
    if upsert and delete:
        assert content(bq_client, dest) == [("a", 2, None, "a2b")]
    elif upsert:
        assert content(bq_client, dest) == sorted([("a", 1, "p", "a1b"), ("a", 2, None, "a2b")], key=repr)
    else:  # delete-only appends values; the tombstone removed key (a, 1, p)'s rows
        assert content(bq_client, dest) == sorted([("a", 2, None, "a2"), ("a", 2, None, "a2b")], key=repr)


@pytest.mark.parametrize("upsert,delete", [(True, False), (True, True), (False, True)])
def test_null_key_fields_are_a_key_of_their_own(bq_client, tables, upsert: bool, delete: bool) -> None:
    """(a, NULL), (NULL, NULL) and (a, 1) are three keys: a NULL key field matches only a NULL, in the batch's
    grouping, in the delete-only tombstone lookup and in the MERGE's match."""
    dest, tmp = tables
    plan = MergePlan(dest, tmp, "k", tuple(KEY), tuple(VALUES), upsert=upsert, delete=delete)
    stage(bq_client, tmp, 1, [(key("a", None), "n1"), (key(None, None), "nn1"), (key("a", 1), "a1")], 0)
    run(bq_client, plan, 1)
    stage(bq_client, tmp, 2, [(key("a", None), "n2"), (key(None, None), "nn2")], 10)
    if delete:
        stage(bq_client, tmp, 2, [(key(None, None), None)], 20)
    run(bq_client, plan, 2)
    if upsert and delete:
        expected = [("a", None, None, "n2"), ("a", 1, None, "a1")]
    elif upsert:
        expected = [("a", None, None, "n2"), (None, None, None, "nn2"), ("a", 1, None, "a1")]
    else:  # appended; the tombstone of (NULL, NULL) removed that key's rows, and only them
        expected = [("a", None, None, "n1"), ("a", None, None, "n2"), ("a", 1, None, "a1")]
    assert content(bq_client, dest) == sorted(expected, key=repr)
