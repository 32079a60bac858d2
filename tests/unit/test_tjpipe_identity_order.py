"""The order ``tjpipe up`` and the compose set-up apply deploy/'s identity objects in."""

from __future__ import annotations

from tjpipe.local.identities import identity_objects


def test_a_policy_binding_comes_after_its_policy_and_its_params() -> None:
    objects = identity_objects()
    position = {(o["kind"], o["metadata"]["name"]): i for i, o in enumerate(objects)}
    bindings = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert bindings, "deploy/ has no policy binding any more: this test has nothing to check"
    for binding in bindings:
        here = position[("ValidatingAdmissionPolicyBinding", binding["metadata"]["name"])]
        assert position[("ValidatingAdmissionPolicy", binding["spec"]["policyName"])] < here
        param = (binding["spec"].get("paramRef") or {}).get("name")
        if param:  # with parameterNotFoundAction Deny, a binding loaded before its params denies their creation
            assert position[("ConfigMap", param)] < here, binding["metadata"]["name"]
