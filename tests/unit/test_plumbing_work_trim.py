"""What a consuming stage may remove from a limits-retention work stream: only the acknowledged and recorded."""

from __future__ import annotations

from plumbing.work_trim import purge_below, recorded_up_to


def test_the_source_header_names_the_work_stream_and_its_sequence() -> None:
    assert (
        recorded_up_to({"Nats-Stream-Source": "TJ_APPLY 1234 > > tj.apply.3.ns.n.jobset QOsbigyB"}, "TJ_APPLY") == 1234
    )
    assert recorded_up_to({"Nats-Stream-Source": "TJ_APPLY:5c2f1a 77"}, "TJ_APPLY") == 77  # before nats-server 2.10


def test_a_history_message_from_elsewhere_or_unsourced_records_nothing() -> None:
    assert recorded_up_to({"Nats-Stream-Source": "TJ_EVENTS 1234 > >"}, "TJ_APPLY") is None
    assert recorded_up_to({"Nats-Stream-Source": "TJ_APPLY_OLD 12"}, "TJ_APPLY") is None
    assert recorded_up_to({"Nats-Stream-Source": "TJ_APPLY x"}, "TJ_APPLY") is None
    assert recorded_up_to({}, "TJ_APPLY") is None
    assert recorded_up_to(None, "TJ_APPLY") is None


def test_the_purge_stops_at_what_is_both_acknowledged_and_recorded() -> None:
    assert purge_below(ack_floor=50, recorded=80, trimmed=0) == 51  # the history is ahead: the ack floor bounds
    assert purge_below(ack_floor=80, recorded=50, trimmed=0) == 51  # the history lags: what it holds bounds


def test_nothing_new_done_means_no_purge() -> None:
    assert purge_below(ack_floor=50, recorded=80, trimmed=50) is None
    assert purge_below(ack_floor=0, recorded=80, trimmed=0) is None  # nothing acknowledged yet
    assert purge_below(ack_floor=40, recorded=80, trimmed=50) is None  # a second holder saw an older floor


def test_a_sweep_purges_only_what_the_server_kept() -> None:
    # Under interest retention everything below the stream's first message is gone already (trimmed = first - 1).
    assert purge_below(ack_floor=18, recorded=18, trimmed=17) == 19  # the first message, 18, is finished: it goes
    assert purge_below(ack_floor=12, recorded=18, trimmed=17) is None  # this partition's finished work is all gone
    assert purge_below(ack_floor=30, recorded=20, trimmed=17) == 21  # what is not recorded yet stays
