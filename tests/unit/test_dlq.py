"""Dead letters: what they carry through Kafka headers and JSON lines, and the writers' retry rule."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from firehose_bq.dlq.blob_source import BlobDlqSource
from firehose_bq.dlq.config import DlqConfig
from firehose_bq.dlq.letters import H_ATTEMPT, H_EXCEPTION, H_NULLS, H_OFFSET, H_ROUTE, H_TYPE, DeadLetter
from firehose_bq.blobstore import LocalBlobStore
from firehose_bq.dlq.writers import BlobDlqWriter, dead_letter
from firehose_bq.errors import DeadLetterError, ErrorType, FirehoseError, MessageError, SourceError
from tests.unit.clock import Clock

LETTER = DeadLetter(MessageError(ErrorType.SINK_4XX_ERROR, "orders", 2, 41, "invalid at ts: out of range"),
                    b"key", b"\x00\xffvalue", (("trace", b"\x01"), ("empty", None)), 1_700_000_000_000, 2,
                    1_700_000_500_000, route="shop.orders", exception_class="google.cloud.bigquery.RowError")


def test_kafka_headers_keep_the_record_headers_and_add_the_error() -> None:
    headers = LETTER.kafka_headers()
    assert headers[:2] == [("trace", b"\x01"), ("empty", b"")]
    extra = dict(headers[2:])
    assert (extra[H_TYPE], extra[H_OFFSET], extra[H_ATTEMPT]) == (b"SINK_4XX_ERROR", b"41", b"2")
    assert (extra[H_ROUTE], extra[H_EXCEPTION]) == (b"shop.orders", b"google.cloud.bigquery.RowError")
    assert extra[H_NULLS] == b"header:1"  # sent as b"" (kafka-python refuses None), read back as None
    back = DeadLetter.from_kafka(b"key", b"\x00\xffvalue", headers)
    assert back == DeadLetter(LETTER.error, b"key", b"\x00\xffvalue", (("trace", b"\x01"), ("empty", None)),
                              LETTER.timestamp_ms, 2, LETTER.failed_at_ms, LETTER.route, LETTER.exception_class)
    with pytest.raises(ValueError, match="not a firehose-bq dead letter"):
        DeadLetter.from_kafka(None, b"x", [("trace", b"1")])


def test_a_record_without_key_value_or_header_values_round_trips_through_kafka() -> None:
    """kafka-python sends neither a record whose key and value are both null nor a null header value: the
    letter sends b"" marked null, so the replay sees the record as it was (a header that is absent routes
    differently from an empty one), and the DLQ write never fails on it (a retry loop, then a stop)."""
    empty = dataclasses.replace(LETTER, key=None, value=None, headers=(("region", None), ("kind", b"")))
    assert empty.kafka_key() == b""
    sent = empty.kafka_headers()
    assert all(isinstance(v, bytes) for _, v in sent) and dict(sent)[H_NULLS] == b"key,header:0"
    back = DeadLetter.from_kafka(empty.kafka_key(), None, sent)
    assert (back.key, back.value, back.headers) == (None, None, (("region", None), ("kind", b"")))
    key_only = dataclasses.replace(LETTER, value=None, headers=())
    assert key_only.kafka_key() == b"key" and H_NULLS not in dict(key_only.kafka_headers())
    assert DeadLetter.from_kafka(b"", b"v", dataclasses.replace(LETTER, key=b"").kafka_headers()).key == b""


def test_json_line_round_trips_with_base64_payload() -> None:
    line = LETTER.to_json()
    assert json.loads(line)["value"] == "AP92YWx1ZQ=="
    assert DeadLetter.from_json(line) == LETTER


def test_blob_writer_puts_one_file_per_topic_and_day(tmp_path: Path) -> None:
    BlobDlqWriter(LocalBlobStore(tmp_path)).write([LETTER, LETTER])
    files = list(tmp_path.rglob("*"))
    written = [f for f in files if f.is_file()]
    assert len(written) == 1 and written[0].parent == tmp_path / "orders" / "2023-11-14"
    assert written[0].suffix == ".jsonl" and not [f for f in files if f.name.endswith(".tmp")]
    assert [DeadLetter.from_json(line).error for line in written[0].read_text().splitlines()] == [LETTER.error] * 2


def test_a_failing_dlq_is_retried_then_raises() -> None:
    calls: list[int] = []

    class Broken:
        def write(self, letters: object) -> None:
            calls.append(1)
            raise OSError("disk full")

        def close(self) -> None:
            pass

    cfg = DlqConfig(enabled=True, retry_max_attempts=3)
    with pytest.raises(DeadLetterError, match="failed 3 time"):
        dead_letter(cfg, [LETTER], opener=lambda c: Broken(), sleep=lambda s: None)
    assert len(calls) == 3


def test_a_dead_dlq_holds_the_task_for_its_deadline_and_one_attempt_at_most() -> None:
    clock = Clock()

    class Hanging:
        def write(self, letters: object) -> None:
            clock.now += 40  # the longest an attempt waits for the DLQ (Kafka: connect + deliver)
            raise TimeoutError("no answer")

        def close(self) -> None:
            pass

    cfg = DlqConfig(enabled=True)
    with pytest.raises(DeadLetterError, match=r"orders/2@41\) failed 3 time\(s\) in 121.5 s: TimeoutError"):
        dead_letter(cfg, [LETTER], opener=lambda c: Hanging(), sleep=clock.sleep, clock=clock)
    assert clock.waits == [0.5, 1]
    assert 120 <= clock.now <= cfg.backoff().bound_s(40) == 160


def test_replay_needs_a_bound(capsys: pytest.CaptureFixture[str]) -> None:
    from firehose_bq import cli

    with pytest.raises(SystemExit) as stopped:
        cli.main(["replay-dlq"])
    assert stopped.value.code == 2
    assert "--available-now" in capsys.readouterr().err


def test_replayed_records_keep_their_original_coordinates() -> None:
    from firehose_bq.batch.rows import insert_ids
    from firehose_bq.dlq.replay import letters_batch

    batch = letters_batch([LETTER])
    row = batch.to_pylist()[0]
    assert (row["topic"], row["partition"], row["offset"]) == ("orders", 2, 41)
    assert insert_ids(batch).to_pylist() == ["orders_2_41"]
    assert (row["key"], row["value"], row["dlq_attempt"]) == (b"key", b"\x00\xffvalue", LETTER.attempt)
    assert row["timestamp"].timestamp() == 1_700_000_000
    assert (row["timestamp_type"], row["leader_epoch"]) == (None, None), "unknown for an older letter"


def test_a_letter_keeps_the_records_timestamp_type_and_leader_epoch_for_the_replay() -> None:
    """So that a replayed row's metadata columns are what the stream would have written."""
    from firehose_bq.dlq.replay import letters_batch

    letter = dataclasses.replace(LETTER, timestamp_type=1, leader_epoch=7)
    assert DeadLetter.from_kafka(letter.key, letter.value, letter.kafka_headers()).leader_epoch == 7
    assert DeadLetter.from_kafka(letter.key, letter.value, letter.kafka_headers()).timestamp_type == 1
    assert DeadLetter.from_json(letter.to_json()) == letter
    row = letters_batch([letter]).to_pylist()[0]
    assert (row["timestamp_type"], row["leader_epoch"]) == (1, 7)
    # Letters written before these were kept read back as unknown.
    old = {k: v for k, v in json.loads(letter.to_json()).items() if k not in ("timestamp_type", "leader_epoch")}
    assert DeadLetter.from_json(json.dumps(old)).timestamp_type is None


def test_blob_letters_read_back_one_object_per_batch_and_the_rename_commits(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    writer = BlobDlqWriter(store)
    writer.write([LETTER, LETTER])
    writer.write([dataclasses.replace(LETTER, error=dataclasses.replace(LETTER.error, offset=42))])
    source = BlobDlqSource(store, max_messages=None)
    assert source.total() == 3
    batches = list(source.batches())
    assert sorted(len(letters) for letters, _ in batches) == [1, 2]
    source.commit(batches[0][1])  # the first object only
    assert len([n for n in store.names() if n.endswith(".jsonl.replayed")]) == 1
    again = BlobDlqSource(store, max_messages=None)
    assert again.total() == 3 - len(batches[0][0]) and len(list(again.batches())) == 1


def test_blob_replay_with_a_limit_takes_whole_objects_only_and_says_so(tmp_path: Path, caplog) -> None:
    store = LocalBlobStore(tmp_path)
    BlobDlqWriter(store).write([LETTER, LETTER])
    source = BlobDlqSource(store, max_messages=1)
    # What it will replay, not the limit: the progress bar must not promise a letter it will not send.
    assert source.total() == 0
    with caplog.at_level("WARNING"):
        assert list(source.batches()) == []
    assert "its 2 letters exceed what --max-messages leaves (1)" in caplog.text
    assert BlobDlqSource(store, max_messages=2).total() == 2


@pytest.mark.parametrize("line", ['{"truncated": ', '{"error_type": "SINK_4XX_ERROR"}', '[1, 2]',
                                  LETTER.to_json().replace('"SINK_4XX_ERROR"', '"NO_SUCH_TYPE"')])
def test_a_line_that_is_no_dead_letter_stops_the_replay_naming_its_object_and_line(tmp_path: Path, line: str) -> None:
    """A letters object cut short or edited by hand: the replay stops with where it is, as the Kafka source
    does for a record without dead-letter headers, instead of a bare JSON traceback on every run."""
    store = LocalBlobStore(tmp_path)
    store.put("orders/2026-11-24/bad.jsonl", f"{LETTER.to_json()}\n{line}\n".encode())
    with pytest.raises(FirehoseError, match=r"orders/2026-11-24/bad\.jsonl, line 2: not a firehose-bq dead letter"):
        list(BlobDlqSource(store, max_messages=None).batches())
    assert store.names() == ["orders/2026-11-24/bad.jsonl"]  # not committed: nothing skipped


def test_blob_location_is_the_directory_or_the_bucket_and_prefix() -> None:
    assert DlqConfig(blob_local_directory="/var/dlq").blob_location() == "/var/dlq"
    gcs = DlqConfig(blob_storage_type="GCS", gcs_bucket="b", gcs_prefix="/dlq/bookings/",
                    gcs_api_endpoint="http://127.0.0.1:1")
    assert gcs.blob_location() == "gs://b/dlq/bookings"
    assert gcs.gcs_options().endpoint == "http://127.0.0.1:1"


def test_a_letter_the_dlq_topic_refuses_for_its_size_is_named_and_not_retried(monkeypatch) -> None:  # noqa: ANN001
    """The broker's refusal (the topic's max.message.bytes) arrives with the delivery, not at send()."""
    import kafka
    from kafka.errors import MessageSizeTooLargeError

    from firehose_bq.errors import DeadLetterTooLargeError

    class Delivery:
        def __init__(self, value: bytes) -> None:
            self.value = value

        def get(self, timeout: float) -> None:
            if len(self.value) > 10:
                raise MessageSizeTooLargeError("rejected by the broker")

    class Producer:
        def __init__(self, **_: object) -> None:
            opened.append(1)

        def send(self, topic: str, *, value: bytes, **_: object) -> Delivery:
            return Delivery(value)

        def flush(self, timeout: float) -> None:
            pass

        def close(self, timeout: float) -> None:
            pass

    opened: list[int] = []
    monkeypatch.setattr(kafka, "KafkaProducer", Producer)
    big = dataclasses.replace(LETTER, error=dataclasses.replace(LETTER.error, offset=42), value=b"v" * 11)
    cfg = DlqConfig(enabled=True, kafka_brokers="b:1", retry_max_attempts=3)
    with pytest.raises(DeadLetterTooLargeError, match=r"orders/2@42 \(\d+ bytes with its headers\) is too large"):
        dead_letter(cfg, [LETTER, big], sleep=lambda s: None)
    assert opened == [1]


def test_a_pending_replay_batch_round_trips_through_the_staging_area(tmp_path: Path) -> None:
    from firehose_bq.batch.core import TaskResult
    from firehose_bq.dlq.replay import PendingBatch

    store = LocalBlobStore(tmp_path)
    pending = PendingBatch(store, "dlq-replay-ab/")
    assert pending.read() is None and not pending.held
    result = TaskResult(reports=['{"table": "d.t", "staged": {}}'])
    pending.write(3, [result], {"offsets": {"0": 17}}, "run1")
    assert pending.held
    again = PendingBatch(store, "dlq-replay-ab/")  # the next replay
    assert again.read() == (3, [result], {"offsets": {"0": 17}}, "run1")  # finished with that run's job ids
    assert again.held  # until it is finished: a replay that fails to finish it must leave it there
    again.clear()
    assert again.read() is None and store.names() == []


def test_a_committed_blob_position_is_skipped_by_the_batches_still_to_come(tmp_path: Path) -> None:
    """What a replay does with the batch an earlier one left pending: commit it before reading."""
    store = LocalBlobStore(tmp_path)
    BlobDlqWriter(store).write([LETTER])
    BlobDlqWriter(store).write([dataclasses.replace(LETTER, error=dataclasses.replace(LETTER.error, offset=42))])
    first = BlobDlqSource(store, max_messages=None)
    (done, position), (left, _) = list(first.batches())
    source = BlobDlqSource(store, max_messages=None)
    source.commit(position)
    assert [letters for letters, _ in source.batches()] == [left] and done != left


def test_committing_a_blob_batch_whose_rename_finished_is_a_no_op(tmp_path: Path) -> None:
    """A replay that died after its commit (the rename) and before it cleared its pending batch: the next
    replay commits that position again first, which must not fail on the object already renamed."""
    store = LocalBlobStore(tmp_path)
    BlobDlqWriter(store).write([LETTER])
    ((_, position),) = list(BlobDlqSource(store, max_messages=None).batches())
    BlobDlqSource(store, max_messages=None).commit(position)
    again = BlobDlqSource(store, max_messages=None)
    again.commit(position)
    assert [n.endswith(".jsonl.replayed") for n in store.names()] == [True]
    assert list(again.batches()) == []


def test_a_half_renamed_blob_batch_is_committed_not_replayed_again(tmp_path: Path) -> None:
    """On GCS a rename is a copy and a delete: a crash between them leaves both objects. The copy is the
    commit, so the next replay finishes the rename instead of writing those letters twice."""
    store = LocalBlobStore(tmp_path)
    BlobDlqWriter(store).write([LETTER])
    (name,) = store.names()
    store.put(name + ".replayed", store.get(name))  # the copy, without the delete
    source = BlobDlqSource(store, max_messages=None)
    assert source.total() == 0 and list(source.batches()) == []
    assert store.names() == [name + ".replayed"]


def test_the_replay_summary_accounts_for_every_letter_read() -> None:
    """Letters whose route is still missing go to the fallback topic again: the summary must say so, or
    read != written + dead-lettered + failed and the user cannot tell where they went."""
    from firehose_bq.dlq.replay import ReplaySummary
    from firehose_bq.metrics import BatchStats

    stats = BatchStats(messages=9, rows_written=2)
    stats.add_outcome("fallback", 7)
    text = ReplaySummary(stats).render()
    assert "dead letters read  9" in text and "sent to fallback   7" in text


@pytest.mark.parametrize("merged", [True, False])
def test_an_upsert_batch_left_pending_is_committed_if_merged_else_read_again(tmp_path: Path, merged: bool) -> None:
    """Its staged rows went with the stopped replay's intermediate table: only its MERGE job tells."""
    from firehose_bq.batch.core import TaskResult
    from firehose_bq.dlq import replay as replay_module
    from firehose_bq.modes import UpsertMode

    class Merges(UpsertMode):
        def __init__(self) -> None:  # no session: only `merged` is asked
            self.asked: list[tuple[int, object]] = []

        def merged(self, batch: int, plan: object) -> bool:
            self.asked.append((batch, plan))
            return merged

    class Source:
        committed: list[object] = []

        def commit(self, position: object) -> None:
            self.committed.append(position)

    store = LocalBlobStore(tmp_path)
    replay_module.PendingBatch(store, "p/").write(4, [TaskResult()], {"offsets": {"0": 9}}, "run1")
    pending, mode, source = replay_module.PendingBatch(store, "p/"), Merges(), Source()

    first = replay_module._finish_pending(pending, mode, source)  # type: ignore[arg-type]

    assert mode.asked == [(4, replay_module.replay_plan({"offsets": {"0": 9}}, "run1"))]  # the same MERGE id
    assert (first, source.committed) == ((5, [{"offsets": {"0": 9}}]) if merged else (4, []))
    assert not pending.held and store.names() == []


def test_a_replay_remembers_the_letters_it_handled_last_and_no_more() -> None:
    from firehose_bq.dlq.replay import DLQ_BATCH, RecentLetters

    recent = RecentLetters(3)
    recent.add([("t", 0, 1, 1), ("t", 0, 2, 1), ("t", 0, 1, 1)])  # a copy is one identity
    assert ("t", 0, 1, 1) in recent and ("t", 0, 1, 2) not in recent  # dead-lettered again: read again
    recent.add([("t", 0, 3, 1), ("t", 1, 1, 1)])
    assert ("t", 0, 1, 1) not in recent and all(i in recent for i in [("t", 0, 2, 1), ("t", 0, 3, 1), ("t", 1, 1, 1)])
    # Copies of a stream batch's letters lie within two of its batches: sized from the job's settings.
    assert RecentLetters.for_stream(100_000).size == 200_000 + DLQ_BATCH
    assert RecentLetters.for_stream(-1).size == RecentLetters.UNLIMITED


def test_a_replay_of_letters_replayed_before_gets_jobs_of_its_own() -> None:
    """Letters read again on purpose (the replay group's offsets reset) sit at the same DLQ positions: with the
    position alone as the plan, their load or MERGE was found done and the batch committed unwritten."""
    from firehose_bq.bigquery.jobs import batch_job_id
    from firehose_bq.dlq.replay import replay_plan

    position = {"offsets": {"0": 500}}
    ids = {batch_job_id("firehose_", "p.d.t", "dlq-replay:dlq@g", 0, replay_plan(position, run))
           for run in ("run1", "run2")}
    assert len(ids) == 2
    # A pending batch written before runs were recorded keeps the id its load or MERGE ran under.
    assert replay_plan(position, None) == [position]


def test_the_replay_remembers_two_of_the_streams_own_batches_of_letters() -> None:
    # Upsert/delete batches are bounded by SINK_BIGQUERY_MERGE_RECORDS_THRESHOLD in place of
    # SPARK_MAX_OFFSETS_PER_TRIGGER: sized from the latter, the window missed copies a batch apart, and a
    # delete-only replay appended those values twice.
    from firehose_bq.dlq.replay import DLQ_BATCH, RecentLetters
    from firehose_bq.modes import write_mode
    from tests.unit.test_modes import config

    upsert = {"SINK_BIGQUERY_UPSERT_ENABLED": "true", "INPUT_SCHEMA_PROTO_KEY_CLASS": "x.K",
              "SINK_BIGQUERY_KAFKA_KEY_FIELD_NAME": "k"}
    assert RecentLetters.for_mode(write_mode(config(**upsert, SINK_BIGQUERY_MERGE_RECORDS_THRESHOLD="500000"))) \
        .size == 1_000_000 + DLQ_BATCH
    assert RecentLetters.for_mode(write_mode(config(**upsert))).size == 200_000 + DLQ_BATCH
    assert RecentLetters.for_mode(write_mode(config())).size == 200_000 + DLQ_BATCH
    assert RecentLetters.for_mode(write_mode(config(SPARK_MAX_OFFSETS_PER_TRIGGER="-1"))).size \
        == RecentLetters.UNLIMITED


class _Broker:
    """confluent_kafka.Consumer's metadata calls against a broker that holds `topics` and creates none (its
    auto.create.topics.enable=false): an unknown topic is answered with UNKNOWN_TOPIC_OR_PART."""

    topics: dict[str, object] = {}
    configs: list[dict[str, object]] = []

    def __init__(self, conf: dict[str, object]) -> None:
        self.configs.append(conf)

    def list_topics(self, topic: str, timeout: float) -> SimpleNamespace:
        import confluent_kafka as ck

        found = self.topics.get(topic) or SimpleNamespace(error=ck.KafkaError(ck.KafkaError.UNKNOWN_TOPIC_OR_PART),
                                                          partitions={})
        return SimpleNamespace(topics={topic: found})

    def poll(self, timeout: float) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_dlq_topic_the_brokers_lack_and_do_not_create_stops_the_start_naming_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Left to the first dead letter, the producer would wait for the topic's metadata through every DLQ
    retry (about 3 minutes), stop the job, and do the same again after each restart."""
    import confluent_kafka as ck

    from firehose_bq import cli
    from firehose_bq.config import Config
    from tests.unit.test_config import MINIMAL

    monkeypatch.setattr(ck, "Consumer", _Broker)
    monkeypatch.setattr(_Broker, "configs", [])
    monkeypatch.setattr(_Broker, "topics", {"fallback": SimpleNamespace(error=None, partitions={0: object()})})
    cfg = Config.from_env({**MINIMAL, "DLQ_SINK_ENABLE": "true", "DLQ_KAFKA_TOPIC": "letters",
                           "DLQ_KAFKA_BROKERS": "dlq:9092", "SINK_BIGQUERY_ROUTE_FALLBACK_KAFKA_TOPIC": "fallback",
                           "SINK_BIGQUERY_TABLE_NAME": "t_${header.type}"})  # routed: the fallback is written
    with pytest.raises(SourceError, match=r"^DLQ_KAFKA_TOPIC: topic 'letters' on dlq:9092 does not exist, and the "
                                          r"brokers do not create topics on first use .*: create it"):
        cli._check_outputs(cfg)
    # Asked as the DLQ producer asks: a broker that creates topics on first use creates it now instead.
    assert [c["bootstrap.servers"] for c in _Broker.configs] == ["k:9092", "dlq:9092"]
    assert all(c["allow.auto.create.topics"] is True for c in _Broker.configs)
    _Broker.topics["letters"] = SimpleNamespace(error=ck.KafkaError(ck.KafkaError.LEADER_NOT_AVAILABLE), partitions={})
    cli._check_outputs(cfg)  # just created by that request: its leader comes within the producer's wait


def test_a_dlq_topic_the_job_may_not_write_is_reported_with_the_brokers_reason() -> None:
    import confluent_kafka as ck

    from firehose_bq.source.kafka_client import output_topic_problem

    denied = SimpleNamespace(error=ck.KafkaError(ck.KafkaError.TOPIC_AUTHORIZATION_FAILED), partitions={})
    assert output_topic_problem(denied, ck.KafkaError) == "cannot be written: Broker: Topic authorization failed"
    assert output_topic_problem(None, ck.KafkaError).startswith("does not exist")
    assert output_topic_problem(SimpleNamespace(error=None, partitions={0: object()}), ck.KafkaError) is None


def test_a_dlq_broker_that_cannot_be_reached_at_start_is_named_by_its_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    # DLQ_KAFKA_BROKERS may be another cluster than the source's: the error must say which setting to fix.
    import confluent_kafka as ck

    from firehose_bq import cli
    from firehose_bq.config import Config
    from tests.unit.test_config import MINIMAL

    class Unreachable(_Broker):
        def list_topics(self, topic: str, timeout: float) -> SimpleNamespace:
            raise ck.KafkaException(ck.KafkaError(ck.KafkaError._TRANSPORT))

    monkeypatch.setattr(ck, "Consumer", Unreachable)
    monkeypatch.setattr(_Broker, "configs", [])
    cfg = Config.from_env({**MINIMAL, "DLQ_SINK_ENABLE": "true", "DLQ_KAFKA_TOPIC": "letters",
                           "DLQ_KAFKA_BROKERS": "dlq:9092"})
    with pytest.raises(SourceError, match=r"^DLQ_KAFKA_TOPIC: topic 'letters' on dlq:9092: .*metadata of 'letters' "
                                          r"failed: "):
        cli._check_outputs(cfg)


def test_a_fallback_topic_a_job_without_routes_never_writes_does_not_stop_its_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # One table for every record: no record can lack a route, so the fallback topic is never written, and a
    # job that ran before the start-time check must still start (a shared env layer may set the topic).
    import confluent_kafka as ck

    from firehose_bq import cli
    from firehose_bq.config import Config
    from tests.unit.test_config import MINIMAL

    monkeypatch.setattr(ck, "Consumer", _Broker)
    monkeypatch.setattr(_Broker, "configs", [])
    monkeypatch.setattr(_Broker, "topics", {})
    cfg = Config.from_env({**MINIMAL, "SINK_BIGQUERY_ROUTE_FALLBACK_KAFKA_TOPIC": "fallback"})
    assert cfg.router.is_static
    cli._check_outputs(cfg)
    assert _Broker.configs == []
