"""api.yaml, the source of truth of the REST API: its schemas, and a check of a response against them."""

from __future__ import annotations

import re
from importlib.resources import files

import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SPEC = yaml.safe_load(files("jupyter_tai_sandbox").joinpath("api.yaml").read_text())


REGISTRY = Registry().with_resource(
    "urn:api", Resource.from_contents(SPEC, default_specification=DRAFT202012)
)


METHODS = ("get", "post", "put", "delete", "patch")


def template(pattern: str) -> str:
    """A tornado route pattern as an OpenAPI path under /api/sandbox."""
    path = re.sub(r"\(\?:/\(\?P<(\w+)>[^)]*\)\)\?", r"/{\1}", pattern)  # an optional trailing segment
    path = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", path)
    path = path.replace("\\.", ".")  # a literal dot (transcript\.ipynb)
    assert path.startswith("/api/sandbox/"), pattern
    return path.removeprefix("/api/sandbox").rstrip("$")


def response_schema(path: str, method: str, status: int) -> dict | None:
    responses = SPEC["paths"][path][method]["responses"]
    assert str(status) in responses, f"{method.upper()} {path} -> {status} is not documented"
    response = responses[str(status)]
    if "$ref" in response:
        response = SPEC["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    content = response.get("content", {})
    return content.get("application/json", {}).get("schema")


def check(path: str, method: str, status: int, body) -> None:
    schema = response_schema(path, method, status)
    if schema is not None and isinstance(body, (dict, list)):
        Draft202012Validator(rooted(schema), registry=REGISTRY).validate(body)


def rooted(schema: dict) -> dict:
    if "$ref" in schema:
        return {"$ref": "urn:api" + schema["$ref"]}
    return {"$id": "urn:inline", **_rebase(schema)}


def _rebase(node):
    if isinstance(node, dict):
        return {k: ("urn:api" + v if k == "$ref" else _rebase(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_rebase(v) for v in node]
    return node
