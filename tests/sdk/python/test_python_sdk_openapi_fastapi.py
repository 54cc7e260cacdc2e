"""An `openapi` source over a real web service: a FastAPI app (servers/fastapi_pets.py) served
by uvicorn on loopback, whose own OpenAPI 3.1 document quiver-server fetches from
`/openapi.json`. The official Python client lists the tools made from it and calls each
operation; the test checks what the tool answered and what the app actually received."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

import pytest
from conftest import start_server, stop, wait_until
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

sys.path.insert(0, str(Path(__file__).parent / "servers"))
import fastapi_pets  # noqa: E402
import uvicorn  # noqa: E402

KEY = "pets-key-0123456789"


@pytest.fixture()
def pets():
    """The FastAPI app under uvicorn on an ephemeral loopback port (bound here, so no race)."""
    app = fastapi_pets.app(KEY)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    t = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: urllib.request.urlopen(f"{base}/openapi.json", timeout=2).status == 200)
    yield base, app.state.seen
    srv.should_exit = True
    t.join(timeout=10)
    sock.close()


@pytest.fixture()
def quiver(pets):
    base, _ = pets
    tmp = Path(tempfile.mkdtemp(prefix="quiver-fastapi-"))
    (tmp / "secrets" / "pets").mkdir(parents=True)
    (tmp / "secrets" / "pets" / "key").write_text(KEY)
    # FastAPI's document names no servers: the calls of `pets` go where the document is served,
    # an origin the author allows (a fetched document carries credentials only to one), and
    # `keyless` names its `server`. The document's APIKeyHeader scheme reads its key from a
    # Secret; `keyless` maps no scheme, so its calls carry none.
    (tmp / "tools.yaml").write_text(f"""
openapi:
  - name: pets
    url: {base}/openapi.json
    fetch: {{allowHttp: true}}
    allowedOrigins: [{base}]
    security: {{APIKeyHeader: {{secret: pets, key: key}}}}
  - name: keyless
    url: {base}/openapi.json
    fetch: {{allowHttp: true}}
    server: {base}
    operations: {{paths: ["/pets/{{pet_id}}"], methods: [get]}}
    tools: {{prefix: keyless_}}
""")
    sp = start_server(tmp / "tools.yaml", tmp / "server.log", "--secrets", f"dir:{tmp / 'secrets'}")
    try:
        wait_until(lambda: sp.status()["ready"])
        yield sp.url
    finally:
        stop(sp.proc)
        if sp.proc.returncode not in (0, -15):
            print((tmp / "server.log").read_text())
        shutil.rmtree(tmp, ignore_errors=True)


def run(url: str, work):
    async def go():
        async with Client(streamable_http_client(url)) as c:
            return await work(c)

    return asyncio.run(go())


def test_tools_are_made_from_the_apps_own_document(quiver):
    tools = {t.name: t for t in run(quiver, lambda c: c.list_tools(cache_mode="bypass")).tools}
    assert sorted(tools) == ["addNote", "createPet", "deletePet", "getBlob", "getFile", "getPet",
                            "keyless_getPet", "listPets", "putLabel"]

    create = tools["createPet"].input_schema
    assert create["required"] == ["body"] and create["additionalProperties"] is False
    assert create["properties"]["body"] == {"$ref": "#/$defs/PetIn"}
    # Only the components the operation reaches, nested models and the enum included.
    assert sorted(create["$defs"]) == ["Address", "Kind", "Owner", "PetIn"]
    pet_in = create["$defs"]["PetIn"]
    assert pet_in["properties"]["owner"] == {"anyOf": [{"$ref": "#/$defs/Owner"}, {"type": "null"}]}
    assert pet_in["properties"]["name"]["maxLength"] == 40 and pet_in["required"] == ["name", "kind"]
    assert create["$defs"]["Owner"]["properties"]["address"] == {"$ref": "#/$defs/Address"}
    assert create["$defs"]["Kind"]["enum"] == ["cat", "dog", "bird"]
    # The answer's schema is the Pet component itself, with what it reaches.
    out = tools["createPet"].output_schema
    assert out["type"] == "object" and "id" in out["required"] and sorted(out["$defs"]) == ["Address", "Kind", "Owner"]

    listing = tools["listPets"].input_schema
    assert listing["properties"]["tag"]["type"] == "array" and listing["properties"]["tag"]["items"] == {"type": "string"}
    assert listing["properties"]["limit"]["anyOf"] == [{"type": "integer"}, {"type": "null"}]
    assert "required" not in listing
    assert listing["properties"]["x-request-id"]["anyOf"] == [{"type": "string"}, {"type": "null"}]
    assert tools["getPet"].input_schema["required"] == ["pet_id"]
    note = tools["addNote"].input_schema
    assert sorted(note["required"]) == ["body", "pet_id"] and note["properties"]["body"] == {"$ref": "#/$defs/Body_addNote"}
    assert note["$defs"]["Body_addNote"]["properties"]["rating"]["maximum"] == 5

    # A model in both a request and an answer: two components, `-` in their names.
    label = tools["putLabel"]
    assert label.input_schema["properties"]["body"] == {"$ref": "#/$defs/Label-Input"}
    assert "upper" not in label.input_schema["$defs"]["Label-Input"]["properties"]
    assert sorted(label.output_schema["required"]) == ["text", "upper"] and "$defs" not in label.output_schema

    annotations = {n: t.annotations for n, t in tools.items()}
    assert annotations["listPets"].read_only_hint is True and annotations["getFile"].read_only_hint is True
    assert annotations["deletePet"].destructive_hint is True and annotations["deletePet"].idempotent_hint is True
    assert annotations["createPet"].read_only_hint is False and annotations["createPet"].idempotent_hint is False
    assert annotations["putLabel"].idempotent_hint is True and annotations["putLabel"].read_only_hint is False
    assert tools["listPets"].description == "List pets, by tag"


def test_each_operation_reaches_the_app_as_declared(quiver, pets):
    _, seen = pets
    rex = {"name": "Rex", "kind": "dog", "tags": ["good", "old"],
           "owner": {"name": "Ana", "address": {"street": "Main 1", "city": "Oslo"}}}

    async def calls(c):
        out = {"created": await c.call_tool("createPet", {"body": rex})}
        out["tom"] = await c.call_tool("createPet", {"body": {"name": "Tom", "kind": "cat", "tags": ["young"]}})
        out["listed"] = await c.call_tool("listPets", {"tag": ["old", "new"], "limit": 5, "x-request-id": "r-1"})
        out["got"] = await c.call_tool("getPet", {"pet_id": 1})
        out["missing"] = await c.call_tool("getPet", {"pet_id": 99})
        out["note"] = await c.call_tool("addNote", {"pet_id": 1, "body": {"text": "likes walks & naps", "rating": 5, "labels": ["a b", "ü"]}})
        out["file"] = await c.call_tool("getFile", {"name": "my file #1?&=ü%"})
        out["deleted"] = await c.call_tool("deletePet", {"pet_id": 2})
        out["label"] = await c.call_tool("putLabel", {"label_id": 7, "body": {"text": "shy"}})
        return out

    r = run(quiver, calls)
    by_path = {(s["method"], s["raw_path"]): s for s in seen}

    # JSON body: sent as JSON with the key from the Secret; the 201 answer is structured.
    created = r["created"]
    assert not created.is_error, created.content[0].text
    assert created.structured_content == {**rex, "id": 1, "owner": {"name": "Ana", "email": None,
                                          "address": {"street": "Main 1", "city": "Oslo", "postcode": None}}}
    sent = seen[0]
    assert (sent["method"], sent["raw_path"], sent["query"]) == ("POST", "/pets", "")
    assert json.loads(sent["body"]) == rex and sent["headers"]["content-type"] == "application/json"
    assert sent["headers"]["x-api-key"] == KEY

    # Query array exploded (`tag=old&tag=new`), the Optional integer as it is.
    listed = r["listed"]
    assert not listed.is_error, listed.content[0].text
    assert listed.structured_content["count"] == 1 and listed.structured_content["pets"][0]["name"] == "Rex"
    assert by_path[("GET", "/pets")]["query"] == "tag=old&tag=new&limit=5"
    assert by_path[("GET", "/pets")]["headers"]["x-request-id"] == "r-1"

    assert r["got"].structured_content["name"] == "Rex"
    # 404 with FastAPI's detail: a tool error naming the status, with the answer's body.
    missing = r["missing"]
    assert missing.is_error and "404" in missing.content[0].text and "no pet 99" in missing.content[0].text
    assert ("GET", "/pets/99") in by_path

    # Form body: urlencoded, the array repeated; FastAPI decoded it back to what was given.
    note = r["note"]
    assert not note.is_error, note.content[0].text
    assert note.structured_content == {"pet_id": 1, "text": "likes walks & naps", "rating": 5, "labels": ["a b", "ü"]}
    form = by_path[("POST", "/pets/1/notes")]
    assert form["headers"]["content-type"] == "application/x-www-form-urlencoded"
    pairs = form["body"].split("&")
    assert sorted(pairs) == ["labels=%C3%BC", "labels=a%20b", "rating=5", "text=likes%20walks%20%26%20naps"]
    assert pairs.index("labels=a%20b") < pairs.index("labels=%C3%BC"), "the array's order is kept"

    # The path parameter is percent-encoded into its one segment and decoded by the app.
    assert r["file"].structured_content == {"name": "my file #1?&=ü%", "length": 15}
    assert ("GET", "/files/my%20file%20%231%3F%26%3D%C3%BC%25") in by_path

    deleted = r["deleted"]
    assert not deleted.is_error, deleted.content[0].text
    assert ("DELETE", "/pets/2") in by_path
    assert r["label"].structured_content == {"text": "shy", "upper": "SHY"}
    assert json.loads(by_path[("PUT", "/labels/7")]["body"]) == {"text": "shy"}
    assert all(s["headers"].get("x-api-key") == KEY for s in seen)


def test_a_value_cannot_leave_its_path_segment(quiver, pets):
    _, seen = pets

    async def calls(c):
        return [await c.call_tool(*call) for call in
                [("getFile", {"name": "a/b"}), ("getFile", {"name": ".."}), ("getBlob", {"key": "a/b c"})]]

    slash, dots, blob = run(quiver, calls)
    # `/` stays inside the segment as %2F; Starlette decodes it before routing, so only a
    # `{key:path}` route (its document still says `{key}`) takes it.
    assert [s["raw_path"] for s in seen] == ["/files/a%2Fb", "/blobs/a%2Fb%20c"]
    assert slash.is_error and "404" in slash.content[0].text
    assert blob.structured_content == {"name": "a/b c", "length": 5}
    # `..` would walk up: refused before any request.
    assert dots.is_error and "`..`" in dots.content[0].text


def test_without_the_key_the_app_refuses(quiver, pets):
    _, seen = pets
    refused = run(quiver, lambda c: c.call_tool("keyless_getPet", {"pet_id": 1}))
    assert refused.is_error
    text = refused.content[0].text
    # FastAPI's APIKeyHeader answers a missing key with 401 (403 in older releases).
    assert ("401" in text or "403" in text) and "Not authenticated" in text, text
    assert len(seen) == 1 and "x-api-key" not in seen[0]["headers"]
