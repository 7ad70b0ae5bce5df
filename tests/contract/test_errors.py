"""Errors own their JSON: every error a body may name goes to JSON and back as the same class with
the same message and fields, the bodies are the wire's exact bytes, and a new class with fields
needs only its own hook and one table entry (issue 26 point 3)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jupyter_tai_sandbox import contract, errors
from jupyter_tai_sandbox.contract import errors as contract_errors
from jupyter_tai_sandbox.contract.errors import (
    OutputTooLargeError,
    SandboxError,
    SandboxExecTimeoutError,
    SandboxNotFoundError,
    SandboxRequestError,
    SandboxSpecRejectedError,
    SandboxUnsupportedError,
)
from jupyter_tai_sandbox.errors import (
    ERROR_CLASSES,
    PresetInvalidError,
    SandboxSessionGoneError,
    ToolInputError,
    error_body,
    error_from_json,
    error_status,
)

#: the fields each class keeps as attributes besides ``details``
FIELDS = ("field", "stdout_bytes", "stderr_bytes", "note", "exit_code", "problems", "session_id", "reason")

#: instances of the classes that have fields, in each shape their fields take
SAMPLES: dict[type[SandboxError], list[SandboxError]] = {
    SandboxRequestError: [
        SandboxRequestError("argv: a list is required", field="argv"),
        SandboxRequestError("bad"),
    ],
    OutputTooLargeError: [
        OutputTooLargeError("too much", stdout_bytes=5, stderr_bytes=6, exit_code=0),
        OutputTooLargeError("too much", stdout_bytes=7),
    ],
    SandboxExecTimeoutError: [
        SandboxExecTimeoutError("the deadline passed", stdout_bytes=1, stderr_bytes=2),
        SandboxExecTimeoutError(
            "the deadline passed", stdout_bytes=3, stderr_bytes=4, note="a child held the output"
        ),
    ],
    ToolInputError: [ToolInputError("text", "is required"), ToolInputError("", "must be an object")],
    PresetInvalidError: [PresetInvalidError("two problems", problems=["a", "b"]), PresetInvalidError("one")],
    SandboxUnsupportedError: [
        SandboxUnsupportedError("cannot pause", operation="pause"),
        SandboxUnsupportedError("x"),
    ],
    SandboxSessionGoneError: [
        SandboxSessionGoneError("sbx-0123456789abcdef", "ttl"),
        SandboxSessionGoneError("sbx-0123456789abcdef", "destroyed"),
    ],
}


def _fields(error: BaseException) -> dict[str, Any]:
    return {name: getattr(error, name, None) for name in FIELDS}


def _samples(cls: type[SandboxError]) -> list[SandboxError]:
    return SAMPLES.get(cls) or [cls(f"what went wrong ({cls.__name__})")]


def test_every_class_with_fields_has_samples():
    """A class with its own constructor has fields: it is sampled here, so its round trip is tested."""
    for cls in ERROR_CLASSES.values():
        if cls.__init__ is not SandboxError.__init__:
            assert cls in SAMPLES, f"{cls.__name__} has its own fields: add samples of it"


@pytest.mark.parametrize("name", sorted(ERROR_CLASSES))
def test_round_trip(name):
    cls = ERROR_CLASSES[name]
    for error in _samples(cls):
        body = json.loads(json.dumps(error.to_json()))
        assert body["error"] == name and body["message"] == str(error)
        assert body == {"error": name, "message": str(error), **error.details}
        assert error_body(error, error_status(error)) == error.to_json()
        for back in (cls.from_json(body), error_from_json(body)):
            assert type(back) is cls
            assert str(back) == str(error)
            assert back.details == error.details
            assert _fields(back) == _fields(error)
            assert json.dumps(back.to_json()) == json.dumps(error.to_json())
            assert error_status(back) == error_status(error)


def test_wire_bodies_are_byte_for_byte():
    """The bodies doors answered before errors owned their JSON, key order included."""
    cases = [
        (
            SandboxExecTimeoutError("timed out", stdout_bytes=3, stderr_bytes=4),
            '{"error": "SandboxExecTimeoutError", "message": "timed out", "stdout_bytes": 3, "stderr_bytes": 4, '
            '"note": null}',
        ),
        (
            SandboxExecTimeoutError("timed out", stdout_bytes=3, stderr_bytes=4, note="held"),
            '{"error": "SandboxExecTimeoutError", "message": "timed out (held)", "stdout_bytes": 3, '
            '"stderr_bytes": 4, "note": "held"}',
        ),
        (
            OutputTooLargeError("big"),
            '{"error": "OutputTooLargeError", "message": "big", "stdout_bytes": 0, "stderr_bytes": 0, "exit_code": null}',
        ),
        (SandboxRequestError("bad"), '{"error": "SandboxRequestError", "message": "bad"}'),
        (
            SandboxRequestError("bad", field="argv"),
            '{"error": "SandboxRequestError", "message": "bad", "field": "argv"}',
        ),
        (ToolInputError("", "bad"), '{"error": "ToolInputError", "message": "the input: bad", "field": ""}'),
        (
            PresetInvalidError("x", problems=["a"]),
            '{"error": "PresetInvalidError", "message": "x", "problems": ["a"]}',
        ),
        (PresetInvalidError("x"), '{"error": "PresetInvalidError", "message": "x"}'),
        (errors.SandboxCapacityError("full"), '{"error": "SandboxCapacityError", "message": "full"}'),
        (
            contract.isolation_floor_refusal("local", "none", "container"),
            json.dumps(
                {
                    "error": "SandboxSpecRejectedError",
                    "message": str(contract.isolation_floor_refusal("local", "none", "container")),
                }
            ),
        ),
    ]
    for error, wire in cases:
        assert json.dumps(error_body(error, error_status(error))) == wire


def test_the_timeout_note_is_not_doubled():
    error = SandboxExecTimeoutError("timed out", stdout_bytes=0, stderr_bytes=0, note="held")
    back = SandboxExecTimeoutError.from_json(error.to_json())
    assert str(back) == "timed out (held)" and back.note == "held"


def test_bodies_with_odd_fields_decode_safely():
    back = error_from_json(
        {"error": "OutputTooLargeError", "message": "m", "stdout_bytes": True, "exit_code": "1"}
    )
    assert (back.stdout_bytes, back.stderr_bytes, back.exit_code) == (0, 0, None)
    back = error_from_json({"error": "SandboxRequestError", "message": "m", "field": 3})
    assert back.field is None and "field" not in back.to_json()
    back = error_from_json({"error": "PresetInvalidError", "message": "m", "problems": "not a list"})
    assert back.problems is None and back.to_json() == {"error": "PresetInvalidError", "message": "m"}
    # a websocket message carries its own keys beside the body's; they are not the error's fields
    back = error_from_json({"type": "error", "error": "SandboxNotFoundError", "message": "gone"})
    assert type(back) is SandboxNotFoundError and back.details == {}


def test_unknown_names_fall_back_to_sandbox_error():
    assert str(error_from_json({"error": "Nope", "message": "m"})) == "Nope: m"
    assert str(error_from_json({"error": "Nope", "message": "m"}, fallback="HTTP 500: m")) == "HTTP 500: m"
    assert type(error_from_json({"message": "m"})) is SandboxError


class ImageMissingError(SandboxNotFoundError):
    """A class with a field of its own, defined outside the package: only its hook knows the field."""

    def __init__(self, message: str, *, image: str) -> None:
        super().__init__(message, details={"image": image})
        self.image = image

    @classmethod
    def _from_json_fields(cls, message: str, data: dict[str, Any]) -> ImageMissingError:
        return cls(message, image=str(data.get("image", "")))


def test_a_class_with_a_field_needs_no_ladder(monkeypatch):
    error = ImageMissingError("no such image", image="python:3.12")
    body = json.loads(json.dumps(error_body(error, error_status(error))))
    assert body == {"error": "ImageMissingError", "message": "no such image", "image": "python:3.12"}
    assert error_status(error) == 404  # the status table maps it by its base
    back = ImageMissingError.from_json(body)
    assert type(back) is ImageMissingError and back.image == "python:3.12" and str(back) == "no such image"
    # a client knows it once the table names it: no other code changes
    assert type(error_from_json(body)) is SandboxError
    monkeypatch.setitem(ERROR_CLASSES, "ImageMissingError", ImageMissingError)
    back = error_from_json(body)
    assert type(back) is ImageMissingError and back.image == "python:3.12" and back.to_json() == body


def test_details_only_errors_need_no_class():
    error = SandboxError("m", details={"hint": "h"})
    assert error.to_json() == {"error": "SandboxError", "message": "m", "hint": "h"}
    assert SandboxError("a", "b").args == ("a", "b") and SandboxError().details == {}


def test_the_contract_owns_its_errors():
    """Providers raise the contract's errors; every old import path still gives the same class."""
    for name in contract_errors.__all__:
        cls = getattr(contract_errors, name)
        assert getattr(contract, name) is cls and name in contract.__all__
        assert getattr(errors, name) is cls and ERROR_CLASSES[name] is cls
    for name in ("SandboxForbiddenError", "SandboxQuotaError", "SandboxCapacityError"):
        assert getattr(errors, name) is getattr(contract, name)


def test_providers_import_errors_from_the_contract():
    import pathlib
    import re

    providers = pathlib.Path(contract.__file__).parent.parent / "providers"
    modules = list(providers.rglob("*.py"))
    assert len(modules) > 10, providers  # the folder the check reads is the providers' own
    offenders = [
        str(p.relative_to(providers))
        for p in modules
        if re.search(r"from \.+(errors|server)\b", p.read_text())
    ]
    assert offenders == []


def test_isolation_floor_stays_off_the_wire_and_for_door_rewords():
    error = contract.isolation_floor_refusal("local", "none", "container")
    assert isinstance(error, SandboxSpecRejectedError) and error.isolation_floor == (
        "local",
        "none",
        "container",
    )
    assert set(error.to_json()) == {"error", "message"}
    cli = contract.for_door(error, "cli")
    assert "--isolation none" in str(cli) and cli.isolation_floor == error.isolation_floor
    other = SandboxSpecRejectedError("x")
    assert other.isolation_floor is None and contract.for_door(other, "cli") is other
