"""The order ``tjpipe up`` and the compose set-up apply deploy/'s identity objects in."""

from __future__ import annotations

from tjpipe.local.identities import identity_objects


def test_a_policy_binding_comes_after_its_policy_and_has_no_params() -> None:
    objects = identity_objects()
    position = {(o["kind"], o["metadata"]["name"]): i for i, o in enumerate(objects)}
    bindings = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert bindings, "deploy/ has no policy binding any more: this test has nothing to check"
    for binding in bindings:
        here = position[("ValidatingAdmissionPolicyBinding", binding["metadata"]["name"])]
        assert position[("ValidatingAdmissionPolicy", binding["spec"]["policyName"])] < here
        # Params that are missing make a Deny binding refuse every write of everyone, before its matchConditions.
        assert "paramRef" not in binding["spec"], binding["metadata"]["name"]
