"""Fixtures: a real quiver-server process on loopback ports, driven by the official MCP SDK."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(os.environ.get("QUIVER_SERVER_BIN", ROOT / "target" / "debug" / "quiver-server"))


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port nobody listens on, never one handed out before in this session: a port
    picked for a process that has not bound it yet is still free, and the next pick must not
    get it (a server once took its upstream's port as its admin port, and the upstream then
    answered 404)."""
    for _ in range(1000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no loopback port left that was not handed out already")


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02):
    """Polls `predicate` until it returns a truthy value or `timeout` passes."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - the condition is not met yet
            last_error = e
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s (last error: {last_error})")


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet request handler that answers JSON."""

    def reply_json(self, doc) -> None:
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Upstream(JsonHandler):
    """A tiny JSON API for the http handler to call."""

    def do_GET(self):  # noqa: N802 - http.server naming
        self.reply_json({"path": self.path, "tempC": 21})


@pytest.fixture(scope="session")
def upstream():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def toolset(upstream_url: str) -> str:
    return f"""
apiVersion: quiver.dev/v1alpha1
kind: ToolSet
server: {{name: sdk-test, version: 2.0.0, pageSize: 2}}
tools:
  - {{name: add, description: Add two numbers, handler: {{builtin: add}}}}
  - {{name: greet, input: {{name: string}}, handler: {{template: "Hello {{{{name}}}}!"}}}}
  - name: add-then-greet
    input: {{a: number, b: number}}
    handler: {{pipeline: [{{tool: add}}, {{tool: greet, input: {{name: "{{{{steps.0.text}}}}"}}}}]}}
  - {{name: word-count, input: {{text: string}}, handler: {{exec: {{command: [/usr/bin/wc, -w], stdin: "{{{{text}}}}"}}}}}}
  - {{name: weather, input: {{city: string}}, handler: {{http: {{url: "{upstream_url}/weather?city={{{{city}}}}", timeout: 2s}}}}}}
resources:
  - {{uri: "doc://readme", name: readme, text: "read me"}}
  - {{uriTemplate: "greeting://{{name}}", name: greeting, text: "Hi {{{{name}}}}"}}
prompts:
  - {{name: summarize, arguments: [{{name: topic, required: true}}], messages: [{{role: user, text: "Summarize {{{{topic}}}}"}}]}}
"""


class ServerProcess:
    def __init__(self, config: Path, port: int, admin: int, proc: subprocess.Popen):
        self.config, self.port, self.admin, self.proc = config, port, admin, proc
        self.url = f"http://127.0.0.1:{port}/mcp"

    def status(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}/status", timeout=2) as r:
            return json.load(r)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}/metrics", timeout=2) as r:
            return r.read().decode()


def start_server(config: Path, log: Path, *flags: str, env: dict | None = None) -> ServerProcess:
    """Starts the server binary on free loopback ports serving `config`, output to `log`."""
    port, admin = free_port(), free_port()
    proc = subprocess.Popen(
        [str(BIN), "--config", f"file:{config}", *flags, "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}"],
        stdout=open(log, "w"),  # noqa: SIM115 - the child keeps it open
        stderr=subprocess.STDOUT,
        env=env,
    )
    return ServerProcess(config, port, admin, proc)


def stop(*procs: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 5 s."""
    for p in procs:
        p.terminate()
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


@pytest.fixture()
def server(upstream):
    assert BIN.exists(), f"build the server first: {BIN} (cargo build -p quiver-server)"
    tmp = Path(tempfile.mkdtemp(prefix="quiver-sdk-"))
    config = tmp / "tools.yaml"
    config.write_text(toolset(upstream))
    sp = start_server(config, tmp / "server.log")
    proc = sp.proc
    try:
        wait_until(lambda: sp.status()["ready"])
        yield sp
    finally:
        stop(proc)
        if proc.returncode not in (0, -15):
            print((tmp / "server.log").read_text())
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture()
def stdio_config(upstream):
    tmp = Path(tempfile.mkdtemp(prefix="quiver-stdio-"))
    config = tmp / "tools.yaml"
    config.write_text(toolset(upstream))
    yield config
    shutil.rmtree(tmp, ignore_errors=True)


class Issuer:
    """An OIDC issuer on loopback: discovery document and JWK set, keys swappable."""

    def __init__(self):
        self.keys: dict[str, rsa.RSAPrivateKey] = {}
        self.jwks_fetches = 0
        issuer = self

        class Handler(JsonHandler):
            def do_GET(self):  # noqa: N802 - http.server naming
                if self.path == "/.well-known/openid-configuration":
                    doc = {"issuer": issuer.url, "jwks_uri": f"{issuer.url}/jwks"}
                elif self.path == "/jwks":
                    issuer.jwks_fetches += 1
                    doc = {"keys": [issuer.jwk(kid) for kid in list(issuer.keys)]}
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.reply_json(doc)

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def add_key(self, kid: str) -> None:
        self.keys[kid] = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwk(self, kid: str) -> dict:
        doc = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.keys[kid].public_key()))
        return {**doc, "kid": kid, "use": "sig", "alg": "RS256"}

    def token(self, kid: str, audience: str, **claims) -> str:
        now = int(time.time())
        body = {"iss": self.url, "aud": audience, "sub": "alice", "iat": now, "exp": now + 300, **claims}
        return jwt.encode(body, self.keys[kid], algorithm="RS256", headers={"kid": kid})


@pytest.fixture()
def issuer():
    """A loopback OIDC issuer with one signing key, `k1`."""
    i = Issuer()
    i.add_key("k1")
    yield i
    i.srv.shutdown()
