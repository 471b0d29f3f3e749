"""transport.get against a real local HTTP server: what a malformed URL or a cut answer becomes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from firehose_bq.errors import RegistryUnavailableError, SchemaError
from firehose_bq.registry import transport
from firehose_bq.registry.config import RegistryConfig, Secret
from firehose_bq.registry.confluent import ConfluentRegistry
from firehose_bq.registry.stencil import StencilFetcher


@pytest.fixture
def cutting_server() -> Iterator[str]:
    """Announces 1000 bytes, sends 10, closes: a registry (or proxy) that dies mid-answer."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b"\x0a\x08" + b"x" * 8)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("url", ["http://bob:pw-s3cret@127.0.0.1:9/set s?token=tok-s3cret",
                                 "http://127.0.0.1:9/set\n?token=tok-s3cret"])
def test_a_url_urllib_refuses_is_a_schema_error_that_shows_no_secret(url: str) -> None:
    # http.client's InvalidURL quoted the path and query, a token included, into the start's error.
    with pytest.raises(SchemaError) as raised:
        StencilFetcher([url], RegistryConfig()).fetch()
    assert not isinstance(raised.value, RegistryUnavailableError)
    assert "s3cret" not in str(raised.value) and "is not a URL that can be requested (it contains a space or a control character" in str(raised.value)
    registry = ConfluentRegistry(url.replace("/set", "/reg"), user_info=Secret("u:p"), timeout_s=1)
    with pytest.raises(SchemaError) as confluent:
        registry.latest("orders-value")
    assert "s3cret" not in str(confluent.value) and "did not answer JSON" not in str(confluent.value)


def test_an_answer_cut_short_is_worth_a_retry(cutting_server: str) -> None:
    # http.client's IncompleteRead is no OSError: it escaped the registries' failure handling unretried.
    with pytest.raises(RegistryUnavailableError, match=f"cannot fetch descriptors from {cutting_server}/set: .*cut short"):
        StencilFetcher([f"{cutting_server}/set"], RegistryConfig()).fetch()
    with pytest.raises(RegistryUnavailableError, match="cut short"):
        ConfluentRegistry(cutting_server, user_info=None, timeout_s=5).latest("orders-value")
    with pytest.raises(ConnectionError):
        transport.get(f"{cutting_server}/set", {}, 5)
