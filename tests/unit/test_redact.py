"""Credentials never reach a log line or an error: URLs lose their user info and query values, and known
secret values are masked wherever they appear."""

from __future__ import annotations

from firehose_bq import redact
from firehose_bq.redact import Redactor


def test_a_url_loses_its_user_info_query_values_and_fragment() -> None:
    assert redact.url("https://user:s3cret@registry.example:8443/v1/set.desc") == (
        "https://***@registry.example:8443/v1/set.desc")
    assert redact.url("https://registry.example/set.desc?token=abc&v=2&flag") == (
        "https://registry.example/set.desc?token=***&v=***&flag")
    assert redact.url("https://h/x#access_token=abc") == "https://h/x#***"
    assert redact.url("https://registry.example/set.desc") == "https://registry.example/set.desc"
    assert redact.url("/local/path.desc") == "/local/path.desc"
    assert redact.url("file:///local/path.desc") == "file:///local/path.desc"
    assert redact.url("http://user:pw@host:notaport/x") == "http://***"  # unparseable: nothing shown


def test_urls_inside_text_are_found_and_the_sentence_survives() -> None:
    text = ("cannot fetch descriptors from http://alice:PW1@10.0.0.1:9/a.desc?token=QS&v=2: refused; "
            "also 'https://h/b?k=z'.")
    assert redact.urls_in(text) == ("cannot fetch descriptors from http://***@10.0.0.1:9/a.desc?token=***&v=***: "
                                    "refused; also 'https://h/b?k=***'.")
    assert redact.urls_in("no url at 12:30, path /a/b?c=d") == "no url at 12:30, path /a/b?c=d"


def test_secret_values_are_masked_with_their_parts() -> None:
    redactor = Redactor.of(["Authorization: Bearer TOKEN123, X-Api-Key: key456789", "user:PASSWORD", ""])
    assert redactor.text("sent Authorization: Bearer TOKEN123 and key456789") == "sent *** and ***"
    assert redactor.text("echoed TOKEN123 alone; password PASSWORD") == "echoed *** alone; password ***"
    assert redactor.text("user logged in") == "user logged in"  # fragments under 4 characters are left alone
    assert Redactor().text("https://u:p@h/x") == "https://***@h/x"
