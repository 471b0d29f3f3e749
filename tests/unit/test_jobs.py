"""The ids of a batch's BigQuery jobs and what they are derived from (bigquery/jobs.py). How jobs are
found, created and polled is tested through their users: test_file_loads.py, test_upsert_flush.py."""

from __future__ import annotations


import pytest

from firehose_bq.bigquery import jobs


def test_a_job_id_is_the_same_for_the_same_batch_whatever_the_order_of_its_ranges() -> None:
    one = jobs.batch_job_id("firehose_bq_merge_", "p.ds.tbl", "ck", 3, [("t", 1, 0, 4, 5), ("t", 0, 0, 9, 10)])
    again = jobs.batch_job_id("firehose_bq_merge_", "p.ds.tbl", "ck", 3, [("t", 0, 0, 9, 10), ("t", 1, 0, 4, 5)])
    assert one == again and one.startswith("firehose_bq_merge_ds_tbl_b3_")
    assert all(c.isalnum() or c in "_-" for c in one) and len(one) <= 1024


def test_a_job_id_changes_with_the_table_checkpoint_batch_or_records() -> None:
    base = ("firehose_bq_merge_", "p.ds.tbl", "ck", 3, [("t", 0, 0, 9, 10)])
    others = [("firehose_bq_", *base[1:]), (base[0], "p.ds.other", *base[2:]), (*base[:2], "ck2", *base[3:]),
              (*base[:3], 4, base[4]), (*base[:4], [("t", 0, 0, 9, 9)])]
    assert len({jobs.batch_job_id(*base), *(jobs.batch_job_id(*o) for o in others)}) == 1 + len(others)


def test_attempt_ids() -> None:
    assert jobs.attempt_job_id("j", 0) == "j"
    assert jobs.attempt_job_id("j", 2) == "j_retry2"


def test_the_job_timeout_is_still_read_under_its_file_loads_name() -> None:
    from firehose_bq import config
    from firehose_bq.errors import ConfigError
    from tests.unit.test_config import MINIMAL

    old = {**MINIMAL, "SINK_BIGQUERY_FILE_LOADS_JOB_TIMEOUT_MS": "5000"}
    assert config.Config.from_env(old).bigquery.job_timeout_ms == 5000
    assert config.unknown_variables(old) == []
    assert config.Config.from_env({**old, "SINK_BIGQUERY_JOB_TIMEOUT_MS": "5000"}).bigquery.job_timeout_ms == 5000
    with pytest.raises(ConfigError, match="SINK_BIGQUERY_JOB_TIMEOUT_MS: set differently under its former name"):
        config.Config.from_env({**old, "SINK_BIGQUERY_JOB_TIMEOUT_MS": "9000"})


def test_a_batch_job_is_looked_up_in_the_datasets_location() -> None:
    # jobs.get finds a job outside the US and EU multi-regions only when told its location: without it a
    # MERGE or load job done before a crash reads as missing, its creation then answers 409, and the
    # replayed batch stops the job on every restart (regional datasets: europe-west2, us-central1...).
    from firehose_bq.bigquery.client import attempt_options, make_client
    from firehose_bq.config import BigQueryConfig

    cfg = BigQueryConfig(project_id="p", dataset="d", table="t", api_endpoint="http://127.0.0.1:1",
                         dataset_location="asia-southeast1")
    client = make_client(cfg)
    requests: list[dict] = []

    def call_api(retry: object, **request: object) -> dict:
        requests.append(request)
        return {"jobReference": {"projectId": "p", "jobId": "j", "location": "asia-southeast1"},
                "configuration": {"query": {"query": "SELECT 1"}}, "status": {"state": "DONE"}}

    client._call_api = call_api  # noqa: SLF001 (the one request a lookup makes)
    assert jobs.BatchJobs(client, "MERGE job", cfg.table_ref, attempt_options(cfg), 10).existing("j") is not None
    assert requests[0]["query_params"]["location"] == "asia-southeast1"
