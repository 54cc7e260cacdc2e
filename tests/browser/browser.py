"""A real headless browser for the sign-in tests: Debian's chromium-headless-shell
(scripts/chromium.sh) driven over the Chrome DevTools Protocol, with nothing beyond the
standard library.

Each `Browser` is one Chromium process with a fresh profile of its own (so two users' cookies
never mix), one tab, no proxy, and a host resolver that resolves nothing itself: the tab
reaches 127.0.0.1 (and port-forwards there), the names `host_map` maps and the hosts
`allow_hosts` names, and nothing else.
Closing it (or leaving its `with` block, failed or not) kills its whole process group and
removes the profile.

    with Browser() as b:
        b.open("http://127.0.0.1:8080/")
        b.fill("#username", "carol")
        b.click("#kc-login", navigate=True)
        print(b.url, b.text, b.history)

`keycloak_sign_in(browser, url, user, password)` follows a URL to Keycloak's login form,
signs in, accepts the consent page if one appears and returns where the browser ended.

Tests elsewhere import this file by putting tests/browser on sys.path. The binary is
QUIVER_CHROMIUM if set, else Debian's chromium-headless-shell (see chromium_binary)."""

from __future__ import annotations

import atexit
import base64
import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import urllib.parse
import weakref

DEFAULT_TIMEOUT = 30.0
# How long one wait for a DevTools message lasts before a polled condition is checked again.
POLL = 0.05


class BrowserError(Exception):
    """The browser failed to start, answered a command with an error, or went away."""


class BrowserTimeout(BrowserError):
    """A condition did not hold within its time limit."""


class SignInError(Exception):
    """Keycloak's pages did not lead where a sign-in should: the message names what was seen."""

    def __init__(self, message: str, url: str, text: str):
        super().__init__(message)
        self.url = url
        self.text = text


def chromium_binary() -> str:
    """QUIVER_CHROMIUM, else Debian's chromium-headless-shell (the binary itself, not the
    shell script on PATH that runs it), else chromium-headless-shell or chromium on PATH."""
    given = os.environ.get("QUIVER_CHROMIUM")
    if given:
        return given
    if os.access("/usr/lib/chromium/chromium-headless-shell", os.X_OK):
        return "/usr/lib/chromium/chromium-headless-shell"
    for name in ("chromium-headless-shell", "chromium"):
        found = shutil.which(name)
        if found:
            return found
    raise BrowserError("no Chromium: run scripts/chromium.sh, or set QUIVER_CHROMIUM")


class _WebSocket:
    """The client side of RFC 6455, enough for DevTools: text messages, ping, close."""

    GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

    def __init__(self, port: int, path: str, timeout: float):
        self.timeout = timeout
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise BrowserError("DevTools closed the connection during the WebSocket handshake")
            self.buf += chunk
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        accept = base64.b64encode(hashlib.sha1((key + self.GUID).encode()).digest()).decode()
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        if " 101 " not in lines[0] + " " or headers.get("sec-websocket-accept") != accept:
            raise BrowserError(f"DevTools refused the WebSocket upgrade: {lines[0]}")
        self.parts: list[bytes] = []

    def send(self, text: str) -> None:
        self._send_frame(0x1, text.encode())

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        mask = os.urandom(4)
        # A client masks every frame (RFC 6455 section 5.3): XOR with the key repeated.
        key = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
        masked = (int.from_bytes(payload, "big") ^ key).to_bytes(n, "big")
        self.sock.settimeout(self.timeout)  # recv leaves whatever was left of its own wait
        self.sock.sendall(head + mask + masked)

    def _frame(self) -> tuple[bool, int, bytes] | None:
        """The first whole frame in the buffer (consumed), or None while it is incomplete."""
        if len(self.buf) < 2:
            return None
        b0, b1 = self.buf[0], self.buf[1]
        n, at = b1 & 0x7F, 2
        if n == 126:
            if len(self.buf) < 4:
                return None
            (n,), at = struct.unpack("!H", self.buf[2:4]), 4
        elif n == 127:
            if len(self.buf) < 10:
                return None
            (n,), at = struct.unpack("!Q", self.buf[2:10]), 10
        mask = b""
        if b1 & 0x80:
            mask, at = self.buf[at : at + 4], at + 4
        if len(self.buf) < at + n:
            return None
        payload, self.buf = self.buf[at : at + n], self.buf[at + n :]
        if mask:
            payload = bytes(c ^ mask[i % 4] for i, c in enumerate(payload))
        return bool(b0 & 0x80), b0 & 0x0F, payload

    def recv(self, timeout: float) -> str | None:
        """The next text message, or None when none arrived within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            frame = self._frame()
            if frame is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.sock.settimeout(left)
                try:
                    chunk = self.sock.recv(1 << 16)
                except (socket.timeout, TimeoutError):
                    return None
                if not chunk:
                    raise BrowserError("DevTools closed the connection")
                self.buf += chunk
                continue
            fin, opcode, payload = frame
            if opcode == 0x8:
                raise BrowserError("DevTools closed the connection")
            if opcode == 0x9:
                self._send_frame(0xA, payload)
            elif opcode in (0x0, 0x1):
                self.parts.append(payload)
                if fin:
                    text, self.parts = b"".join(self.parts).decode(), []
                    return text

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _live_members(pgid: int) -> list[int]:
    """The processes of group `pgid` that have not exited (zombies do not count: whether
    they are reaped depends on the machine's init)."""
    found = []
    for stat in os.listdir("/proc"):
        if not stat.isdigit():
            continue
        try:
            with open(f"/proc/{stat}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            found.append(int(stat))
    return found


_OPEN: "weakref.WeakSet[Browser]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for b in list(_OPEN):
        b.close()


class Browser:
    """One headless Chromium with a fresh profile and one tab, driven over DevTools.

    `host_map` maps host names to `IP` or `IP:PORT` (say, an Ingress host to a
    port-forward on 127.0.0.1); `allow_hosts` names further IP addresses (or names) the tab
    may reach as they are (say, the address of this machine's kind network where a test's
    Keycloak listens). Every other host fails with net::ERR_NAME_NOT_RESOLVED. `timeout`
    bounds every wait that is not given its own."""

    def __init__(self, binary: str | None = None, *, host_map: dict[str, str] | None = None,
                 allow_hosts: tuple[str, ...] = (), timeout: float = DEFAULT_TIMEOUT):
        self.timeout = timeout
        self.history: list[str] = []  # every document URL the tab requested, redirects included
        self.failures: list[str] = []  # "URL: net::ERR_..." for each of those that failed
        self._documents: dict[str, str] = {}  # request id -> URL, for those documents
        self._loader = ""  # the loader id of the document the tab shows
        self._loaded = ""  # that of the last document whose load event fired
        self._ws: _WebSocket | None = None
        self._proc: subprocess.Popen | None = None
        self._next_id = 0
        self._session = ""
        self._frame = ""
        self._dir = tempfile.mkdtemp(prefix="quiver-browser-")
        _OPEN.add(self)
        try:
            self._launch(binary or chromium_binary(), host_map or {}, allow_hosts)
        except BaseException:
            self.close()
            raise

    # --- life cycle ------------------------------------------------------------------------

    def _launch(self, binary: str, host_map: dict[str, str], allow_hosts: tuple[str, ...]) -> None:
        profile = os.path.join(self._dir, "profile")
        # The rules apply to IP literals as well: every host not excluded is unresolvable.
        rules = [f"MAP {host} {target}" for host, target in host_map.items()]
        rules.append("MAP * ~NOTFOUND")
        rules += [f"EXCLUDE {host}" for host in ("127.0.0.1", *allow_hosts)]
        args = [
            binary,
            "--headless",
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            "--no-proxy-server",
            f"--host-resolver-rules={', '.join(rules)}",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--disable-gpu",
            "--window-size=1280,1024",
            "about:blank",
        ]
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium's sandbox cannot run as root
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        with open(os.path.join(self._dir, "chromium.log"), "wb") as log:
            self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                          env=env, start_new_session=True)
        # Chromium writes its port and the browser's WebSocket path here once it listens.
        active = os.path.join(profile, "DevToolsActivePort")
        deadline = time.monotonic() + self.timeout
        lines: list[str] = []
        while len(lines) < 2:
            try:
                self._proc.wait(timeout=POLL)
                raise BrowserError(f"Chromium exited with {self._proc.returncode}:\n{self.log_tail()}")
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() > deadline:
                raise BrowserTimeout(f"Chromium wrote no DevToolsActivePort in {self.timeout} s:\n{self.log_tail()}")
            try:
                with open(active) as f:
                    lines = f.read().split()
            except FileNotFoundError:
                pass
        self._ws = _WebSocket(int(lines[0]), lines[1], self.timeout)
        pages = [t for t in self._call("Target.getTargets")["targetInfos"] if t["type"] == "page"]
        target = pages[0]["targetId"] if pages else self._call("Target.createTarget", url="about:blank")["targetId"]
        self._session = self._call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Network", "Runtime"):
            self._call(f"{domain}.enable", session=True)
        frame = self._call("Page.getFrameTree", session=True)["frameTree"]["frame"]
        self._frame, self._loader, self._loaded = frame["id"], frame["loaderId"], frame["loaderId"]

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(os.path.join(self._dir, "chromium.log"), errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def close(self) -> None:
        """Ends Chromium and every process it started, and removes the profile. Idempotent."""
        _OPEN.discard(self)
        if self._ws is not None:
            try:
                self._send("Browser.close")
            except (OSError, BrowserError):
                pass
            self._ws.close()
            self._ws = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            # Renderers and helpers share the group: none may outlive the browser, nor write
            # into the profile while it is removed.
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self._proc.wait()
            deadline = time.monotonic() + 10
            while _live_members(self._proc.pid) and time.monotonic() < deadline:
                time.sleep(POLL)
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        """The process (and process group) id of Chromium."""
        return self._proc.pid if self._proc else None

    @property
    def profile_dir(self) -> str:
        return self._dir

    # --- DevTools --------------------------------------------------------------------------

    def _send(self, method: str, session: bool = False, **params) -> int:
        if self._ws is None:
            raise BrowserError("the browser is closed")
        self._next_id += 1
        msg: dict = {"id": self._next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self._session
        self._ws.send(json.dumps(msg))
        return self._next_id

    def _call(self, method: str, session: bool = False, **params) -> dict:
        """Sends one command and returns its result, handling the events that come first."""
        want = self._send(method, session, **params)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            msg = self._receive(deadline - time.monotonic())
            if msg is not None and msg.get("id") == want:
                if "error" in msg:
                    raise BrowserError(f"{method}: {msg['error'].get('message')} {msg['error'].get('data', '')}".strip())
                return msg.get("result", {})
        raise BrowserTimeout(f"{method}: no answer from Chromium in {self.timeout} s")

    def _receive(self, timeout: float) -> dict | None:
        assert self._ws is not None
        raw = self._ws.recv(max(timeout, 0))
        if raw is None:
            return None
        msg = json.loads(raw)
        if "method" in msg and msg.get("sessionId") == self._session:
            self._event(msg["method"], msg.get("params", {}))
        return msg

    def _event(self, method: str, params: dict) -> None:
        main = params.get("frameId") == self._frame
        if method == "Network.requestWillBeSent" and params.get("type") == "Document" and main:
            self.history.append(params["request"]["url"])
            self._documents[params["requestId"]] = params["request"]["url"]
        elif method == "Network.loadingFailed" and params.get("requestId") in self._documents:
            if not params.get("canceled"):
                url = self._documents[params["requestId"]]
                self.failures.append(f"{url}: {params.get('errorText', 'failed')}")
        elif method == "Page.frameNavigated" and params["frame"]["id"] == self._frame:
            self._loader = params["frame"]["loaderId"]
        elif method == "Page.loadEventFired":
            # The tab's page, error pages included (Chromium commits one for a failed load).
            self._loaded = self._loader

    def _pump(self, deadline: float) -> None:
        """Handles the messages that arrive until `deadline` or for one poll interval."""
        self._receive(min(POLL, max(deadline - time.monotonic(), 0)))

    # --- pages -----------------------------------------------------------------------------

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (awaited if it is a promise)."""
        result = self._call("Runtime.evaluate", session=True, expression=expression,
                            returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(details.get("exception", {}).get("description") or details.get("text", "exception"))
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float | None = None):
        """Polls a JavaScript expression until it is truthy and returns its value. An
        expression that throws (its element is not there yet, or a navigation replaced the
        page while it ran) counts as not yet; the last exception is in the timeout's message."""
        deadline = time.monotonic() + (timeout or self.timeout)
        last = ""
        while True:
            try:
                value = self.evaluate(expression)
                if value:
                    return value
            except BrowserError as e:
                if self._ws is None:
                    raise
                last = f" (last it threw: {str(e).splitlines()[0]})"
            if time.monotonic() > deadline:
                raise BrowserTimeout(f"`{expression}` did not hold within {timeout or self.timeout} s{last}; "
                                     f"the tab is at {self.url}")
            self._pump(deadline)

    def wait_for_navigation(self, since: str, timeout: float | None = None) -> str:
        """Waits until the tab shows a document other than `since` (`page`, taken before the
        action that navigates) and it has loaded (an error page included); returns its URL."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while self._loader == since or self._loaded != self._loader:
            if time.monotonic() > deadline:
                raise BrowserTimeout(f"no page loaded within {timeout or self.timeout} s; the tab is at {self.url}")
            self._pump(deadline)
        return self.url

    @property
    def page(self) -> str:
        """An id of the document the tab shows (a new one for each navigation, a reload or
        the answer to a form included): see wait_for_navigation."""
        return self._loader

    def open(self, url: str, timeout: float | None = None) -> str:
        """Navigates the tab to `url`, follows its redirects, waits until the last page
        loaded (or its error page did: see `failures`), and returns the URL it ended at."""
        since = self._loader
        self._call("Page.navigate", session=True, url=url)
        return self.wait_for_navigation(since, timeout)

    def fill(self, selector: str, value: str) -> None:
        """Focuses the element `selector` names, clears it and types `value` into it."""
        found = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " if (!e) return false; e.focus(); e.value = ''; return true; })()"
        )
        if not found:
            raise BrowserError(f"no element matches {selector!r} at {self.url}")
        self._call("Input.insertText", session=True, text=value)

    def click(self, selector: str, *, navigate: bool = False, timeout: float | None = None) -> None:
        """Clicks the middle of the element `selector` names with the mouse, as a user
        would; with `navigate`, waits until the page that click leads to has loaded."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " if (!e) return null; e.scrollIntoView({block: 'center'});"
            " const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        if not box:
            raise BrowserError(f"no element matches {selector!r} at {self.url}")
        since = self._loader
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self._call("Input.dispatchMouseEvent", session=True, type=kind, x=box[0], y=box[1],
                       button="left", clickCount=1)
        if navigate:
            self.wait_for_navigation(since, timeout)

    def exists(self, selector: str) -> bool:
        return bool(self.evaluate(f"!!document.querySelector({json.dumps(selector)})"))

    @property
    def url(self) -> str:
        """The URL of the tab's current entry (the attempted URL when its load failed)."""
        history = self._call("Page.getNavigationHistory", session=True)
        return history["entries"][history["currentIndex"]]["url"]

    @property
    def text(self) -> str:
        """What the page shows: the body's rendered text."""
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    @property
    def title(self) -> str:
        return self.evaluate("document.title") or ""

    def screenshot(self, path: str, width: int = 1280, *, start: str | None = None,
                   max_height: int | None = None) -> None:
        """Saves a PNG of the page (beyond the viewport), `width` CSS pixels wide: all of it,
        or from the top of the element `start` names, and at most `max_height` pixels tall."""
        self._call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=800,
                   deviceScaleFactor=1, mobile=False)
        params: dict = {"format": "png", "captureBeyondViewport": True}
        if start or max_height:
            top = self.evaluate(
                f"(() => {{ const e = {json.dumps(start)} && document.querySelector({json.dumps(start)});"
                " return e ? e.getBoundingClientRect().top + window.scrollY : 0; })()") or 0
            page = self.evaluate("document.documentElement.scrollHeight") or 800
            height = max(1, min(page - top, max_height or page))
            params["clip"] = {"x": 0, "y": top, "width": width, "height": height, "scale": 1}
        shot = self._call("Page.captureScreenshot", session=True, **params)
        with open(path, "wb") as f:
            f.write(base64.b64decode(shot["data"]))

    def cookies(self) -> list[dict]:
        """The profile's cookies (name, value, domain, ...)."""
        return self._call("Storage.getCookies")["cookies"]


# --- Keycloak ---------------------------------------------------------------------------

_KEYCLOAK_PATH = re.compile(r"/realms/[^/]+/(protocol/openid-connect/|login-actions/)")
# What tells Keycloak's pages apart (its keycloak.v2 login theme).
_PAGE = """(() => ({
  login: !!document.querySelector('form#kc-form-login input#password'),
  consent: !!document.querySelector('#kc-oauth form input[name=accept], #kc-oauth form button[name=accept]'),
  error: [...document.querySelectorAll('[id^=input-error], .kc-feedback-text, #kc-error-message')]
           .map(e => e.innerText.trim()).filter(Boolean).join(' ')
}))()"""


@dataclasses.dataclass
class SignIn:
    url: str  # where the browser ended, outside Keycloak
    text: str  # that page's text
    steps: list[str]  # the Keycloak pages passed, in order: "login", "consent"
    history: list[str]  # every document URL of the sign-in, redirects included


def keycloak_sign_in(browser: Browser, start_url: str, username: str, password: str,
                     *, timeout: float | None = None) -> SignIn:
    """Opens `start_url`, signs in as `username` on Keycloak's login form, accepts a consent
    page if one appears, and returns where the browser ended once it left Keycloak. A
    session that is signed in already passes straight through (no steps).

    Raises SignInError, naming the URL and what the page said, when a Keycloak page is
    neither its login form nor a consent page (an error page, say), when the login form
    comes back after the password was sent (a wrong password), or when the last page
    failed to load."""
    first = len(browser.history)
    browser.open(start_url, timeout)
    steps: list[str] = []
    for _ in range(4):
        url = browser.url
        page = browser.evaluate(_PAGE) or {}
        if not _KEYCLOAK_PATH.search(urllib.parse.urlsplit(url).path) and not page.get("login"):
            _check_loaded(browser, url)
            return SignIn(url, browser.text, steps, browser.history[first:])
        if page.get("login") and "login" not in steps:
            if browser.exists("input#username"):
                browser.fill("input#username", username)
            browser.fill("input#password", password)
            browser.click("#kc-login", navigate=True, timeout=timeout)
            steps.append("login")
        elif page.get("consent") and "consent" not in steps:
            browser.click("#kc-oauth [name=accept]", navigate=True, timeout=timeout)
            steps.append("consent")
        elif page.get("login"):
            raise SignInError(f"Keycloak showed its login form again after {username}'s password was sent"
                              f" ({page.get('error') or 'no message'}) at {url}", url, browser.text)
        else:
            raise _unexpected(browser, url, steps)
    raise _unexpected(browser, browser.url, steps)


def _check_loaded(browser: Browser, url: str) -> None:
    """Raises SignInError when the page the sign-in ended at did not load."""
    failed = browser.evaluate("location.href.startsWith('chrome-error:')")
    if failed:
        error = browser.failures[-1] if browser.failures else "an error page"
        raise SignInError(f"the sign-in ended at {url}, which did not load: {error}", url, browser.text)


def _unexpected(browser: Browser, url: str, steps: list[str]) -> SignInError:
    text = browser.text
    summary = " ".join(text.split())[:300]
    return SignInError(
        f"expected Keycloak's login form, a consent page or a page outside Keycloak after"
        f" {steps or 'opening the link'}; saw {url} (title {browser.title!r}): {summary}",
        url, text)
