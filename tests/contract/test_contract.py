import pytest

from jupyter_tai_sandbox.contract import SandboxError, SandboxSpecRejectedError, SessionSpec


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"isolation": "chroot"}, "unknown isolation"),
        ({"network": "wifi"}, "unknown network"),
        ({"durability": "forever"}, "unknown durability"),
        ({"durability": "persistent"}, "needs a workspace_key"),
        ({"durability": "persistent", "workspace_key": "../etc"}, "invalid workspace_key"),
        ({"durability": "persistent", "workspace_key": ".ephemeral"}, "invalid workspace_key"),
        ({"workspace_key": "k"}, "durability='persistent'"),
        ({"ttl_seconds": 0}, "ttl_seconds"),
        ({"ttl_seconds": -5}, "ttl_seconds"),
        ({"ttl_seconds": float("inf")}, "ttl_seconds"),
        ({"cpu": -1}, "cpu"),
        ({"memory_mb": 1.5}, "memory_mb"),
        ({"memory_mb": True}, "memory_mb"),
        ({"image": " "}, "image"),
        ({"consumer": ""}, "consumer"),
        ({"env": {"BAD NAME": "x"}}, "invalid environment variable name"),
        ({"env": {"OK": 1}}, "must be a string"),
    ],
)
def test_invalid_specs_are_rejected_with_a_message_that_says_what_to_change(fields, message):
    with pytest.raises(SandboxSpecRejectedError, match=message):
        SessionSpec(**fields)


def test_spec_rejected_is_a_sandbox_error():
    assert issubclass(SandboxSpecRejectedError, SandboxError)


def test_spec_json_round_trip_and_unknown_fields():
    spec = SessionSpec(image="img", durability="persistent", workspace_key="k", env={"A": "1"}, consumer="c")
    assert SessionSpec.from_json(spec.to_json()) == spec
    assert spec.to_public_json()["env"] == ["A"]
    with pytest.raises(SandboxSpecRejectedError, match="unknown session spec field"):
        SessionSpec.from_json({"imag": "typo"})
    with pytest.raises(SandboxSpecRejectedError, match="JSON object"):
        SessionSpec.from_json(["not", "an", "object"])


def test_spec_env_is_a_private_copy():
    env = {"A": "1"}
    spec = SessionSpec(env=env)
    env["A"] = "changed"
    assert spec.env == {"A": "1"}
