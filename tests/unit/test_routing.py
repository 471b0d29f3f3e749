"""Routing by attributes: templates, the class route map, unrouted records, in Arrow."""

from __future__ import annotations

import pytest

from firehose_bq.errors import ErrorType
from firehose_bq.routing import (Destination, NameTemplate, Router, TemplateError, header_values, name_problem,
                                 parse_class_routes, router_of)
from tests.unit.batch.sources import source_batch


def test_templates_name_their_attributes_and_render_sanitized() -> None:
    t = NameTemplate("${header.document_type}_v${header.document_version}")
    assert t.attributes == ("header.document_type", "header.document_version") and t.is_template
    assert t.render({"header.document_type": "main-ping", "header.document_version": "4"}) == "main_ping_v4"
    assert t.render({"header.document_type": "x"}) is None
    assert NameTemplate("${topic}").render({"topic": "9lives.events"}) == "_9lives_events"
    assert not NameTemplate("bookings").is_template
    with pytest.raises(TemplateError, match="unknown placeholder"):
        NameTemplate("${headers.x}")


def test_a_tables_own_text_keeps_its_dashes_and_the_values_never_do() -> None:
    """BigQuery's table names may hold dashes: an existing `orders-v2` is written as it is. A value put
    into a name still loses them, as before: routed tables keep the names they had."""
    table = NameTemplate("events-${header.region}", table=True)
    assert table.render({"header.region": "eu-west"}) == "events-eu_west"
    assert NameTemplate("${header.region}_live").render({"header.region": "eu-west"}) == "eu_west_live"
    assert NameTemplate("orders-v2", table=True).render({}) == "orders-v2"
    assert NameTemplate("orders-v2").render({}) == "orders_v2"  # a dataset's name may not hold one
    assert NameTemplate("${header.n}-x", table=True).render({"header.n": "7"}) == "_7-x"
    router = router_of("ds", "orders-v2", "pkg.M", None, "")
    assert [d for d, _ in router.assign(source_batch([b""])).groups] == [Destination("ds", "orders-v2", "pkg.M")]


def test_a_name_whose_own_text_starts_with_a_digit_is_kept_as_bigquery_takes_it() -> None:
    """BigQuery's dataset and table names may start with a digit (`2024_events`); a value that starts the
    name still gets a `_` in front, as before: routed tables keep the names they had."""
    assert NameTemplate("2024_events", table=True).render({}) == "2024_events"
    assert NameTemplate("2024_${header.kind}", table=True).render({"header.kind": "a-b"}) == "2024_a_b"
    assert NameTemplate("2024_raw").render({}) == "2024_raw"
    assert NameTemplate("${header.year}_events").render({"header.year": "2024"}) == "_2024_events"
    assert name_problem("2024_events", table=True) is None and name_problem("7", table=False) is None
    router = router_of("2024_raw", "2024_${header.kind}", "pkg.M", None, "")
    batch = source_batch([b""], headers=[[("kind", b"clicks")]])
    assert [d for d, _ in router.assign(batch).groups] == [Destination("2024_raw", "2024_clicks", "pkg.M")]


def test_header_values_take_the_last_and_null_for_missing() -> None:
    batch = source_batch([b""] * 4, headers=[[("t", b"a"), ("u", b"z"), ("t", b"b")], [], None, [("t", b"\xff")]])
    assert header_values(batch["headers"], "t").to_pylist() == ["b", None, None, None]
    assert header_values(batch["headers"], "u").to_pylist() == ["z", None, None, None]


def test_a_static_router_sends_everything_to_one_table() -> None:
    router = router_of("ds", "t", "pkg.M", None, "")
    out = router.assign(source_batch([b""] * 3))
    assert [(d, ix.tolist()) for d, ix in out.groups] == [(Destination("ds", "t", "pkg.M"), [0, 1, 2])]


def test_records_are_grouped_by_rendered_destination_and_class() -> None:
    router = router_of("${header.ns}_live", "${header.type}_v${header.v}", None, "type",
                       "click=app.Click,view=app.View")
    headers = [[("ns", b"web"), ("type", b"click"), ("v", b"1")],
               [("ns", b"web"), ("type", b"view"), ("v", b"2")],
               [("ns", b"web"), ("type", b"click"), ("v", b"1")],
               [("ns", b"web"), ("type", b"buy"), ("v", b"1")],
               [("type", b"click"), ("v", b"1")],
               [("ns", b"app"), ("type", b"click"), ("v", b"1")]]
    out = router.assign(source_batch([b""] * len(headers), headers=headers))
    assert [(d, ix.tolist()) for d, ix in out.groups] == [
        (Destination("web_live", "click_v1", "app.Click"), [0, 2]),
        (Destination("web_live", "view_v2", "app.View"), [1]),
        (Destination("app_live", "click_v1", "app.Click"), [5]),
    ]
    assert [(f.index, f.error_type) for f in out.unrouted] == [(3, ErrorType.ROUTING_ERROR), (4, ErrorType.ROUTING_ERROR)]
    assert "'buy' names no message class" in out.unrouted[0].message
    assert "no header.ns (absent, null, or not UTF-8)" in out.unrouted[1].message


def test_a_header_that_is_not_utf8_is_unrouted_saying_it_may_be() -> None:
    router = router_of("ds", "${header.region}", None, None, "")
    out = router.assign(source_batch([b""], headers=[[("region", b"\xffeu")]]))
    assert [f.error_type for f in out.unrouted] == [ErrorType.ROUTING_ERROR]
    assert "no header.region (absent, null, or not UTF-8)" in out.unrouted[0].message


def test_the_default_class_takes_unmapped_and_missing_values() -> None:
    router = router_of("ds", "${header.type}", "app.Other", "type", "click=app.Click")
    out = router.assign(source_batch([b""] * 2, headers=[[("type", b"click")], [("type", b"buy")]]))
    assert [d.proto_class for d, _ in out.groups] == ["app.Click", "app.Other"] and not out.unrouted


def test_topic_partition_and_key_are_attributes() -> None:
    router = router_of("ds", "${topic}_${partition}_${key}", "m.M", None, "")
    out = router.assign(source_batch([b""] * 2, keys=[b"k1", None], topic="a.b", partition=3))
    assert [(d.table, ix.tolist()) for d, ix in out.groups] == [("a_b_3_k1", [0])]
    assert out.unrouted[0].index == 1 and "no key" in out.unrouted[0].message


def test_names_that_stay_invalid_are_unrouted_not_spliced() -> None:
    router = router_of("ds", "${header.t}", "m.M", None, "")
    out = router.assign(source_batch([b""], headers=[[("t", b"x" * 2000)]]))
    assert not out.groups and "longer than 1024" in out.unrouted[0].message


def test_class_routes_parse_and_refuse_nonsense() -> None:
    assert parse_class_routes(" a=p.A , b=p.B,") == (("a", "p.A"), ("b", "p.B"))
    for bad in ("a", "a=", "=p.A", "a=p.A,a=p.B"):
        with pytest.raises(ValueError):
            parse_class_routes(bad)


def test_a_mixed_mode_streaming_entry_names_a_static_table_as_written() -> None:
    """A static table is used as written; rendering gives a reserved prefix (`_partition_log`) a `_` in
    front, so the entry never matched and the table was loaded instead of streamed."""
    entry = (NameTemplate("_partition_log", table=True),)
    static = Router(NameTemplate("ds"), NameTemplate("_partition_log", table=True), "pkg.M", streaming=entry)
    assert static.static_destination().streaming
    routed = Router(NameTemplate("ds"), NameTemplate("${header.t}", table=True), "pkg.M", streaming=entry)
    (destination, _), = routed.assign(source_batch([b""], headers=[[("t", b"_partition_log")]])).groups
    assert destination.table == "__partition_log" and destination.streaming  # rendered alike: as before
    other = Router(NameTemplate("ds"), NameTemplate("bookings", table=True), "pkg.M", streaming=entry)
    assert not other.static_destination().streaming
