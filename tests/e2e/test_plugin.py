"""`kubectl quiver` on kind (the plugin binary scripts/e2e.sh builds and puts on PATH as
`kubectl-quiver`, found by kubectl as a plugin), and what the operator adds for several
replicas: the state-key Secret every replica signs `requestState` with (a retry answered by
the other pod completes; deleting the Secret rotates the key and rolls the pods), client-IP
session affinity, and the log level of the server pods."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import urllib.request

from conftest import Namespace, eventually

TOKEN = "e2e-plugin-token-0123456789"

SERVER = {
    "apiVersion": "quiver.dev/v1alpha1",
    "kind": "McpServer",
    "metadata": {"name": "kq"},
    "spec": {
        "replicas": 2,
        "logLevel": "info,quiver_server=debug",
        "sessionAffinity": {"timeoutSeconds": 600},
        "tools": [
            {"name": "add", "description": "Add two numbers", "handler": {"builtin": "add"}},
            {
                "name": "tag",
                "description": "Echo typed arguments",
                "inputSchema": {
                    "type": "object",
                    "properties": {
                        "n": {"type": "integer"},
                        "on": {"type": "boolean"},
                        "labels": {"type": "object"},
                        "word": {"type": "string"},
                    },
                    "required": ["n", "on", "labels", "word"],
                    "additionalProperties": False,
                },
                "handler": {"template": "{{n}}|{{on}}|{{labels.env}}|{{word}}"},
            },
            {
                "name": "form",
                "input": {},
                "handler": {
                    "elicit": {
                        "message": "Your name?",
                        "schema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
                    }
                },
            },
        ],
    },
}


def quiver(ns: Namespace, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`kubectl quiver -n NS ARGS`."""
    return ns.quiver(*args, check=check)


def test_kubectl_quiver_lists_calls_and_reports_status(ns: Namespace):
    ns.apply(SERVER)
    ns.wait_condition("kq", "Ready", "True")
    eventually("both pods on the current config", lambda: ns.get("qmcp", "kq")["status"].get("configLoadedReplicas") == 2)

    tools = quiver(ns, "tools", "kq").stdout
    assert "add   Add two numbers" in tools, tools
    assert sorted(t["name"] for t in json.loads(quiver(ns, "tools", "kq", "-o", "json").stdout)) == ["add", "form", "tag"]

    # Through the API server's service proxy (no token); values typed by the input schema.
    assert quiver(ns, "call", "kq", "add", "a=40", "b=2").stdout.strip() == "42"
    out = quiver(ns, "call", "kq", "tag", "n=7", "on=true", 'labels={"env":"prod"}', "word=007").stdout
    assert out.strip() == "7|true|prod|007", out
    out = quiver(ns, "call", "kq", "add", "b=2", "--json", '{"a": 1}', "-o", "json").stdout
    assert json.loads(out)["content"][0]["text"] == "3"

    bad = quiver(ns, "call", "kq", "tag", "n=seven", check=False)
    assert bad.returncode == 2 and "argument `n`: `seven` is not integer" in bad.stderr, bad
    bad = quiver(ns, "call", "kq", "nope", check=False)
    assert bad.returncode == 2 and "no tool `nope` (tools: add, form, tag)" in bad.stderr, bad
    missing = quiver(ns, "tools", "absent", check=False)
    assert missing.returncode == 3 and "not found" in missing.stderr, missing

    status = quiver(ns, "status", "kq")
    assert "Ready             True" in status.stdout, status.stdout
    pods = ns.ready_pods("kq", 2)
    for p in pods:
        line = next(line for line in status.stdout.splitlines() if line.startswith(p))
        assert " current " in line and " success " in line, status.stdout
    report = json.loads(quiver(ns, "status", "kq", "-o", "json").stdout)
    assert {p["name"] for p in report["pods"]} == set(pods)
    assert all(p["status"]["configHash"] == report["status"]["configHash"] for p in report["pods"])

    # A pod's log level is the McpServer's (`quiver_server=debug`): a connection that sends
    # garbage ends with an error the server logs at debug only.
    env = {e["name"]: e.get("value") for e in ns.get("deploy", "kq")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RUST_LOG"] == "info,quiver_server=debug"
    with ns.port_forward(f"pod/{pods[0]}", 8080) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            s.recv(1024)

    def debug_logged():
        logs = ns.k("logs", pods[0], "-c", "server")
        return '"level":"DEBUG"' in logs and "connection ended with an error" in logs

    eventually("the debug line in the pod's log", debug_logged, 30)


def test_a_token_goes_through_a_port_forward(ns: Namespace):
    ns.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "kq-clients"}, "stringData": {"tokens": TOKEN + "\n"}})
    guarded = json.loads(json.dumps(SERVER))
    guarded["spec"]["auth"] = {"bearerTokenSecretRef": {"name": "kq-clients", "key": "tokens"}}
    ns.apply(guarded)
    ns.wait_condition("kq", "Ready", "True")
    assert quiver(ns, "call", "kq", "add", "a=1", "b=2", "--token", TOKEN).stdout.strip() == "3"
    proc = subprocess.run(
        ["kubectl", "quiver", "-n", ns.name, "call", "kq", "add", "a=2", "b=2"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "QUIVER_TOKEN": TOKEN},
    )
    assert (proc.returncode, proc.stdout.strip()) == (0, "4"), proc.stderr
    denied = quiver(ns, "call", "kq", "add", "a=1", "b=2", "--via", "port-forward", check=False)
    assert denied.returncode == 4 and "401" in denied.stderr, denied
    refused = quiver(ns, "call", "kq", "add", "a=1", "--token", TOKEN, "--via", "proxy", check=False)
    assert refused.returncode == 2 and "Authorization" in refused.stderr, refused


def modern_call(port: int, extra: dict) -> dict:
    params = {
        "name": "form",
        "arguments": {},
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
        },
        **extra,
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/mcp",
        data=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}).encode(),
        headers={
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": "2026-07-28",
            "mcp-method": "tools/call",
            "mcp-name": "form",
        },
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def ask_here_answer_there(ns: Namespace, pods: list[str]) -> dict:
    """The question from the first pod, the answer to the second."""
    with ns.port_forward(f"pod/{pods[0]}", 8080) as a:
        asked = modern_call(a, {})["result"]
    assert asked["resultType"] == "input_required", asked
    key = next(iter(asked["inputRequests"]))
    with ns.port_forward(f"pod/{pods[1]}", 8080) as b:
        return modern_call(
            b,
            {"requestState": asked["requestState"], "inputResponses": {key: {"action": "accept", "content": {"name": "kind"}}}},
        )


def test_replicas_share_the_state_key_and_deleting_it_rotates_it(ns: Namespace):
    ns.apply(SERVER)
    ns.wait_condition("kq", "Ready", "True")
    secret = ns.get("secret", "kq-state-key")
    owner = secret["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("McpServer", "kq", True)
    assert secret["immutable"] is True and len(secret["data"]["key"]) == 88
    deploy = ns.get("deploy", "kq")
    template = deploy["spec"]["template"]
    assert template["metadata"]["annotations"]["quiver.dev/state-key-uid"] == secret["metadata"]["uid"]
    env = {e["name"]: e for e in template["spec"]["containers"][0]["env"]}
    assert env["QUIVER_STATE_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "kq-state-key", "key": "key", "optional": False}
    svc = ns.get("svc", "kq")["spec"]
    assert svc["sessionAffinity"] == "ClientIP" and svc["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"] == 600

    pods = ns.ready_pods("kq", 2)
    done = ask_here_answer_there(ns, pods)
    assert done["result"]["structuredContent"]["content"]["name"] == "kind", done

    old_uid = secret["metadata"]["uid"]
    ns.k("delete", "secret", "kq-state-key")
    new = eventually(
        "a new state-key Secret",
        lambda: (s := ns.get("secret", "kq-state-key")) and s["metadata"]["uid"] != old_uid and s,
        60,
    )
    assert new["data"]["key"] != secret["data"]["key"]
    eventually(
        "the pods rolled onto the new key",
        lambda: ns.get("deploy", "kq")["spec"]["template"]["metadata"]["annotations"]["quiver.dev/state-key-uid"]
        == new["metadata"]["uid"],
        60,
    )
    ns.wait_condition("kq", "Ready", "True")
    fresh = eventually(
        "two new ready pods",
        lambda: (names := ns.ready_pods("kq", 2)) and not set(names) & set(pods) and names,
        240,
    )
    done = ask_here_answer_there(ns, fresh)
    assert done["result"]["structuredContent"]["content"]["name"] == "kind", done
