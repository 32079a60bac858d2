import msgspec
from nats.js import api as js_api

from contracts import streams
from plumbing.bus_setup import _stream_config, effective_retention


def test_work_streams_drop_what_is_done_only_on_a_single_server() -> None:
    assert effective_retention(streams.APPLY) == "interest"
    replicated = msgspec.structs.replace(streams.APPLY, replicas=3)
    assert effective_retention(replicated) == "limits"
    assert _stream_config(replicated).retention == js_api.RetentionPolicy.LIMITS
    assert _stream_config(streams.EVENTS).retention == js_api.RetentionPolicy.INTEREST
    assert effective_retention(msgspec.structs.replace(streams.RESULTS, replicas=3)) == "limits"
