"""Gap 4: a multipart upload (a load job under 5 MB) is accepted whatever its data part's Content-Type.

BigQuery reads the data part as the load configuration's ``sourceFormat`` says. google-cloud-bigquery
sends the data part of a multipart load (files under 5 MB, including every ``load_table_from_json``) as
``Content-Type: */*``, which bqemulator's allowlist rejects ("second part has unsupported Content-Type").
The part's declared type carries no information worth refusing over.

Shown by tests/integration/test_emulator_gaps.py::test_gap4_load_table_from_json_under_5mb_uses_multipart and
::test_gap4_load_table_from_file_csv_under_5mb.
"""

from typing import Any

from ._targets import module, replace, require


def apply() -> list[str]:
    """Replace ``_parse_media_part`` with one that takes the part's bytes as they are."""
    upload = module("bqemulator.api.routes.upload")
    # _parse_multipart_related looks _parse_media_part up at call time.
    require(upload, "_parse_multipart_related")

    def _parse_media_part(part: Any) -> bytes:
        payload = part.get_payload(decode=True)
        if payload is None:
            payload = part.get_payload()
            payload = payload.encode("utf-8") if isinstance(payload, str) else b""
        return bytes(payload)

    return [replace(upload, "_parse_media_part", _parse_media_part)]
