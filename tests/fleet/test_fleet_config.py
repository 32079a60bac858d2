"""The fleet's pure parts: cluster names, subjects at the hub, the leaf user's permissions, rendered configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts import fleet as fleet_contract
from contracts import streams
from tjpipe import fleet_nats


@pytest.mark.parametrize("name", ["c1", "prod-eu-1", "a", "x" * 63])
def test_a_dns_label_is_a_cluster_name(name: str) -> None:
    assert fleet_contract.check_cluster_name(name) == name


@pytest.mark.parametrize("name", ["", "prod.eu", "Prod", "-a", "a-", "a b", "a*", "a>", "x" * 64, "hub"])
def test_a_name_that_cannot_be_a_domain_and_a_token_is_refused(name: str) -> None:
    with pytest.raises(fleet_contract.FleetNameError):
        fleet_contract.check_cluster_name(name)


def test_every_record_stream_has_a_fleet_stream_and_nothing_else_does() -> None:
    assert [spec.origin for spec in fleet_contract.FLEET_STREAMS] == [s.name for s in streams.RECORD_STREAMS]
    assert streams.EVENTS.name not in fleet_contract.FLEET_OF and streams.APPLY.name not in fleet_contract.FLEET_OF
    by_origin = {spec.origin: spec.origin_filter for spec in fleet_contract.FLEET_STREAMS}
    assert by_origin[streams.EVENTS_HISTORY.name] == "tj.ev.>"
    assert by_origin[streams.APPLY_HISTORY.name] == "tj.apply.>"
    assert by_origin[streams.RESULTS.name] == "tj.result.>"


def test_a_subject_at_the_hub_names_its_cluster_and_gives_back_the_original() -> None:
    stored = fleet_contract.fleet_subject("c1", "tj.ev.3.team-a.job-0")
    assert stored == "fleet.c1.tj.ev.3.team-a.job-0"
    assert fleet_contract.cluster_of(stored) == ("c1", "tj.ev.3.team-a.job-0")
    assert fleet_contract.cluster_of("tj.ev.3.team-a.job-0") == ("", "tj.ev.3.team-a.job-0")
    assert fleet_contract.cluster_of("fleet.c1") == ("", "fleet.c1")


def test_the_hub_keeps_each_members_trainjobs_to_the_same_share_of_the_progress_history_as_the_member() -> None:
    """A subject at the hub is one member's one TrainJob, so the member's per-subject limit holds there as well:
    one member's flood of one TrainJob drops that TrainJob's own oldest copies, never another's."""
    (spec,) = [s for s in fleet_contract.FLEET_STREAMS if s.origin == streams.PROGRESS.name]
    config = fleet_nats.fleet_stream_config(spec, "c1").as_dict()
    assert config["max_msgs_per_subject"] == streams.PROGRESS.max_msgs_per_subject > 0


def test_the_sources_config_puts_each_members_name_in_its_transform() -> None:
    spec = fleet_contract.FLEET_STREAMS[0]
    for c in ("c1", "c2"):
        config = fleet_nats.fleet_stream_config(spec, c).as_dict()
        assert config["name"] == f"{spec.name}_{c}" == fleet_contract.fleet_stream(spec.origin, c)
        assert config["subjects"] == [] and config["num_replicas"] == 3
        assert [
            (s["name"], s["external"]["api"], s["external"]["deliver"], s["subject_transforms"])
            for s in config["sources"]
        ] == [
            (
                spec.origin,
                f"$JS.{c}.API",
                f"fleet-deliver.{c}.{spec.origin}",
                [{"src": "tj.ev.>", "dest": f"fleet.{c}.tj.ev.>"}],
            )
        ]
        # Each member's quota at the hub: its own stream's byte limit, the member stream's own.
        assert config["max_bytes"] == spec.member_max_bytes > 0


def test_a_fleet_streams_name_says_its_kind_and_member_and_nothing_else_passes() -> None:
    for spec in fleet_contract.FLEET_STREAMS:
        assert fleet_contract.stream_of(fleet_contract.fleet_stream(spec.origin, "prod-eu")) == (spec, "prod-eu")
    for name in ("FLEET_RESULTS", "FLEET_RESULTS_", "FLEET_RESULTS_hub", "FLEET_RESULTS_C1", "TJ_RESULTS", "KV_x"):
        assert fleet_contract.stream_of(name) is None, name


def test_the_leaf_user_of_one_member_names_no_other() -> None:
    rules = fleet_nats.leaf_permissions("c1")
    assert rules.publish == ("$JSC.R.c1.>", "fleet-deliver.c1.>")
    assert all(s.startswith(("$JS.c1.API.CONSUMER.CREATE.", "$JS.FC.c1.*.")) for s in rules.subscribe)
    record_streams = {s.name for s in streams.RECORD_STREAMS}
    assert {s.split(".")[5] for s in rules.subscribe if s.startswith("$JS.c1.")} == record_streams
    # Flow control in the form that names the member's domain (its server's js_ack_fc_v2), never the first
    # form ($JS.FC.<stream>.…), which every member's consumers on the same stream share.
    assert {s.split(".")[4] for s in rules.subscribe if s.startswith("$JS.FC.")} == record_streams
    assert "js_ack_fc_v2: true" in fleet_nats.member_config(
        cluster="c1", store_dir="/data", hub_leaf_urls=["hub:7422"], leaf_seed="SU", ca_file="/ca.crt"
    )


def test_the_hub_config_holds_public_keys_only(tmp_path: Path) -> None:
    creds = fleet_nats.generate_fleet_credentials(tmp_path / "creds", ["c1", "c2"])
    authorization = fleet_nats.hub_authorization(creds, ["c1", "c2"])
    text = fleet_nats.hub_config(
        fleet_nats.HubServer(
            name="hub-0",
            client_listen="127.0.0.1:4222",
            monitor_listen="127.0.0.1:8222",
            cluster_listen="127.0.0.1:6222",
            leaf_listen="127.0.0.1:7422",
            store_dir="/data",
            routes=("127.0.0.1:6223",),
        ),
        tls=fleet_nats.HubTls(cert_file="/tls/tls.crt", key_file="/tls/tls.key", ca_file="/tls/ca.crt"),
        authorization=authorization,
        route_password="pw",
        max_file_store="64GB",
    )
    assert 'domain: "hub"\n  max_file_store: 64GB\n}' in text
    seeds = [*(creds.hub_seed(i) for i in fleet_nats.HUB_IDENTITIES), *(creds.leaf_seed(c) for c in ("c1", "c2"))]
    assert not [seed for seed in seeds if seed.read_text().strip() in text]
    assert text.count('allowed_connection_types: ["LEAFNODE"]') == 2
    assert 'domain: "hub"' in text and "isolate_leafnode_interest: true" in text
    for cluster in ("c1", "c2"):
        assert creds.public_key(creds.leaf_seed(cluster)) in text
    assert oct((tmp_path / "creds" / "members" / "c1.nk").stat().st_mode & 0o777) == "0o600"


def test_a_member_config_has_its_domain_its_remote_and_its_own_wall() -> None:
    text = fleet_nats.member_config(
        cluster="c1",
        store_dir="/data",
        hub_leaf_urls=["127.0.0.1:7422", "nats-leaf://hub-1:7422"],
        leaf_seed="SUAEXAMPLE\n",
        ca_file="/tls/ca.crt",
    )
    assert 'domain: "c1"' in text
    assert 'urls: ["nats-leaf://127.0.0.1:7422", "nats-leaf://hub-1:7422"]' in text
    assert 'deny_imports: ["tj.ev.>", "tj.apply.>", "$KV.>", "$JS.API.>"]' in text
    assert "disabled" not in text
    cut = fleet_nats.member_config(
        cluster="c1", store_dir="/d", hub_leaf_urls=["h:7422"], leaf_seed="S", ca_file="/c", enabled=False
    )
    assert "disabled: true" in cut


def test_the_gap_tracker_counts_what_a_member_skipped_and_not_what_the_hub_removed() -> None:
    tracker = fleet_nats.GapTracker()
    fold = tracker.fold
    # c1's copies at hub sequences 1, 2, 5 with origin 1, 2, 10: 7 never copied (3..9). c2's in between.
    fold("F", 1, "c1", 1, [])
    fold("F", 2, "c1", 2, [])
    fold("F", 3, "c2", 1, [])
    fold("F", 4, "c2", 2, [])
    fold("F", 5, "c1", 10, [])
    # c2: origin 2 → 6 with hub sequences 6 and 7 removed by the hub itself (a subject's limit): those two may
    # have been c2's copies of 3..5, so only one is counted lost (never more than it can know).
    fold("F", 8, "c2", 6, [6, 7])
    # c1's stream started again (its store wiped): nothing lost, counted from there.
    fold("F", 9, "c1", 1, [6, 7])
    fold("F", 10, "c1", 2, [6, 7])
    # A member's first copy (origin 500): what came before it is not counted (aged out, or before it joined).
    fold("G", 1, "c1", 500, [])
    gaps = {(g.stream, g.cluster): (g.missing, g.ranges) for g in tracker.gaps()}
    assert gaps == {("F", "c1"): (7, ((3, 9),)), ("F", "c2"): (1, ((3, 5),)), ("G", "c1"): (0, ())}
    assert tracker.next_seq == {"F": 11, "G": 2}
