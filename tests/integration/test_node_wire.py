"""The Node SDK's wire types cannot drift from the hub's OpenAPI document.

``sdks/node/wire-contract.json`` is what the Node SDK relies on (operations, request
bodies, the fields of their schemas with TypeScript types, required fields, enums) and
``sdks/node/src/wire.ts`` is generated from it by ``sdks/node/scripts/gen-wire.mjs``.
This test builds the same summary from ``app.openapi()`` with the same rules, so a
change to a request model fails here, in Python, even where node is not installed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine

from reach.hub.api import create_app
from reach.hub.settings import load_settings
from reach.worker.context import HubContext

NODE = Path(__file__).resolve().parents[2] / "sdks" / "node"
GENERATOR = NODE / "scripts" / "gen-wire.mjs"


def _js_list(name: str) -> list[str]:
    """A string array constant of the generator (one source for both languages)."""
    text = GENERATOR.read_text()
    match = re.search(rf"export const {name} = \[(.*?)\];", text, re.S)
    assert match, f"{name} not found in {GENERATOR}"
    return re.findall(r'"([^"]+)"', match.group(1))


def _union(members: list[str]) -> str:
    return " | ".join(dict.fromkeys(members))


def ts_type(schema: Any) -> str:
    """The TypeScript type of a JSON schema: the rules of gen-wire.mjs's ``tsType``."""
    if not isinstance(schema, dict):
        return "unknown"
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if isinstance(schema.get("enum"), list):
        return _union([json.dumps(v) for v in schema["enum"]])
    if isinstance(schema.get("anyOf"), list):
        return _union([ts_type(s) for s in schema["anyOf"]])
    kind = schema.get("type")
    if kind == "string":
        return "string"
    if kind in ("integer", "number"):
        return "number"
    if kind in ("boolean", "null"):
        return str(kind)
    if kind == "array":
        return f"Array<{ts_type(schema.get('items'))}>"
    if kind == "object":
        extra = schema.get("additionalProperties")
        return f"Record<string, {ts_type(extra) if isinstance(extra, dict) else 'unknown'}>"
    return "unknown"


def _refs(schema: Any, out: set[str]) -> None:
    if isinstance(schema, list):
        for item in schema:
            _refs(item, out)
    elif isinstance(schema, dict):
        for key, value in schema.items():
            if key == "$ref" and isinstance(value, str):
                out.add(value.rsplit("/", 1)[-1])
            else:
                _refs(value, out)


def summarize(doc: dict[str, Any]) -> dict[str, Any]:
    """gen-wire.mjs's ``summarize``, in Python."""
    schemas = doc.get("components", {}).get("schemas", {})
    operations: dict[str, Any] = {}
    wanted = set(_js_list("EXTRA_SCHEMAS"))
    for op in _js_list("OPERATIONS"):
        method, path = op.split(" ")
        spec = doc.get("paths", {}).get(path, {}).get(method.lower())
        if not spec:
            operations[op] = None
            continue
        query = sorted(p["name"] for p in spec.get("parameters", []) if p.get("in") == "query")
        body = spec.get("requestBody", {}).get("content", {}).get("application/json", {})
        schema = body.get("schema")
        if schema:
            _refs(schema, wanted)
        operations[op] = {"query": query, "body": ts_type(schema) if schema else None}
    queue = list(wanted)
    while queue:
        found: set[str] = set()
        _refs(schemas.get(queue.pop()), found)
        for name in found - wanted:
            wanted.add(name)
            queue.append(name)
    types: dict[str, Any] = {}
    for name in sorted(wanted):
        s = schemas.get(name)
        if s is None:
            types[name] = None
        elif isinstance(s.get("enum"), list):
            types[name] = {"enum": s["enum"]}
        else:
            props = {field: ts_type(fs) for field, fs in s.get("properties", {}).items()}
            types[name] = {"properties": props, "required": sorted(s.get("required", []))}
    return {"operations": operations, "schemas": types}


def _openapi(tmp_path: Path) -> dict[str, Any]:
    url = f"sqlite:///{tmp_path / 'reach.db'}"
    env = {"REACH_DATABASE_URL": url, "REACH_HOME": str(tmp_path)}
    engine = create_engine(url)
    try:
        ctx = HubContext(settings=load_settings(environ=env), engine=engine)
        return create_app(ctx).openapi()
    finally:
        engine.dispose()


def test_contract_matches_the_hubs_openapi_document(tmp_path: Path) -> None:
    committed = json.loads((NODE / "wire-contract.json").read_text())
    assert summarize(_openapi(tmp_path)) == committed, (
        "the hub's OpenAPI document changed under the Node SDK: regenerate with "
        "`cd sdks/node && node scripts/gen-wire.mjs <openapi.json or hub URL>`"
    )


def test_every_operation_and_schema_exists(tmp_path: Path) -> None:
    contract = summarize(_openapi(tmp_path))
    assert all(v is not None for v in contract["operations"].values()), contract["operations"]
    assert all(v is not None for v in contract["schemas"].values()), contract["schemas"]
    assert "SubmitRequest" in contract["schemas"]


def test_wire_ts_declares_the_contract() -> None:
    """src/wire.ts holds each schema with exactly the contract's fields and optionality."""
    committed = json.loads((NODE / "wire-contract.json").read_text())
    text = (NODE / "src" / "wire.ts").read_text()
    for name, schema in committed["schemas"].items():
        if "enum" in schema:
            alias = re.search(rf"^export type {name} = (.*);$", text, re.M)
            assert alias, name
            assert alias.group(1) == " | ".join(json.dumps(v) for v in schema["enum"])
            continue
        block = re.search(rf"^export interface {name} \{{\n(.*?)^\}}", text, re.M | re.S)
        assert block, f"interface {name} missing from wire.ts"
        fields = dict(re.findall(r"^  (\w+\??): (.*);$", block.group(1), re.M))
        expected = {
            (f if f in schema["required"] else f + "?"): t for f, t in schema["properties"].items()
        }
        assert fields == expected, name


def test_a_drift_is_caught(tmp_path: Path) -> None:
    """A field renamed in the document no longer matches the committed contract."""
    doc = _openapi(tmp_path)
    props = doc["components"]["schemas"]["SubmitRequest"]["properties"]
    props["deadline_ms"] = props.pop("timeout_ms")
    committed = json.loads((NODE / "wire-contract.json").read_text())
    assert summarize(doc) != committed
