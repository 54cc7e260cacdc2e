"""Outbound TLS of http tools on the real binary, called through the official Python SDK client.

An HTTPS server on loopback has a certificate from a private CA and requires a client
certificate from another private CA (mTLS). Tools trust the CA and present the client
certificate from Secrets (`tls: {caSecret, clientCertSecret}`, read here from `--secrets
dir:`). The server answers with the client certificate's common name. Without the CA, or
without the client certificate, the call fails. Rotating the client certificate Secret changes
what the next call presents, with no restart."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import shutil
import ssl
import subprocess
import tempfile
import threading
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import BIN, JsonHandler, free_port, wait_until
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from mcp import Client


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca(cn: str):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def issue(ca, cn: str, server: bool):
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH if server else x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    )
    if server:
        b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return b.sign(ca_key, hashes.SHA256()), key


def pem_cert(c) -> bytes:
    return c.public_bytes(serialization.Encoding.PEM)


def pem_key(k) -> bytes:
    return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def write_secret(root: Path, name: str, files: dict[str, bytes]) -> None:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    for key, value in files.items():
        tmp = d / f".{key}.tmp"
        tmp.write_bytes(value)
        tmp.replace(d / key)


class Who(JsonHandler):
    def do_GET(self):  # noqa: N802 - http.server naming
        peer = self.connection.getpeercert()
        cn = dict(x[0] for x in peer["subject"])["commonName"] if peer else None
        self.reply_json({"client": cn})


@pytest.fixture()
def pki(tmp_path):
    server_ca, client_ca = make_ca("server CA"), make_ca("client CA")
    cert, key = issue(server_ca, "127.0.0.1", server=True)
    (tmp_path / "server.crt").write_bytes(pem_cert(cert))
    (tmp_path / "server.key").write_bytes(pem_key(key))
    (tmp_path / "client-ca.crt").write_bytes(pem_cert(client_ca[0]))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    ctx.load_verify_locations(tmp_path / "client-ca.crt")
    ctx.verify_mode = ssl.CERT_REQUIRED
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Who)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield {"port": srv.server_address[1], "server_ca": server_ca, "client_ca": client_ca}
    srv.shutdown()


@pytest.fixture()
def quiver(pki):
    tmp = Path(tempfile.mkdtemp(prefix="quiver-tls-"))
    secrets = tmp / "secrets"
    write_secret(secrets, "corp-ca", {"ca.crt": pem_cert(pki["server_ca"][0])})
    # A ConfigMap CA bundle, as the dir: source reads one (the kube: source watches the ConfigMap).
    write_secret(secrets, "configmap:corp-bundle", {"ca.crt": pem_cert(pki["server_ca"][0])})
    c, k = issue(pki["client_ca"], "client-1", server=False)
    write_secret(secrets, "client-tls", {"tls.crt": pem_cert(c), "tls.key": pem_key(k)})
    url = f"https://127.0.0.1:{pki['port']}/who"
    config = tmp / "tools.yaml"
    config.write_text(f"""
tools:
  - {{name: mtls, handler: {{http: {{url: "{url}", tls: {{caSecret: corp-ca, clientCertSecret: client-tls}}}}}}}}
  - {{name: ca-only, handler: {{http: {{url: "{url}", tls: {{caSecret: corp-ca}}}}}}}}
  - {{name: public-roots, handler: {{http: {{url: "{url}"}}}}}}
  - {{name: bundle-mtls, handler: {{http: {{url: "{url}", tls: {{caConfigMap: corp-bundle, clientCertSecret: client-tls}}}}}}}}
""")
    port, admin = free_port(), free_port()
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen(
        [str(BIN), "--config", f"file:{config}", "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}",
         "--secrets", f"dir:{secrets}"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=2).status == 200)
        yield {"url": f"http://127.0.0.1:{port}/mcp", "secrets": secrets}
    finally:
        proc.terminate()
        proc.wait(timeout=5)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


async def call(url: str, tool: str):
    async with Client(url) as c:
        return await c.call_tool(tool, {})


def test_private_ca_and_client_certificates_from_secrets(pki, quiver):
    r = asyncio.run(call(quiver["url"], "mtls"))
    assert (r.is_error, json.loads(r.content[0].text)) == (False, {"client": "client-1"})

    r = asyncio.run(call(quiver["url"], "ca-only"))
    assert r.is_error, "the server requires a client certificate"
    assert "request to https://127.0.0.1" in r.content[0].text
    r = asyncio.run(call(quiver["url"], "public-roots"))
    assert r.is_error and "certificate" in r.content[0].text.lower(), r.content[0].text
    # The same CA from a ConfigMap bundle; a bundle of another CA is refused.
    r = asyncio.run(call(quiver["url"], "bundle-mtls"))
    assert (r.is_error, json.loads(r.content[0].text)) == (False, {"client": "client-1"})
    write_secret(quiver["secrets"], "configmap:corp-bundle", {"ca.crt": pem_cert(make_ca("another CA")[0])})
    wait_until(lambda: asyncio.run(call(quiver["url"], "bundle-mtls")).is_error)

    # Rotation: the next call presents the new certificate.
    c, k = issue(pki["client_ca"], "client-2", server=False)
    write_secret(quiver["secrets"], "client-tls", {"tls.crt": pem_cert(c), "tls.key": pem_key(k)})

    def rotated():
        r = asyncio.run(call(quiver["url"], "mtls"))
        return not r.is_error and json.loads(r.content[0].text) == {"client": "client-2"}

    wait_until(rotated)
    # Neither the key nor the certificates reach the caller.
    assert "PRIVATE KEY" not in asyncio.run(call(quiver["url"], "mtls")).content[0].text
