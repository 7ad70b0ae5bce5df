"""The REST API reference, rendered from jupyter_tai_sandbox/api.yaml (OpenAPI 3.1) at build time.

``{tai-openapi}`` takes the file's path relative to the docs folder as its argument and renders the API's
description, then one section per path and method (HTML id ``rest-<method>-<path words>``, e.g.
``rest-api.html#rest-post-sessions-session_id-exec``) with its summary, description, parameters, request
body and responses, then the shared responses and schemas (ids ``rest-response-<Name>``,
``rest-schema-<Name>``) that the operations refer to. Descriptions are Markdown, as OpenAPI says, parsed
with the page's parser. No network: nothing is fetched, no JavaScript viewer.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from tai_nodes import inline, literal_text, section, table

METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "-", text).strip("-")


def operation_anchor(method: str, path: str) -> str:
    return f"rest-{method}-{_slug(path)}" if _slug(path) else f"rest-{method}-root"


class OpenApiDirective(SphinxDirective):
    required_arguments = 1
    has_content = False

    def run(self) -> list[nodes.Node]:
        _rel, abs_path = self.env.relfn2path(self.arguments[0], self.env.current_document.docname)
        path = Path(abs_path).resolve()
        self.env.note_dependency(str(path))
        self.spec = yaml.safe_load(path.read_text(encoding="utf-8"))
        document = self.state.document
        out: list[nodes.Node] = []
        info = self.spec.get("info", {})
        out.append(
            nodes.paragraph(
                "",
                "",
                nodes.Text(
                    f"{info.get('title', '')} {info.get('version', '')}, OpenAPI {self.spec.get('openapi')}; "
                ),
                nodes.Text("every path is under "),
                literal_text(", ".join(s.get("url", "") for s in self.spec.get("servers", [])) or "/"),
                nodes.Text("."),
            )
        )
        out += self.markdown(info.get("description", ""))
        summary_rows = []
        for route, item in self.spec.get("paths", {}).items():
            for method in METHODS:
                if method in item:
                    ref = nodes.reference("", "", internal=True, refid=operation_anchor(method, route))
                    ref += literal_text(f"{method.upper()} {route}")
                    summary_rows.append(([ref], item[method].get("summary", "")))
        out.append(table(["operation", "summary"], summary_rows, widths=[4, 6]))
        ops = section("Operations", "rest-operations", document)
        for route, item in self.spec.get("paths", {}).items():
            shared = item.get("parameters", [])
            for method in METHODS:
                if method in item:
                    ops += self.operation(method, route, item[method], shared)
        out.append(ops)
        components = self.spec.get("components", {})
        if components.get("responses"):
            sec = section("Shared responses", "rest-responses", document)
            for name, response in components["responses"].items():
                sub = section(name, f"rest-response-{name}", document)
                sub += self.markdown(response.get("description", ""))
                sub += self.content_table(response.get("content", {}))
                sec += sub
            out.append(sec)
        if components.get("schemas"):
            sec = section("Schemas", "rest-schemas", document)
            for name, schema in components["schemas"].items():
                sub = section(name, f"rest-schema-{name}", document)
                sub += self.schema_body(schema)
                sec += sub
            out.append(sec)
        return out

    # ------------------------------------------------------------ pieces

    def markdown(self, text: str) -> list[nodes.Node]:
        text = (text or "").strip()
        return list(self.parse_text_to_nodes(text)) if text else []

    def resolve(self, obj: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
        ref = obj.get("$ref") if isinstance(obj, dict) else None
        if not ref:
            return None, obj
        node: Any = self.spec
        for part in ref.lstrip("#/").split("/"):
            node = node[part]
        return ref.rsplit("/", 1)[-1], node

    def type_nodes(self, schema: Any) -> list[nodes.Node]:
        """A schema's type in a few words: a link for a named schema."""
        if not isinstance(schema, dict):
            return [nodes.Text("")]
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[-1]
            kind = schema["$ref"].split("/")[-2]
            ref = nodes.reference("", "", internal=True, refid=f"rest-{kind[:-1]}-{name}")
            ref += literal_text(name)
            return [ref]
        for key, joiner in (("oneOf", " | "), ("anyOf", " | "), ("allOf", " & ")):
            if key in schema:
                out: list[nodes.Node] = []
                for i, part in enumerate(schema[key]):
                    if i:
                        out.append(nodes.Text(joiner))
                    out += self.type_nodes(part)
                return out
        if "const" in schema:
            return [literal_text(repr(schema["const"]))]
        if "enum" in schema:
            return [nodes.Text("one of "), literal_text(", ".join(map(str, schema["enum"])))]
        kind = schema.get("type", "any")
        kind = " | ".join(kind) if isinstance(kind, list) else kind
        if kind == "array" and "items" in schema:
            return [nodes.Text("array of "), *self.type_nodes(schema["items"])]
        if schema.get("format"):
            kind += f" ({schema['format']})"
        return [literal_text(kind)]

    def schema_body(self, schema: dict[str, Any]) -> list[nodes.Node]:
        out: list[nodes.Node] = []
        out += self.markdown(schema.get("description", ""))
        parts = schema.get("allOf") or [schema]
        rows = []
        for part in parts:
            if "$ref" in part:
                out.append(
                    nodes.paragraph(
                        "", "", nodes.Text("Everything in "), *self.type_nodes(part), nodes.Text(", and:")
                    )
                )
                continue
            required = set(part.get("required", []))
            for name, prop in (part.get("properties") or {}).items():
                limits = [
                    f"{k} {prop[k]}"
                    for k in ("minimum", "maximum", "minLength", "maxLength", "maxItems")
                    if k in prop
                ]
                description = prop.get("description", "") if isinstance(prop, dict) else ""
                rows.append(
                    (
                        [literal_text(name)],
                        self.type_nodes(prop),
                        "yes" if name in required else "",
                        ", ".join(filter(None, [str(description).strip(), *limits])),
                    )
                )
        if rows:
            out.append(table(["field", "type", "required", "description"], rows, widths=[2, 3, 1, 6]))
        elif "$ref" not in str(parts) and not out:
            out.append(nodes.paragraph("", "", nodes.Text("Type: "), *self.type_nodes(schema)))
        return out

    def content_table(self, content: dict[str, Any]) -> list[nodes.Node]:
        if not content:
            return []
        rows = [
            ([literal_text(kind)], self.type_nodes(body.get("schema", {}))) for kind, body in content.items()
        ]
        return [table(["content type", "schema"], rows, widths=[2, 5])]

    def operation(self, method: str, route: str, op: dict[str, Any], shared: list[Any]) -> nodes.section:
        sec = section(f"{method.upper()} {route}", operation_anchor(method, route), self.state.document)
        if op.get("summary"):
            sec += nodes.paragraph("", "", nodes.strong(op["summary"], op["summary"]))
        sec += self.markdown(op.get("description", ""))
        params = [self.resolve(p)[1] for p in [*shared, *op.get("parameters", [])]]
        if params:
            rows = [
                (
                    [literal_text(p.get("name", ""))],
                    p.get("in", ""),
                    "yes" if p.get("required") else "",
                    self.type_nodes(p.get("schema", {})),
                    str(p.get("description", "")).strip(),
                )
                for p in params
            ]
            sec += nodes.rubric("", "Parameters")
            sec += table(["name", "in", "required", "type", "description"], rows, widths=[2, 1, 1, 2, 6])
        body = op.get("requestBody")
        if body:
            sec += nodes.rubric(
                "", "Request body" + (" (required)" if body.get("required") else " (optional)")
            )
            sec += self.markdown(body.get("description", ""))
            sec += self.content_table(body.get("content", {}))
        responses = op.get("responses", {})
        if responses:
            rows = []
            for status, response in responses.items():
                name, resolved = self.resolve(response)
                description: list[nodes.Node] = []
                if name:
                    ref = nodes.reference("", "", internal=True, refid=f"rest-response-{name}")
                    ref += literal_text(name)
                    description.append(ref)
                    description.append(nodes.Text(": "))
                description += inline(" ".join(str(resolved.get("description", "")).split()))
                schemas: list[nodes.Node] = []
                for i, (_kind, content) in enumerate((resolved.get("content") or {}).items()):
                    if i:
                        schemas.append(nodes.Text(", "))
                    schemas += self.type_nodes(content.get("schema", {}))
                rows.append(([literal_text(str(status))], description, schemas))
            sec += nodes.rubric("", "Responses")
            sec += table(["status", "meaning", "body"], rows, widths=[1, 7, 3])
        return sec


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("tai-openapi", OpenApiDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
