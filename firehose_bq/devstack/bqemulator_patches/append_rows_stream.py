"""Gap 6: later requests of an AppendRows connection may omit the stream name.

BigQuery binds an AppendRows connection to the stream named by its first request; later requests may
leave ``write_stream`` (and the writer schema) out, and the official ``AppendRowsStream`` helper does.
bqemulator re-resolves the name on every request, so the empty name of the second one answers
NOT_FOUND "Stream not found" and closes the connection. The wrapper keeps the bound stream when the
name is empty, and answers INVALID_ARGUMENT, as BigQuery does, when the first request has none.

Shown by tests/integration/test_emulator_gaps.py::test_gap6_append_rows_stream_helper_sends_the_stream_name_once and
::test_gap6_first_request_without_a_stream_name_is_invalid.
"""

from typing import Any

from ._targets import module, replace, require


def apply() -> list[str]:
    """Wrap ``_ensure_stream_bound`` so that an empty stream name means the connection's stream."""
    import grpc  # bqemulator dependency

    write_servicer = module("bqemulator.grpc_api.write_servicer")
    handler_cls = require(write_servicer, "BigQueryWriteHandler")
    original = require(handler_cls, "_ensure_stream_bound")

    def _ensure_stream_bound(self: Any, stream_name: str, bound_ctx: Any, context: Any) -> Any:
        if not stream_name:
            if bound_ctx is not None:
                return bound_ctx
            context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
            context.set_details("The first AppendRowsRequest of a connection must set write_stream")
            return None
        return original(self, stream_name, bound_ctx, context)

    return [replace(handler_cls, "_ensure_stream_bound", _ensure_stream_bound)]
