"""The headless browser of the sign-in tests (browser.py): first the driver against a small
local web server (redirects, forms, name resolution, clean shutdown), then real sign-ins at
Keycloak's realm `upstream` (scripts/idp.sh): authorization code with PKCE to a redirect URI
on 127.0.0.1, a wrong password, two users in two browsers, an error page.

Chromium comes from scripts/chromium.sh (or QUIVER_CHROMIUM). Keycloak is started once for
the module; set QUIVER_IDP_ENV to the `env` file of an instance started with
`scripts/idp.sh start DIR` to reuse it."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from browser import Browser, BrowserTimeout, SignInError, keycloak_sign_in

ROOT = Path(__file__).resolve().parents[2]
# scripts/idp/upstream-realm.json: a public client that requires PKCE (S256) and asks for
# consent, registered for http://127.0.0.1/callback (Keycloak accepts any port on loopback).
CLIENT = "loopback-app"


@pytest.fixture(scope="session", autouse=True)
def chromium():
    if not os.environ.get("QUIVER_CHROMIUM"):
        out = subprocess.run([str(ROOT / "scripts" / "chromium.sh")], check=True, timeout=900,
                             stdout=subprocess.PIPE, text=True)
        os.environ["QUIVER_CHROMIUM"] = out.stdout.strip()
    return os.environ["QUIVER_CHROMIUM"]


class Site:
    """A web server on 127.0.0.1 that records every request (path, Host, form body)."""

    def __init__(self):
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        site = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.answer(None)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
                self.answer(urllib.parse.parse_qs(body))

            def answer(self, form):
                url = urllib.parse.urlsplit(self.path)
                with site.lock:
                    site.requests.append({"path": url.path, "query": urllib.parse.parse_qs(url.query),
                                          "host": self.headers.get("Host"), "form": form})
                if url.path in site.REDIRECTS:
                    self.send_response(302)
                    self.send_header("Location", site.REDIRECTS[url.path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                page = site.PAGES.get(url.path, "<title>here</title><p>path {path}</p>").format(
                    path=url.path, form=json.dumps(form))
                body = page.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    REDIRECTS = {"/start": "/middle", "/middle": "/form"}
    PAGES = {
        "/form": """<title>form</title>
            <form method="post" action="/posted">
              <input id="name" name="name"><input id="secret" name="secret" type="password">
              <button id="go" type="submit" style="margin-top: 1500px">Send</button>
            </form>""",
        "/posted": "<title>posted</title><p>got {form}</p>",
    }

    def seen(self, path: str) -> list[dict]:
        with self.lock:
            return [r for r in self.requests if r["path"] == path]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def site():
    s = Site()
    yield s
    s.close()


# --- the driver ---------------------------------------------------------------------------


def test_open_follows_redirects_and_records_each_url(site):
    with Browser() as b:
        assert b.open(f"{site.url}/start") == f"{site.url}/form"
        assert b.history == [f"{site.url}/start", f"{site.url}/middle", f"{site.url}/form"]
        assert b.title == "form"
        assert b.failures == []


def test_fill_and_click_submit_a_form_as_a_user_would(site):
    with Browser() as b:
        b.open(f"{site.url}/form")
        b.fill("#name", "carol")
        b.fill("#secret", "first")
        b.fill("#secret", "s3cret & more")  # filling again replaces the value
        b.click("#go", navigate=True)  # below the fold: scrolled into view first
        assert b.url == f"{site.url}/posted"
        assert site.seen("/posted")[0]["form"] == {"name": ["carol"], "secret": ["s3cret & more"]}
        assert '"carol"' in b.text
        with pytest.raises(Exception, match="no element matches '#nothing'"):
            b.click("#nothing")


def test_names_resolve_only_through_host_map(site):
    with Browser(host_map={"app.quiver.test": f"127.0.0.1:{site.port}"}) as b:
        b.open("http://app.quiver.test/here")
        assert b.title == "here"
        assert site.seen("/here")[0]["host"] == "app.quiver.test"
        # Even a name the machine resolves itself, without a DNS server.
        b.open(f"http://localhost:{site.port}/there")
        assert b.failures == [f"http://localhost:{site.port}/there: net::ERR_NAME_NOT_RESOLVED"]
        assert site.seen("/there") == []


def test_the_environments_proxy_is_not_used(site, monkeypatch):
    proxy = Site()
    try:
        for var in ("http_proxy", "HTTP_PROXY", "all_proxy"):
            monkeypatch.setenv(var, proxy.url)
        # Chromium never sends 127.0.0.1 through a proxy: a mapped name shows what it would do.
        with Browser(host_map={"app.quiver.test": f"127.0.0.1:{site.port}"}) as b:
            b.open("http://app.quiver.test/direct")
            assert b.title == "here"
        assert site.seen("/direct") and proxy.requests == []
    finally:
        proxy.close()


def test_wait_for_is_bounded_and_says_where_the_tab_is(site):
    with Browser() as b:
        b.open(f"{site.url}/form")
        assert b.wait_for("document.querySelector('#go').textContent") == "Send"
        with pytest.raises(BrowserTimeout, match=f"the tab is at {site.url}/form"):
            b.wait_for("document.querySelector('#never')", timeout=0.5)
        with pytest.raises(BrowserTimeout, match="last it threw: TypeError"):
            b.wait_for("document.querySelector('#never').value", timeout=0.5)


def group_members(pgid: int) -> list[str]:
    """The live (not zombie) processes of a process group, from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after its ')'.
        state, _ppid, pgrp = text.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            found.append(text.split(" ", 1)[0])
    return found


def test_close_ends_every_process_and_removes_the_profile_even_after_a_failure(site):
    with pytest.raises(RuntimeError, match="the test failed"):
        with Browser() as b:
            pid, profile = b.pid, b.profile_dir
            b.open(f"{site.url}/form")
            assert len(group_members(pid)) > 1  # the browser, its renderer and helpers
            raise RuntimeError("the test failed")
    assert group_members(pid) == []
    assert not os.path.exists(profile)
    b.close()  # again: nothing left to do


# --- sign-ins at Keycloak -----------------------------------------------------------------


@pytest.fixture(scope="module")
def idp():
    given = os.environ.get("QUIVER_IDP_ENV")
    tmp = None
    if not given:
        tmp = Path(tempfile.mkdtemp(prefix="quiver-idp-"))
        subprocess.run([str(ROOT / "scripts" / "idp.sh"), "start", str(tmp)], check=True, timeout=900)
        given = str(tmp / "env")
    env = dict(line.split("=", 1) for line in Path(given).read_text().split())
    try:
        yield env["QUIVER_IDP_UPSTREAM_ISSUER"]
    finally:
        if tmp:
            subprocess.run([str(ROOT / "scripts" / "idp.sh"), "stop", str(tmp)], check=False, timeout=60)
            shutil.rmtree(tmp, ignore_errors=True)


class Authorization:
    """One authorization request of the public client: its state, PKCE pair and URL."""

    def __init__(self, issuer: str, redirect_uri: str, *, pkce: bool = True, prompt: str | None = None):
        self.issuer, self.redirect_uri = issuer, redirect_uri
        self.state = secrets.token_urlsafe(16)
        self.verifier = secrets.token_urlsafe(48)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(self.verifier.encode()).digest()).rstrip(b"=").decode()
        params = {"client_id": CLIENT, "response_type": "code", "scope": "openid",
                  "redirect_uri": redirect_uri, "state": self.state}
        if pkce:
            params |= {"code_challenge": challenge, "code_challenge_method": "S256"}
        if prompt:
            params["prompt"] = prompt
        self.url = f"{issuer}/protocol/openid-connect/auth?{urllib.parse.urlencode(params)}"

    def redeem(self, code: str) -> dict:
        """The token endpoint's answer for `code`, with this request's PKCE verifier."""
        form = {"grant_type": "authorization_code", "client_id": CLIENT, "code": code,
                "redirect_uri": self.redirect_uri, "code_verifier": self.verifier}
        req = urllib.request.Request(f"{self.issuer}/protocol/openid-connect/token",
                                     data=urllib.parse.urlencode(form).encode())
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.load(resp)

    def user(self, code: str) -> str:
        """Whose sign-in `code` is: the userinfo of the access token it redeems for."""
        token = self.redeem(code)["access_token"]
        req = urllib.request.Request(f"{self.issuer}/protocol/openid-connect/userinfo",
                                     headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.load(resp)["preferred_username"]


def callback_params(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in urllib.parse.parse_qs(urllib.parse.urlsplit(url).query).items()}


def test_carol_signs_in_with_pkce_and_the_code_reaches_the_redirect_uri(idp, site):
    # prompt=consent: Keycloak remembers a consent, and an instance may be reused.
    auth = Authorization(idp, f"{site.url}/callback", prompt="consent")
    with Browser() as b:
        done = keycloak_sign_in(b, auth.url, "carol", "carol-password")
    assert done.steps == ["login", "consent"]
    assert done.url.startswith(f"{site.url}/callback?")
    params = callback_params(done.url)
    assert params["state"] == auth.state
    assert params["iss"] == idp  # RFC 9207: the authorization server names itself
    # The browser went from the authorization endpoint through Keycloak's login and consent
    # actions to the redirect URI, which received the code once.
    assert done.history[0] == auth.url and done.history[-1] == done.url
    assert any("/login-actions/authenticate" in u for u in done.history)
    [hit] = site.seen("/callback")
    assert hit["query"]["code"] == [params["code"]] and hit["query"]["state"] == [auth.state]
    assert auth.user(params["code"]) == "carol"


def test_the_client_refuses_a_request_without_pkce(idp, site):
    auth = Authorization(idp, f"{site.url}/callback", pkce=False)
    with Browser() as b:
        done = keycloak_sign_in(b, auth.url, "carol", "carol-password")
    # Keycloak sends the error to the redirect URI without showing a login form.
    assert done.steps == []
    params = callback_params(done.url)
    assert (params["error"], params["state"]) == ("invalid_request", auth.state)
    assert "code_challenge_method" in params["error_description"]
    assert "code" not in params


def test_a_wrong_password_shows_the_login_form_again_with_an_error(idp, site):
    auth = Authorization(idp, f"{site.url}/callback", prompt="consent")
    with Browser() as b:
        with pytest.raises(SignInError, match="login form again after carol's password was sent .*Invalid username or password") as e:
            keycloak_sign_in(b, auth.url, "carol", "not-carols-password")
        assert "/login-actions/authenticate" in e.value.url
        assert b.exists("form#kc-form-login input#password")
        assert "Invalid username or password." in b.text
        assert site.seen("/callback") == []
        # The same form then takes the right password.
        b.fill("#password", "carol-password")
        b.click("#kc-login", navigate=True)
        b.click("#kc-oauth [name=accept]", navigate=True)
        params = callback_params(b.url)
    assert params["state"] == auth.state
    assert auth.user(params["code"]) == "carol"


def test_two_browsers_keep_two_users_sessions_apart(idp, site):
    redirect = f"{site.url}/callback"
    with Browser() as carols, Browser() as daves:
        for b, user in ((carols, "carol"), (daves, "dave")):
            auth = Authorization(idp, redirect, prompt="consent")
            done = keycloak_sign_in(b, auth.url, user, f"{user}-password")
            assert done.steps == ["login", "consent"]
            assert auth.user(callback_params(done.url)["code"]) == user
        # Signed in, each browser passes straight through Keycloak again, as its own user:
        # its profile holds that user's session and no other.
        for b, user in ((daves, "dave"), (carols, "carol")):
            auth = Authorization(idp, redirect)
            done = keycloak_sign_in(b, auth.url, "nobody", "no-password")
            assert done.steps == []
            assert callback_params(done.url)["state"] == auth.state
            assert auth.user(callback_params(done.url)["code"]) == user
        sessions = [{c["value"] for c in b.cookies() if c["name"].startswith("KEYCLOAK_")} for b in (carols, daves)]
        assert sessions[0] and sessions[1] and not sessions[0] & sessions[1]


def test_an_unregistered_redirect_uri_is_a_clear_error(idp, site):
    auth = Authorization(idp, f"{site.url.replace('127.0.0.1', 'localhost')}/callback")
    with Browser() as b:
        with pytest.raises(SignInError) as e:
            keycloak_sign_in(b, auth.url, "carol", "carol-password")
    message = str(e.value)
    assert "expected Keycloak's login form, a consent page or a page outside Keycloak" in message
    assert "Invalid parameter: redirect_uri" in message and auth.url in message
    assert site.requests == []
