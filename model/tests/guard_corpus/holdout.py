#!/usr/bin/env python3
"""Held-out labeled corpus for Quiver result guards.

Writes holdout.jsonl next to this file. Deterministic (fixed seed), standard
library only, synthetic values only.

Labels were written from the written format definitions of each kind, NOT from
the implementation or the tuning corpus. Every generated case is re-checked by
an independent reference matcher (`scan`, below) written from the same
definitions; the labels must agree with it exactly. The matcher is also run in
several "variant" modes that flip points the definitions leave open (token
boundaries, card windows inside longer digit runs, reserved sub-domains, ...);
a case is only accepted when all variants agree, so random filler never lands
in ambiguous territory or accidentally forms a finding. Cases whose random
filler trips a check are regenerated (deterministically).

Line format: {"text": ..., "expect": [{"kind": ..., "match": ...}], "note": ...}
"""

import base64
import collections
import json
import os
import random
import re
import string
import sys

SEED = 20261130
R = random.Random(SEED)
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "holdout.jsonl")

KINDS = {
    "private_key", "aws_access_key_id", "aws_secret_access_key", "github_token",
    "gitlab_token", "slack_token", "slack_webhook", "google_api_key", "stripe_key",
    "openai_key", "anthropic_key", "npm_token", "huggingface_token", "sendgrid_key",
    "azure_storage_key", "jwt", "url_credentials", "email", "phone", "payment_card",
    "iban",
}

UP = string.ascii_uppercase
LO = string.ascii_lowercase
DG = string.digits
LET = UP + LO
ALNUM = LET + DG
B64 = ALNUM + "+/"
URLSAFE = ALNUM + "_-"
B32 = UP + "234567"
UPDG = UP + DG
HEX = "0123456789abcdef"

# --------------------------------------------------------------------------
# reference data
# --------------------------------------------------------------------------

IBAN_LEN = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22,
    "BH": 22, "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22,
    "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FO": 18, "FR": 27,
    "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HR": 21, "HU": 28,
    "IE": 22, "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20,
    "LB": 28, "LC": 32, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "LY": 25, "MC": 27,
    "MD": 24, "ME": 22, "MK": 19, "MR": 27, "MT": 31, "MU": 30, "NL": 18, "NO": 15,
    "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "SA": 24,
    "SC": 31, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "ST": 25, "SV": 28, "TL": 23,
    "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20,
}

# BBAN layouts used by the generator (n = digit, a = letter, c = upper alnum)
IBAN_FMT = {
    "DE": "18n", "GB": "4a14n", "FR": "10n11c2n", "ES": "20n", "IT": "1a10n12c",
    "NL": "4a10n", "BE": "12n", "CH": "5n12c", "AT": "16n", "PL": "24n", "NO": "11n",
    "MT": "4a5n18c", "LC": "4a24c", "SE": "20n", "IE": "4a14n", "PT": "21n",
    "DK": "14n", "FI": "14n", "LU": "3n13c",
}

# --------------------------------------------------------------------------
# value generators
# --------------------------------------------------------------------------


def rs(chars, n):
    return "".join(R.choice(chars) for _ in range(n))


def digits(n, first=None):
    s = rs(DG, n)
    if first is not None:
        s = first + s[1:]
    return s


def hexs(n):
    return rs(HEX, n)


def uuid4():
    return f"{hexs(8)}-{hexs(4)}-4{hexs(3)}-{R.choice('89ab')}{hexs(3)}-{hexs(12)}"


def b64u(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def aws_key_id(prefix="AKIA"):
    while True:
        v = prefix + rs(B32, 16)
        if not v.endswith("EXAMPLE"):
            return v


def aws_secret(n=40):
    while True:
        v = rs(B64, n)
        if "EXAMPLE" not in v:
            return v


def gh_classic(prefix):
    return prefix + "_" + rs(ALNUM, 36)


def gh_pat(after=82):
    return "github_pat_" + rs(ALNUM, 22) + "_" + rs(ALNUM, after - 23)


def glpat(n=20):
    return "glpat-" + rs(ALNUM, 1) + rs(URLSAFE, n - 2) + rs(ALNUM, 1)


def slack_tok(kind="xoxb"):
    return f"{kind}-{digits(12, R.choice('123456789'))}-{digits(13)}-{rs(ALNUM, 24)}"


def slack_hook(full=True):
    t = "T" + rs(UPDG, R.choice([8, 9, 10, 11]))
    b = "B" + rs(UPDG, R.choice([8, 9, 10, 11]))
    v = f"hooks.slack.com/services/{t}/{b}/{rs(ALNUM, 24)}"
    return v


def google_key():
    return "AIzaSy" + rs(ALNUM, 1) + rs(URLSAFE, 31) + rs(ALNUM, 1)


def stripe(prefix, n=99):
    return prefix + rs(ALNUM, n)


def openai_proj(prefix="proj", n=None):
    if n is None:
        n = R.choice([156, 164])
    return f"sk-{prefix}-" + rs(ALNUM, 1) + rs(URLSAFE, n - 2) + rs(ALNUM, 1)


def openai_legacy():
    return "sk-" + rs(ALNUM, 20) + "T3BlbkFJ" + rs(ALNUM, 20)


def anthropic(kind="api03"):
    return f"sk-ant-{kind}-" + rs(ALNUM, 1) + rs(URLSAFE, 92) + "AA"


def npm_tok(n=36):
    return "npm_" + rs(ALNUM, n)


def hf_tok(n=34):
    return "hf_" + rs(LET, n)


def sendgrid(a=22, b=43):
    return "SG." + rs(ALNUM, 1) + rs(URLSAFE, a - 2) + rs(ALNUM, 1) + "." + rs(ALNUM, 1) + rs(URLSAFE, b - 2) + rs(ALNUM, 1)


def azure_key():
    return rs(B64, 86) + "=="


def jwt(header=None, payload=None, sig=43):
    header = header if header is not None else {"alg": "HS256", "typ": "JWT"}
    payload = payload if payload is not None else {"sub": str(R.randint(10000, 99999)), "iat": R.randint(1730000000, 1760000000)}
    h = header if isinstance(header, str) else b64u(json.dumps(header, separators=(",", ":")).encode())
    p = b64u(json.dumps(payload, separators=(",", ":")).encode())
    s = b64u(R.randbytes(sig * 3 // 4 + 2))[:sig]
    return f"{h}.{p}.{s}" if sig else f"{h}.{p}."


def pw(n=20):
    return rs(ALNUM, 1) + rs(ALNUM + "_.~-", n - 2) + rs(ALNUM, 1)


def luhn_ok(d):
    s = 0
    for i, ch in enumerate(reversed(d)):
        x = int(ch)
        if i % 2 == 1:
            x *= 2
            if x > 9:
                x -= 9
        s += x
    return s % 10 == 0


def card(prefix, n, valid=True):
    body = prefix + rs(DG, n - len(prefix) - 1)
    for c in DG:
        if luhn_ok(body + c) == valid:
            if valid or R.random() < 0.5:
                return body + c
    for c in DG:
        if luhn_ok(body + c) == valid:
            return body + c
    raise AssertionError


STD_GROUPS = {13: [4, 4, 5], 14: [4, 6, 4], 15: [4, 6, 5], 16: [4, 4, 4, 4], 17: [4, 4, 4, 5],
              18: [4, 4, 4, 6], 19: [4, 4, 4, 4, 3]}


def grp(d, sep=" ", sizes=None):
    sizes = sizes or STD_GROUPS[len(d)]
    out, i = [], 0
    for s in sizes:
        out.append(d[i:i + s])
        i += s
    assert i == len(d)
    return sep.join(out)


def iban_mod(s):
    r = s[4:] + s[:4]
    return int("".join(str(int(c, 36)) for c in r)) % 97


def iban(cc, valid=True):
    fmt = IBAN_FMT[cc]
    bban = ""
    for n, t in re.findall(r"(\d+)([nac])", fmt):
        bban += rs({"n": DG, "a": UP, "c": UPDG}[t], int(n))
    chk = 98 - iban_mod(cc + "00" + bban)
    s = f"{cc}{chk:02d}{bban}"
    assert len(s) == IBAN_LEN[cc] and iban_mod(s) == 1
    if not valid:
        bad = (chk + R.randint(1, 50)) % 97 + 2
        if bad == chk:
            bad = chk + 1 if chk < 98 else chk - 1
        s = f"{cc}{bad:02d}{bban}"
        assert iban_mod(s) != 1
    return s


def iban_sp(s):
    return " ".join(s[i:i + 4] for i in range(0, len(s), 4))


def pem_block(label, prefix=b"", nbytes=600, width=64, end=True, nl="\n", extra=None, trailer=None):
    b = base64.b64encode(prefix + R.randbytes(nbytes)).decode()
    lines = [b[i:i + width] for i in range(0, len(b), width)]
    parts = [f"-----BEGIN {label}-----"] + (extra or []) + lines + (trailer or [])
    if end:
        parts.append(f"-----END {label}-----")
    return nl.join(parts)


P_RSA = b"0\x82\x04\xa4\x02\x01\x00\x02\x82\x01\x01\x00"
P_PKCS8 = b"0\x82\x04\xbd\x02\x01\x000\r\x06\t*\x86H\x86\xf7\r\x01\x01\x01\x05\x00\x04\x82\x04\xa7"
P_EC = b"0w\x02\x01\x01\x04 "
P_SSH = b"openssh-key-v1\x00\x00\x00\x00\x04none\x00\x00\x00\x04none\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x003\x00\x00\x00\x0bssh-ed25519"
P_ENC = b"0\x82\x05\x1c0N\x06\t*\x86H\x86\xf7\r\x01\x05\r0A"
P_DSA = b"0\x82\x01\xbb\x02\x01\x00\x02\x81\x81\x00"
P_PUB = b"0\x82\x01\"0\r\x06\t*\x86H\x86\xf7\r\x01\x01\x01\x05\x00\x03\x82\x01\x0f\x00"
P_CERT = b"0\x82\x03\x1d0\x82\x02\x05\xa0\x03\x02\x01\x02\x02\x14"


def rsa_pem(**kw):
    return pem_block("RSA PRIVATE KEY", P_RSA, 1180, **kw)


def cert_pem(**kw):
    return pem_block("CERTIFICATE", P_CERT, 780, **kw)


def pub_pem(**kw):
    return pem_block("PUBLIC KEY", P_PUB, 270, **kw)


def ssh_pub(kind="ssh-ed25519"):
    blob = base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00 " + R.randbytes(32)).decode()
    return f"{kind} {blob}"


FIRST = ["dana", "marcus", "priya", "jonas", "lucia", "hiroshi", "aoife", "sofia", "kenji", "lena",
         "ruth", "tomas", "amara", "felix", "ines", "noor", "mateo", "yuki", "oskar", "chloe"]
LAST = ["whitfield", "oyelaran", "raman", "albrecht", "fernandez", "tanaka", "brennan", "ibarra", "mori",
        "vogt", "abernathy", "herrera", "okafor", "lindqvist", "moreau", "haddad", "ruiz", "sato", "nowak", "dubois"]
DOMAINS = ["quillfeather.io", "brightmoor-logistics.de", "nordwald-gmbh.de", "lumenforge.fr", "casa-tramonto.es",
           "hoshizora-shoji.co.jp", "tidewater-analytics.co.uk", "ferrovia-sud.it", "polderbank-klant.nl",
           "kestrel-ops.dev", "ambergrove.com", "saltmarsh-coop.org", "orchardline.net"]
AREAS = ["206", "212", "303", "312", "415", "503", "617", "646", "702", "773", "818", "917"]


def person():
    return R.choice(FIRST), R.choice(LAST)


def email(domain=None, style=None):
    f, l = person()
    domain = domain or R.choice(DOMAINS)
    style = style or R.choice(["f.l", "fl", "f_l", "f", "fl+tag"])
    local = {"f.l": f"{f}.{l}", "fl": f"{f[0]}{l}", "f_l": f"{f}_{l}", "f": f,
             "fl+tag": f"{f}.{l}+{R.choice(['billing', 'orders', 'jira'])}"}[style]
    return f"{local}@{domain}"


def na_phone(fmt=None):
    a = R.choice(AREAS)
    e = "555"
    l = "01" + digits(2)
    fmt = fmt or R.choice(["paren", "dash", "dot"])
    return {"paren": f"({a}) {e}-{l}", "dash": f"{a}-{e}-{l}", "dot": f"{a}.{e}.{l}"}[fmt]


def ts_iso():
    return f"2025-{R.randint(1, 12):02d}-{R.randint(1, 28):02d}T{R.randint(0, 23):02d}:{R.randint(0, 59):02d}:{R.randint(0, 59):02d}Z"


def gha(lines):
    day = f"2025-{R.randint(1, 12):02d}-{R.randint(1, 28):02d}"
    h, m, s = R.randint(0, 22), R.randint(0, 50), R.randint(0, 40)
    out = []
    for i, line in enumerate(lines):
        out.append(f"{day}T{h:02d}:{m:02d}:{s + i // 3:02d}.{R.randint(0, 9999999):07d}Z {line}")
    return "\n".join(out)


def psql(headers, rows, footer=True):
    w = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    head = " " + " | ".join(str(h).center(x) for h, x in zip(headers, w))
    sep = "-" + "-+-".join("-" * x for x in w) + "-"
    body = [" " + " | ".join(str(c).ljust(x) for c, x in zip(r, w)).rstrip() for r in rows]
    return "\n".join([head.rstrip(), sep] + body + ([f"({len(rows)} rows)"] if footer else []))


def mysql(headers, rows):
    w = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = "+" + "+".join("-" * (x + 2) for x in w) + "+"

    def fmt(r):
        return "| " + " | ".join(str(c).ljust(x) for c, x in zip(r, w)) + " |"
    return "\n".join([line, fmt(headers), line] + [fmt(r) for r in rows] + [line, f"{len(rows)} rows in set (0.{R.randint(0, 9)}{R.randint(0, 9)} sec)"])


def md_table(headers, rows):
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def jdump(obj, indent=2):
    return json.dumps(obj, indent=indent, ensure_ascii=False)


def jstr(s):
    """How a string value appears inside JSON text (without the quotes)."""
    return json.dumps(s)[1:-1]


# ==========================================================================
# reference matcher (written from the format definitions only)
# ==========================================================================

VARIANTS = [
    "pre",            # token prefixes must not follow a letter/digit/_/-
    "post",           # tokens must not be followed by a letter/digit/_/-
    "secret_ci",      # AWS secret key names matched case-insensitively
    "secret_eq",      # AWS secret value must not be followed by '='
    "pw_prefix",      # URL password placeholder words also match as prefixes
    "pw_xcase",       # "all x's" also counts upper-case X
    "email_nolb",     # local part taken as the last <=64 chars before '@'
    "email_bt",       # domain may backtrack to a shorter valid domain
    "email_ressub",   # sub-domains of example.com/.net/.org are reserved too
    "email_ssh_git",  # only git@host:path is an SSH remote
    "plus_pre",       # '+' of a phone may directly follow a letter
    "card_win",       # card windows inside longer digit runs / groups
    "card_letters",   # digit runs touching letters/_ are not cards
    "maestro12",      # 12-digit Maestro allowed
    "iban_greedy",    # greedy 4-groups for spaced IBANs
    "iban_nb",        # IBANs inside longer alnum strings
]

PLACEHOLDER_WORDS = ["password", "passwd", "pass", "pwd", "secret", "changeme", "redacted"]


def network_ok(d, v):
    n = len(d)
    if not n or not d.isdigit():
        return False
    p2, p3, p4 = int(d[:2]), int(d[:3]), int(d[:4])
    if d[0] == "4" and n in (13, 16, 19):
        return True
    if (51 <= p2 <= 55 or 2221 <= p4 <= 2720) and n == 16:
        return True
    if p2 in (34, 37) and n == 15:
        return True
    if (p4 == 6011 or 644 <= p3 <= 649 or p2 == 65 or p2 == 62) and 16 <= n <= 19:
        return True
    if 3528 <= p4 <= 3589 and 16 <= n <= 19:
        return True
    if (300 <= p3 <= 305 or p2 in (36, 38, 39)) and 14 <= n <= 19:
        return True
    lo = 12 if "maestro12" in v else 13
    if p2 in (50, 56, 57, 58, 63, 67, 69) and lo <= n <= 19:
        return True
    return False


def is_card(d, v):
    lo = 12 if "maestro12" in v else 13
    return lo <= len(d) <= 19 and luhn_ok(d) and network_ok(d, v)


def scan(text, v=frozenset()):
    F = []
    T = len(text)

    def before(i):
        return text[i - 1] if i > 0 else ""

    def after(i):
        return text[i] if i < T else ""

    WORDCH = set(ALNUM + "_-")

    def add_tok(kind, s, e):
        if "pre" in v and before(s) in WORDCH:
            return
        if "post" in v and after(e) in WORDCH:
            return
        F.append((kind, text[s:e], s, e))

    # private keys
    for m in re.finditer(r"-----BEGIN ((?:[A-Z0-9]+ )*PRIVATE KEY|PGP PRIVATE KEY BLOCK)-----", text):
        endm = f"-----END {m.group(1)}-----"
        j = text.find(endm, m.end())
        e = T if j < 0 else j + len(endm)
        F.append(("private_key", text[m.start():e], m.start(), e))

    # AWS access key id
    for m in re.finditer(r"(?<![A-Za-z0-9_-])(?:AKIA|ASIA|ABIA|ACCA)[A-Z2-7]{16}(?![A-Za-z0-9_-])", text):
        if not m.group(0).endswith("EXAMPLE"):
            F.append(("aws_access_key_id", m.group(0), m.start(), m.end()))

    # AWS secret access key
    names = r"(?:secret_access_key|SECRET_ACCESS_KEY|SecretAccessKey|secretAccessKey|secret-access-key)"
    tail = r"(?![A-Za-z0-9+/=])" if "secret_eq" in v else r"(?![A-Za-z0-9+/])"
    flags = re.I if "secret_ci" in v else 0
    for m in re.finditer(names + r"[\"']?[ \t]*[:=][ \t]*[\"']?([A-Za-z0-9+/]{40})" + tail, text, flags):
        if "EXAMPLE" not in m.group(1):
            F.append(("aws_secret_access_key", m.group(1), m.start(1), m.end(1)))

    # GitHub
    for m in re.finditer(r"(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{36}(?![A-Za-z0-9_-])", text):
        add_tok("github_token", m.start(), m.end())
    for m in re.finditer(r"github_pat_[A-Za-z0-9_]{60,255}(?![A-Za-z0-9_])", text):
        add_tok("github_token", m.start(), m.end())

    # GitLab
    for m in re.finditer(r"glpat-[A-Za-z0-9_.-]+", text):
        body = m.group(0)[6:].rstrip(".")
        if len(body) >= 20:
            add_tok("gitlab_token", m.start(), m.start() + 6 + len(body))

    # Slack tokens
    for m in re.finditer(r"xox[aeoprsb]-([A-Za-z0-9-]+)", text):
        b = m.group(1)
        if b[0].isdigit() and len(b) >= 15 and "-" in b:
            add_tok("slack_token", m.start(), m.end())

    # Slack webhook
    for m in re.finditer(r"hooks\.slack\.com/services/T[A-Z0-9]{8,14}/B[A-Z0-9]{8,14}/[A-Za-z0-9]{24}(?![A-Za-z0-9])", text):
        add_tok("slack_webhook", m.start(), m.end())

    # Google
    for m in re.finditer(r"AIza[A-Za-z0-9_-]{35}(?![A-Za-z0-9_-])", text):
        add_tok("google_api_key", m.start(), m.end())

    # Stripe
    for m in re.finditer(r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{24,255}(?![A-Za-z0-9])", text):
        add_tok("stripe_key", m.start(), m.end())

    # OpenAI / Anthropic
    for m in re.finditer(r"sk-([A-Za-z0-9_-]+)", text):
        b = m.group(1)
        if b.startswith("ant-"):
            if len(b) >= 90:
                add_tok("anthropic_key", m.start(), m.end())
        elif re.match(r"(?:proj|svcacct|admin)-", b):
            if len(b) >= 40:
                add_tok("openai_key", m.start(), m.end())
        elif len(b) >= 40 and "T3BlbkFJ" in b:
            add_tok("openai_key", m.start(), m.end())

    # npm / HF / SendGrid
    for m in re.finditer(r"npm_[A-Za-z0-9]{36}(?![A-Za-z0-9])", text):
        add_tok("npm_token", m.start(), m.end())
    for m in re.finditer(r"hf_[A-Za-z]{34}(?![A-Za-z])", text):
        add_tok("huggingface_token", m.start(), m.end())
    for m in re.finditer(r"SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])", text):
        add_tok("sendgrid_key", m.start(), m.end())

    # Azure storage
    for m in re.finditer(r"AccountKey=([A-Za-z0-9+/]{86}==)", text):
        if "post" in v and after(m.end(1)) in set(B64 + "="):
            continue
        F.append(("azure_storage_key", m.group(1), m.start(1), m.end(1)))

    # JWT
    for m in re.finditer(r"(eyJ[A-Za-z0-9_-]{7,})\.(eyJ[A-Za-z0-9_-]{7,})\.([A-Za-z0-9_-]{16,})", text):
        h = m.group(1)
        try:
            hdr = json.loads(base64.urlsafe_b64decode(h + "=" * (-len(h) % 4)))
        except Exception:
            continue
        if not isinstance(hdr, dict) or "alg" not in hdr:
            continue
        if "post" in v and re.match(r"\.[A-Za-z0-9_-]", text[m.end():m.end() + 2]):
            continue
        add_tok("jwt", m.start(), m.end())

    # URL credentials (and the '@' positions of URL userinfo, for email)
    url_ats = set()
    for m in re.finditer(r"[A-Za-z][A-Za-z0-9+.-]*://([^\s/?#@\"']*)@", text):
        url_ats.add(m.end() - 1)
    for m in re.finditer(r"[A-Za-z][A-Za-z0-9+.-]*://([^\s:/?#@\"']+):([^\s/?#@\"']*)@", text):
        p = m.group(2)
        if not p:
            continue
        low = p.lower()
        ph = p[0] in "$<{[*"
        ph = ph or set(p) <= ({"x", "X"} if "pw_xcase" in v else {"x"})
        ph = ph or low in PLACEHOLDER_WORDS
        if "pw_prefix" in v:
            ph = ph or any(low.startswith(w) for w in PLACEHOLDER_WORDS)
        if not ph:
            F.append(("url_credentials", text[m.start(1):m.end(2)], m.start(1), m.end(2)))

    # e-mail
    lb = "" if "email_nolb" in v else r"(?<![A-Za-z0-9._%+-])"
    for m in re.finditer(lb + r"([A-Za-z0-9._%+-]{1,64})@([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)", text):
        local, dom = m.group(1), m.group(2)
        if local.startswith(".") or local.endswith("."):
            continue
        labels = dom.split(".")
        if "email_bt" in v:
            while len(labels) > 2 and not re.fullmatch(r"[A-Za-z]{2,}", labels[-1]):
                labels.pop()
        if not re.fullmatch(r"[A-Za-z]{2,}", labels[-1]):
            continue
        dom = ".".join(labels)
        e = m.start(2) + len(dom)
        dl = dom.lower()
        reserved = dl in ("example.com", "example.net", "example.org") or re.search(r"\.(example|test|invalid|localhost)$", dl)
        if "email_ressub" in v and re.search(r"\.example\.(com|net|org)$", dl):
            reserved = True
        if reserved:
            continue
        if re.fullmatch(r"\d+(?:\.\d+)?x\.[a-z]+", dl):           # logo@2x.png
            continue
        if re.match(r"v?\d+\.\d+", dl):                             # pkg@1.2.3
            continue
        if after(e) == ":" and re.match(r"[A-Za-z0-9_~/.-]", text[e + 1:e + 2]):
            if "email_ssh_git" not in v or local == "git":          # git@host:org/repo
                continue
        if m.start(2) - 1 in url_ats:                               # scheme://user:pw@host
            continue
        if "post" in v and after(e) in WORDCH:
            continue
        F.append(("email", text[m.start(1):e], m.start(1), e))

    # phone
    phone_spans = []
    for m in re.finditer(r"\+[1-9]\d*(?: \(\d+\))?(?:[ .-]\d+)*", text):
        b = before(m.start())
        if b.isdigit() or (b.isalpha() and b.isascii() and "plus_pre" not in v):
            continue
        nd = sum(c.isdigit() for c in m.group(0))
        if 8 <= nd <= 15:
            F.append(("phone", m.group(0), m.start(), m.end()))
            phone_spans.append((m.start(), m.end()))
    na = (r"(?<![\d+])(?<!\d[.-])(?:\([2-9]\d{2}\) [2-9]\d{2}-\d{4}|[2-9]\d{2}-[2-9]\d{2}-\d{4}"
          r"|[2-9]\d{2}\.[2-9]\d{2}\.\d{4})(?!\d)(?![.-]\d)")
    for m in re.finditer(na, text):
        if any(s < m.end() and m.start() < e for s, e in phone_spans):
            continue
        F.append(("phone", m.group(0), m.start(), m.end()))

    # payment cards
    for m in re.finditer(r"\d+(?:[ -]\d+)*", text):
        chain = m.group(0)
        groups = re.split(r"[ -]", chain)
        seps = re.findall(r"[ -]", chain)
        touching = bool(re.match(r"[A-Za-z_]", before(m.start())) or re.match(r"[A-Za-z_]", after(m.end())))
        if len(set(seps)) <= 1 and is_card("".join(groups), v):
            if not ("card_letters" in v and touching):
                F.append(("payment_card", chain, m.start(), m.end()))
            continue
        if "card_win" in v:
            for i in range(len(groups)):
                for j in range(i, len(groups)):
                    if len(set(seps[i:j])) > 1:
                        break
                    if (i, j) != (0, len(groups) - 1) and is_card("".join(groups[i:j + 1]), v):
                        F.append(("payment_card", "WINDOW:" + "".join(groups[i:j + 1]), -1, -1))
            for g in groups:
                for a in range(len(g)):
                    for L in range(12, 20):
                        w = g[a:a + L]
                        if len(w) == L and w != g and is_card(w, v):
                            F.append(("payment_card", "WINDOW:" + w, -1, -1))

    # IBAN
    if "iban_greedy" in v:
        for m in re.finditer(r"(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?:[A-Z0-9]{11,30}|(?: [A-Z0-9]{4})+(?: [A-Z0-9]{1,3})?)(?![A-Za-z0-9])", text):
            s = m.group(0).replace(" ", "")
            if IBAN_LEN.get(s[:2]) == len(s) and iban_mod(s) == 1:
                F.append(("iban", m.group(0), m.start(), m.end()))
    else:
        for m in re.finditer(r"([A-Z]{2})\d{2}", text):
            L = IBAN_LEN.get(m.group(1))
            if not L:
                continue
            i = m.start()
            nb = "iban_nb" in v
            if not nb and before(i).isalnum():
                continue
            seg = text[i:i + L]
            if re.fullmatch(r"[A-Z0-9]{%d}" % L, seg) and (nb or not after(i + L).isalnum()) and iban_mod(seg) == 1:
                F.append(("iban", seg, i, i + L))
                continue
            k, rem = divmod(L - 4, 4)
            pat = r"[A-Z]{2}\d{2}(?: [A-Z0-9]{4}){%d}" % k + (r" [A-Z0-9]{%d}" % rem if rem else "")
            mm = re.compile(pat).match(text, i)
            if mm and not after(mm.end()).isalnum() and iban_mod(mm.group(0).replace(" ", "")) == 1:
                F.append(("iban", mm.group(0), i, mm.end()))
    return F


# ==========================================================================
# cases
# ==========================================================================

REG = []


def reg(fn, n=1):
    REG.extend([fn] * n)
    return fn


def P(fn):
    return reg(fn)


# ---------------------------------------------------------------- CI logs --

@P
def ci_gha_aws_export():
    kid, sec, acct = aws_key_id(R.choice(["AKIA", "ASIA"])), aws_secret(), digits(12, "4")
    text = gha([
        "##[group]Run ./scripts/deploy.sh --stage prod",
        "./scripts/deploy.sh --stage prod",
        "shell: /usr/bin/bash -e {0}",
        "##[endgroup]",
        "+ set -x",
        f"+ export AWS_ACCESS_KEY_ID={kid}",
        f"+ export AWS_SECRET_ACCESS_KEY={sec}",
        "+ aws sts get-caller-identity --output json",
        f'{{"UserId": "AIDA{rs(B32, 17)}", "Account": "{acct}", "Arn": "arn:aws:iam::{acct}:user/ci-deployer"}}',
        f"Deploying stack orders-api (eu-central-1) ... done in {R.randint(20, 90)}.{R.randint(0, 9)}s",
    ])
    return text, [("aws_access_key_id", kid), ("aws_secret_access_key", sec)], "set -x echoes exported AWS creds in a GitHub Actions log; AIDA user id is not a key"


@P
def ci_gitlab_remote_token():
    tok = glpat(R.randint(20, 26))
    host = "gitlab.kestrel-ops.dev"
    mail = f"release-bot@{'kestrel-ops.dev'}"
    text = "\n".join([
        "Running with gitlab-runner 17.5.2 (c6eae8d7)",
        f"  on k8s-runner-{hexs(4)} {rs(ALNUM, 8)}, system ID: r_{rs(ALNUM, 12)}",
        'Preparing the "kubernetes" executor',
        f'$ git config --global user.email "{mail}"',
        f"$ git remote set-url origin https://release-bot:{tok}@{host}/platform/helm-charts.git",
        "$ git push origin HEAD:refs/tags/v3.18.0",
        f"To https://{host}/platform/helm-charts.git",
        " * [new tag]         HEAD -> v3.18.0",
        "Cleaning up project directory and file based variables",
        "Job succeeded",
    ])
    return text, [("email", mail), ("url_credentials", f"release-bot:{tok}"), ("gitlab_token", tok)], "GitLab job sets a remote URL with a PAT as password; bot e-mail is a real address"


@P
def ci_jenkins_slack_webhook():
    hook = slack_hook()
    text = "\n".join([
        "Started by timer",
        "Running as SYSTEM",
        "[Pipeline] stage",
        "[Pipeline] { (Notify)",
        "[Pipeline] sh",
        f"+ curl -sS -X POST -H 'Content-type: application/json' --data '{{\"text\":\"nightly build #{R.randint(100, 999)} passed\"}}' https://{hook}",
        "ok",
        "[Pipeline] }",
        "[Pipeline] // stage",
        "Finished: SUCCESS",
    ])
    return text, [("slack_webhook", hook)], "Jenkins sh step echoes the incoming-webhook URL"


@P
def ci_npm_publish_cat_npmrc():
    tok = npm_tok()
    text = "\n".join([
        "> @quillfeather/ui-kit@4.2.0 prepublishOnly",
        "> npm run build && cat .npmrc",
        "",
        f"//registry.npmjs.org/:_authToken={tok}",
        "npm notice",
        "npm notice package: @quillfeather/ui-kit@4.2.0",
        "npm notice === Tarball Contents ===",
        f"npm notice {R.randint(10, 40)}.{R.randint(0, 9)}kB dist/index.js",
        "npm notice === Tarball Details ===",
        "npm notice name:          @quillfeather/ui-kit",
        "npm notice version:       4.2.0",
        f"npm notice shasum:        {hexs(40)}",
        f"npm notice integrity:     sha512-{rs(B64, 20)}[...]{rs(B64, 10)}==",
        "npm notice total files:   23",
        "+ @quillfeather/ui-kit@4.2.0",
    ])
    return text, [("npm_token", tok)], "prepublish script cats .npmrc into the publish log"


@P
def ci_circle_env_stripe():
    rk = stripe("rk_live_", R.choice([24, 99]))
    sk = stripe("sk_live_", 24)
    text = "\n".join([
        "#!/bin/bash -eo pipefail",
        "env | sort | grep -E '^(CIRCLE|STRIPE|NODE)_'",
        "CIRCLE_BRANCH=main",
        f"CIRCLE_BUILD_NUM={R.randint(10000, 99999)}",
        f"CIRCLE_SHA1={hexs(40)}",
        "NODE_ENV=production",
        f"STRIPE_RESTRICTED_KEY={rk}",
        f"STRIPE_SECRET_KEY={sk}",
        "",
        "CircleCI received exit code 0",
    ])
    return text, [("stripe_key", rk), ("stripe_key", sk)], "env dump in CircleCI; sk_live_ with exactly 24 chars (lower edge)"


@P
def ci_docker_build_hf():
    tok = hf_tok()
    n = R.randint(5, 9)
    text = "\n".join([
        "#7 [builder 3/6] RUN --mount=type=cache,target=/root/.cache pip install -r requirements.txt",
        f"#7 DONE {R.randint(20, 80)}.{R.randint(0, 9)}s",
        "",
        f"#8 [builder 4/6] RUN HF_TOKEN={tok} python -c \"from huggingface_hub import snapshot_download; snapshot_download('quillfeather/intent-small-v2', local_dir='/models')\"",
        f"#8 1.204 Fetching {n} files: 100%|##########| {n}/{n} [00:03<00:00,  2.61it/s]",
        "#8 DONE 5.1s",
    ])
    return text, [("huggingface_token", tok)], "BuildKit log shows inline HF_TOKEN in a RUN step"


@P
def ci_curl_verbose_jwt():
    iat = R.randint(1740000000, 1760000000)
    tok = jwt({"alg": "RS256", "typ": "JWT", "kid": hexs(16)},
              {"sub": "svc-ci", "iss": "https://auth.lumenforge.fr", "aud": "builds", "iat": iat, "exp": iat + 900}, 342)
    b = R.randint(1000, 9999)
    text = "\n".join([
        f'$ curl -v -H "Authorization: Bearer {tok}" https://api.lumenforge.fr/v2/builds/{b}/artifacts',
        "*   Trying 10.20.4.17:443...",
        "* Connected to api.lumenforge.fr (10.20.4.17) port 443",
        f"> GET /v2/builds/{b}/artifacts HTTP/2",
        "> Host: api.lumenforge.fr",
        f"> authorization: Bearer {tok}",
        "> user-agent: curl/8.5.0",
        ">",
        "< HTTP/2 200",
        "< content-type: application/json",
    ])
    return text, [("jwt", tok), ("jwt", tok)], "curl -v in a CI step prints the bearer JWT twice (command and request header)"


@P
def ci_clone_ghs_url():
    tok = gh_classic("ghs")
    text = gha([
        f"Run git clone https://x-access-token:{tok}@github.com/quillfeather/infra-live.git",
        "Cloning into 'infra-live'...",
        f"remote: Enumerating objects: {R.randint(1000, 3000)}, done.",
        "remote: Counting objects: 100% (311/311), done.",
        f"Receiving objects: 100% (1842/1842), {R.randint(1, 9)}.{R.randint(10, 99)} MiB | 18.33 MiB/s, done.",
        "Resolving deltas: 100% (904/904), done.",
    ])
    return text, [("url_credentials", f"x-access-token:{tok}"), ("github_token", tok)], "installation token used as URL password: both url_credentials and github_token"


@P
def ci_printenv_github_pat():
    tok = gh_pat(82)
    text = "\n".join([
        "$ printenv | grep -i -E 'gh_|github' | sort",
        "GITHUB_ACTIONS=true",
        f"GITHUB_RUN_ID={digits(10, '1')}",
        "GITHUB_SERVER_URL=https://github.com",
        f"GH_TOKEN={tok}",
        "GH_REPO=quillfeather/release-notes",
    ])
    return text, [("github_token", tok)], "fine-grained PAT in printenv output"


# ------------------------------------------------------------- Terraform --

@P
def tf_state_tls_private_key():
    rsa = rsa_pem()
    ssh = pem_block("OPENSSH PRIVATE KEY", P_SSH, 300, width=70)
    pk8 = pem_block("PRIVATE KEY", P_PKCS8, 1190)
    pub = pub_pem()
    state = {
        "version": 4, "terraform_version": "1.9.8", "serial": R.randint(3, 60), "lineage": uuid4(), "outputs": {},
        "resources": [{
            "mode": "managed", "type": "tls_private_key", "name": "deploy",
            "provider": 'provider["registry.terraform.io/hashicorp/tls"]',
            "instances": [{"schema_version": 1, "attributes": {
                "algorithm": "RSA", "ecdsa_curve": "P224", "id": hexs(40),
                "private_key_openssh": ssh + "\n", "private_key_pem": rsa + "\n", "private_key_pem_pkcs8": pk8 + "\n",
                "public_key_fingerprint_md5": ":".join(hexs(2) for _ in range(16)),
                "public_key_pem": pub + "\n", "rsa_bits": 2048}, "sensitive_attributes": []}]}],
    }
    text = jdump(state)
    return text, [("private_key", jstr(ssh)), ("private_key", jstr(rsa)), ("private_key", jstr(pk8))], "terraform.tfstate holds three private key encodings (JSON-escaped newlines); public_key_pem is not a finding"


@P
def tf_state_iam_access_key():
    kid, sec = aws_key_id("AKIA"), aws_secret()
    state = {
        "version": 4, "terraform_version": "1.8.5", "serial": R.randint(3, 60), "lineage": uuid4(),
        "outputs": {"deployer_access_key_id": {"value": kid, "type": "string"}},
        "resources": [{"mode": "managed", "type": "aws_iam_access_key", "name": "deployer",
                       "provider": 'provider["registry.terraform.io/hashicorp/aws"]',
                       "instances": [{"schema_version": 0, "attributes": {
                           "create_date": ts_iso(), "encrypted_secret": None, "id": kid, "pgp_key": None,
                           "secret": sec, "ses_smtp_password_v4": rs(B64, 44), "status": "Active", "user": "ci-deployer"},
                           "sensitive_attributes": []}]}],
    }
    return jdump(state), [("aws_access_key_id", kid), ("aws_access_key_id", kid)], "key id appears twice; the secret is under the key 'secret', which the spec does not cover"


@P
def tf_plan_azure_conn():
    acct = "stassets" + rs(LO + DG, 6)
    key = azure_key()
    conn = f"DefaultEndpointsProtocol=https;AccountName={acct};AccountKey={key};EndpointSuffix=core.windows.net"
    text = "\n".join([
        "Terraform will perform the following actions:",
        "",
        "  # azurerm_storage_account.assets will be updated in-place",
        '  ~ resource "azurerm_storage_account" "assets" {',
        f'        id                               = "/subscriptions/{uuid4()}/resourceGroups/rg-assets-prod/providers/Microsoft.Storage/storageAccounts/{acct}"',
        f'        name                             = "{acct}"',
        "      ~ tags                             = {",
        f'          + "cost-center" = "{R.randint(1000, 9999)}"',
        "        }",
        "        # (38 unchanged attributes hidden)",
        "    }",
        "",
        "Plan: 0 to add, 1 to change, 0 to destroy.",
        "",
        "Changes to Outputs:",
        f'  ~ assets_connection_string      = "{conn}"',
        f'  + assets_blob_connection_string = "{conn.replace("EndpointSuffix=core.windows.net", "BlobEndpoint=https://" + acct + ".blob.core.windows.net/")}"',
    ])
    return text, [("azure_storage_key", key), ("azure_storage_key", key)], "non-sensitive outputs in a plan reveal the storage account key twice"


@P
def tf_tfvars_aws():
    kid, sec = aws_key_id("ASIA"), aws_secret()
    text = "\n".join([
        "# terraform.tfvars -- generated by bootstrap.sh, do not commit",
        'region                = "ap-northeast-1"',
        f'aws_access_key_id     = "{kid}"',
        f'aws_secret_access_key = "{sec}"',
        f'aws_session_token     = "IQoJb3JpZ2luX2Vj{rs(B64, 280)}"',
        'tags = { owner = "platform", cost_center = "7312" }',
    ])
    return text, [("aws_access_key_id", kid), ("aws_secret_access_key", sec)], "HCL tfvars with temporary creds; session token is not a spec kind"


# ------------------------------------------------------------ Kubernetes --

@P
def k8s_last_applied_db_url():
    p = pw(24)
    url = f"postgres://orders_app:{p}@pg-primary.orders.svc.cluster.local:5432/orders?sslmode=require"
    last = json.dumps({"apiVersion": "v1", "kind": "Secret", "metadata": {"annotations": {}, "name": "orders-db", "namespace": "orders"},
                       "stringData": {"DATABASE_URL": url}, "type": "Opaque"}, separators=(",", ":"))
    text = "\n".join([
        "apiVersion: v1",
        "data:",
        f"  DATABASE_URL: {base64.b64encode(url.encode()).decode()}",
        "kind: Secret",
        "metadata:",
        "  annotations:",
        "    kubectl.kubernetes.io/last-applied-configuration: |",
        f"      {last}",
        f'  creationTimestamp: "{ts_iso()}"',
        "  name: orders-db",
        "  namespace: orders",
        f'  resourceVersion: "{R.randint(10000000, 99999999)}"',
        f"  uid: {uuid4()}",
        "type: Opaque",
    ])
    return text, [("url_credentials", f"orders_app:{p}")], "kubectl -o yaml: last-applied annotation keeps stringData in clear text"


@P
def k8s_configmap_webhook_email():
    hook = slack_hook()
    mail = f"sre-oncall@{R.choice(DOMAINS)}"
    text = "\n".join([
        "apiVersion: v1",
        "data:",
        f"  ALERT_EMAIL: {mail}",
        "  LOG_LEVEL: info",
        f"  SLACK_WEBHOOK_URL: https://{hook}",
        '  REPLICAS: "3"',
        "kind: ConfigMap",
        "metadata:",
        f'  creationTimestamp: "{ts_iso()}"',
        "  name: alertmanager-notify",
        "  namespace: monitoring",
        f'  resourceVersion: "{R.randint(10000000, 99999999)}"',
        f"  uid: {uuid4()}",
    ])
    return text, [("email", mail), ("slack_webhook", hook)], "ConfigMap with a webhook URL and an on-call address"


@P
def k8s_tls_secret_ec():
    key = pem_block("EC PRIVATE KEY", P_EC, 89)
    crt = cert_pem()
    last = json.dumps({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "edge-tls", "namespace": "ingress"},
                       "stringData": {"tls.crt": crt + "\n", "tls.key": key + "\n"}, "type": "kubernetes.io/tls"}, separators=(",", ":"))
    text = "\n".join([
        "apiVersion: v1",
        "data:",
        f"  tls.crt: {base64.b64encode((crt + chr(10)).encode()).decode()[:76]}...",
        f"  tls.key: {base64.b64encode((key + chr(10)).encode()).decode()[:76]}...",
        "kind: Secret",
        "metadata:",
        "  annotations:",
        "    kubectl.kubernetes.io/last-applied-configuration: |",
        f"      {last}",
        "  name: edge-tls",
        "  namespace: ingress",
        "type: kubernetes.io/tls",
    ])
    return text, [("private_key", jstr(key))], "EC key inside the last-applied JSON (escaped newlines); the certificate is not a finding"


@P
def k8s_describe_sa_token():
    iat = R.randint(1740000000, 1760000000)
    tok = jwt({"alg": "RS256", "kid": rs(URLSAFE, 43)},
              {"iss": "kubernetes/serviceaccount", "kubernetes.io/serviceaccount/namespace": "kube-system",
               "kubernetes.io/serviceaccount/secret.name": "ci-deployer-token",
               "kubernetes.io/serviceaccount/service-account.name": "ci-deployer", "sub": "system:serviceaccount:kube-system:ci-deployer"}, 342)
    text = "\n".join([
        "Name:         ci-deployer-token",
        "Namespace:    kube-system",
        "Labels:       <none>",
        "Annotations:  kubernetes.io/service-account.name: ci-deployer",
        f"              kubernetes.io/service-account.uid: {uuid4()}",
        "",
        "Type:  kubernetes.io/service-account-token",
        "",
        "Data",
        "====",
        f"ca.crt:     {R.randint(1000, 1200)} bytes",
        "namespace:  11 bytes",
        f"token:      {tok}",
    ])
    return text, [("jwt", tok)], "kubectl describe secret prints the service-account JWT"


# ------------------------------------------------------------------- SQL --

@P
def sql_customers():
    rows, exp = [], []
    fmts = ["paren", "dash", "dot"]
    R.shuffle(fmts)
    for i, f in enumerate(fmts):
        fn, ln = person()
        style = ["f.l", "upper", "fl+tag"][i]
        if style == "upper":
            mail = f"{fn[0].upper()}.{ln.upper()}@{R.choice(DOMAINS).upper()}"
        else:
            mail = email(style=style)
        ph = na_phone(f)
        rows.append([1041 + i, f"{fn.title()} {ln.title()}", mail, ph, f"2025-01-0{7 + i} {R.randint(10, 23)}:{R.randint(10, 59)}:{R.randint(10, 59)}"])
        exp += [("email", mail), ("phone", ph)]
    rows.append([1044, "Tomás Herrera", "", "", "2025-01-08 10:40:02"])
    q = "reporting=> SELECT id, full_name, email, phone, created_at FROM customers WHERE region = 'US-W' ORDER BY id LIMIT 4;"
    return q + "\n" + psql(["id", "full_name", "email", "phone", "created_at"], rows), exp, "psql result: three e-mails (one upper-case) and the three North-American phone layouts"


@P
def sql_payment_attempts():
    specs = [("VISA", card("4", 16)), ("AMEX", card(R.choice(["34", "37"]), 15)),
             ("DISCOVER", card("6011", 16)), ("MASTERCARD", card(str(R.randint(2221, 2720)), 16))]
    rows = [[7781203 + 3 * i, b, pan, f"{R.randint(1, 12):02d}/{R.randint(26, 30)}", f"{R.randint(5, 1500)}.{R.randint(0, 99):02d}"] for i, (b, pan) in enumerate(specs)]
    text = "mysql> SELECT order_id, card_brand, pan, exp, amount FROM payment_attempts_debug WHERE created_at > NOW() - INTERVAL 1 HOUR;\n"
    text += mysql(["order_id", "card_brand", "pan", "exp", "amount"], rows)
    return text, [("payment_card", p) for _, p in specs], "debug table with raw PANs: Visa, Amex 15, Discover 6011, Mastercard 2-series"


@P
def sql_payouts_iban():
    ibs = [iban(c) for c in ("DE", "GB", "ES", "NL")]
    rows = [[f"V-{R.randint(1000, 9999)}", name, ib, "EUR" if not ib.startswith("GB") else "GBP", f"{R.randint(100, 20000)}.{R.randint(0, 99):02d}"]
            for name, ib in zip(["Nordwald GmbH", "Tidewater Analytics Ltd", "Casa Tramonto SL", "Polderbank Klant BV"], ibs)]
    text = "warehouse=# SELECT vendor_id, vendor_name, iban, currency, amount FROM payouts_pending;\n" + psql(["vendor_id", "vendor_name", "iban", "currency", "amount"], rows)
    return text, [("iban", i) for i in ibs], "psql payout table with four contiguous IBANs (DE, GB with bank letters, ES, NL)"


# -------------------------------------------------------------- Markdown --

@P
def md_oncall_table():
    m1, m2 = email(style="f.l"), email(style="fl")
    p1 = f"+49 30 5558 {digits(4)}"
    p2 = f"+81 3 5550 {digits(4)}"
    p3 = f"+1 {R.choice(AREAS)} 555 01{digits(2)}"
    text = "## On-call rotation -- week 48\n\n" + md_table(
        ["Region", "Primary", "Phone", "Escalation"],
        [["EMEA", "Lena Vogt", p1, m1], ["APAC", "Kenji Mori", p2, m2], ["AMER", "Ruth Abernathy", p3, "--"]]
    ) + f"\n\nPager: https://pager.quillfeather.io/rotations/48 - bridge PIN {digits(4)} {digits(4)} #"
    return text, [("phone", p1), ("email", m1), ("phone", p2), ("email", m2), ("phone", p3)], "markdown on-call table; bridge PIN digits are not a phone"


@P
def md_service_keys():
    g, sg = google_key(), sendgrid()
    text = "### Prod credentials (rotate quarterly)\n\n" + md_table(
        ["Service", "Env", "Credential", "Rotated"],
        [["Maps JS", "prod", f"`{g}`", "2025-09-01"], ["Mail relay", "prod", f"`{sg}`", "2025-08-14"],
         ["Search", "prod", "(in Vault: `kv/search/prod`)", "--"]])
    return text, [("google_api_key", g), ("sendgrid_key", sg)], "keys pasted into a markdown table in inline code"


# ------------------------------------------------------------------ HTML --

@P
def html_footer_contact():
    mail = f"kundenservice@{R.choice(['brightmoor-logistics.de', 'nordwald-gmbh.de'])}"
    d = digits(4)
    p_compact = f"+494055{d}0"
    p_spaced = f"+49 40 55 {d} 0"
    text = "\n".join([
        '<footer class="site-footer">',
        "  <address>",
        "    Brightmoor Logistics GmbH &middot; Hafenstraße 12 &middot; 20457 Hamburg<br>",
        f'    Tel.: <a href="tel:{p_compact}">{p_spaced}</a><br>',
        f'    E-Mail: <a href="mailto:{mail}">{mail}</a>',
        "  </address>",
        f"  <p>&copy; 2025 Brightmoor Logistics &middot; USt-IdNr. DE {digits(3, '2')} {digits(3)} {digits(3)}</p>",
        "</footer>",
    ])
    return text, [("phone", p_compact), ("phone", p_spaced), ("email", mail), ("email", mail)], "tel: link and its label are two phone findings; mailto and label are two e-mails"


@P
def html_checkout_debug():
    pan = card(R.choice(["51", "52", "53", "54", "55"]), 16)
    g = google_key()
    text = "\n".join([
        "<!-- checkout debug dump, remove before release -->",
        '<form id="pay" action="/api/checkout" method="post">',
        f'  <input type="hidden" name="cc_number" value="{pan}">',
        f'  <input type="hidden" name="cc_exp" value="{R.randint(1, 12):02d}/{R.randint(26, 30)}">',
        f'  <input type="text" name="postal" value="{R.randint(10000, 99999)}">',
        "</form>",
        f'<script src="https://maps.googleapis.com/maps/api/js?key={g}&libraries=places&callback=initMap" async defer></script>',
    ])
    return text, [("payment_card", pan), ("google_api_key", g)], "PAN in a hidden input and a Maps key in a script URL"


# ----------------------------------------------------- Python tracebacks --

@P
def py_tb_sqlalchemy_dsn():
    p = pw(18)
    ip = f"10.40.{R.randint(0, 255)}.{R.randint(2, 254)}"
    text = "\n".join([
        "Traceback (most recent call last):",
        '  File "/srv/app/reporting/jobs/nightly.py", line 88, in run',
        "    engine = create_engine(settings.WAREHOUSE_DSN, pool_pre_ping=True)",
        '  File "/srv/app/.venv/lib/python3.12/site-packages/sqlalchemy/engine/create.py", line 616, in create_engine',
        "    dbapi = dbapi_meth(**dbapi_args)",
        f'sqlalchemy.exc.OperationalError: (psycopg2.OperationalError) connection to server at "{ip}", port 5432 failed: FATAL:  password authentication failed for user "svc_reporting"',
        "(Background on this error at: https://sqlalche.me/e/20/e3q8)",
        f"[settings] WAREHOUSE_DSN='postgresql+psycopg2://svc_reporting:{p}@{ip}:5432/warehouse'",
    ])
    return text, [("url_credentials", f"svc_reporting:{p}")], "traceback followed by a settings dump containing a DSN with password"


@P
def py_tb_openai_locals():
    k = openai_proj("proj")
    text = "\n".join([
        "Traceback (most recent call last):",
        '  File "/app/worker/summarize.py", line 42, in summarize',
        "    resp = client.chat.completions.create(model=MODEL, messages=msgs)",
        f"openai.RateLimitError: Error code: 429 - {{'error': {{'message': 'Rate limit reached for gpt-4o-mini in organization org-{rs(ALNUM, 24)} on tokens per min (TPM): Limit 200000, Used 199812, Requested 1204.', 'type': 'tokens', 'code': 'rate_limit_exceeded'}}}}",
        "",
        "Locals at frame summarize:",
        f"    api_key = '{k}'",
        "    MODEL = 'gpt-4o-mini'",
        "    retries = 3",
    ])
    return text, [("openai_key", k)], "traceback with locals exposes a project key"


@P
def py_tb_anthropic_headers():
    k = anthropic()
    text = "\n".join([
        'DEBUG:httpx:HTTP Request: POST https://api.anthropic.com/v1/messages "HTTP/1.1 529 Overloaded"',
        f"DEBUG:anthropic._base_client:Request options: {{'method': 'post', 'url': '/v1/messages', 'headers': {{'x-api-key': '{k}', 'anthropic-version': '2023-06-01'}}, 'json_data': {{'max_tokens': 1024, 'model': 'claude-sonnet-4-5'}}}}",
        "Traceback (most recent call last):",
        '  File "/srv/bot/handlers.py", line 131, in on_message',
        "    reply = await client.messages.create(**payload)",
        "anthropic.InternalServerError: Error code: 529 - {'type': 'error', 'error': {'type': 'overloaded_error', 'message': 'Overloaded'}}",
    ])
    return text, [("anthropic_key", k)], "debug log of request options includes x-api-key"


@P
def py_tb_sendgrid():
    k = sendgrid()
    text = "\n".join([
        "Traceback (most recent call last):",
        '  File "/srv/mailer/send.py", line 57, in send_receipt',
        "    sg.send(message)",
        '  File "/usr/local/lib/python3.11/site-packages/python_http_client/client.py", line 204, in _make_request',
        "    raise exc",
        "python_http_client.exceptions.UnauthorizedError: HTTP Error 401: Unauthorized",
        "Local variables (most recent frame):",
        f"  self.api_key = '{k}'",
        "  self.host = 'https://api.sendgrid.com'",
    ])
    return text, [("sendgrid_key", k)], "SendGrid key in a frame-locals dump"


@P
def py_tb_slack_sdk():
    t = slack_tok("xoxb")
    text = "\n".join([
        "Traceback (most recent call last):",
        '  File "/srv/notifier/post.py", line 19, in <module>',
        f"    client = WebClient(token='{t}')",
        '  File "/srv/notifier/post.py", line 23, in <module>',
        "    client.chat_postMessage(channel='#deploys', text=msg)",
        "slack_sdk.errors.SlackApiError: The request to the Slack API failed. (url: https://slack.com/api/chat.postMessage)",
        "The server responded with: {'ok': False, 'error': 'channel_not_found'}",
    ])
    return text, [("slack_token", t)], "bot token literal shown in traceback source line"


# ---------------------------------------------------------- config files --

@P
def npmrc_full():
    tok, mail = npm_tok(), f"frontend-builds@{R.choice(DOMAINS)}"
    text = "\n".join([
        "; ~/.npmrc",
        "registry=https://registry.npmjs.org/",
        "@quillfeather:registry=https://npm.pkg.github.com/",
        f"//registry.npmjs.org/:_authToken={tok}",
        "//npm.pkg.github.com/:_authToken=${GITHUB_PACKAGES_TOKEN}",
        f"email={mail}",
        "always-auth=true",
        "save-exact=true",
    ])
    return text, [("npm_token", tok), ("email", mail)], ".npmrc with a literal npm token and an e-mail; the ${} line is a placeholder"


@P
def yarnrc_npm():
    tok = npm_tok()
    text = "\n".join([
        "# .yarnrc.yml",
        "nodeLinker: node-modules",
        'npmRegistryServer: "https://registry.npmjs.org"',
        f"npmAuthToken: {tok}",
        "npmScopes:",
        "  quillfeather:",
        "    npmAlwaysAuth: true",
        '    npmAuthToken: "${QF_NPM_TOKEN}"',
    ])
    return text, [("npm_token", tok)], "Yarn berry config with one literal token"


@P
def netrc_tokens():
    tok = gh_classic("ghp")
    mail = f"ops.deploy@{R.choice(DOMAINS)}"
    text = "\n".join([
        "machine github.com",
        "  login octo-release",
        f"  password {tok}",
        "machine api.heroku.com",
        f"  login {mail}",
        f"  password {uuid4()}",
        "default login anonymous password guest",
    ])
    return text, [("github_token", tok), ("email", mail)], ".netrc: classic PAT as password, e-mail as login"


@P
def gitconfig_url_creds():
    tok = glpat(R.randint(20, 24))
    dom = "tidewater-analytics.co.uk"
    mail = f"aoife.brennan@{dom}"
    text = "\n".join([
        "[user]",
        "\tname = Aoife Brennan",
        f"\temail = {mail}",
        f"\tsigningkey = {rs('0123456789ABCDEF', 16)}",
        f'[url "https://oauth2:{tok}@gitlab.{dom}/"]',
        f"\tinsteadOf = https://gitlab.{dom}/",
        "[credential]",
        "\thelper = cache --timeout=3600",
        "[pull]",
        "\trebase = true",
    ])
    return text, [("email", mail), ("url_credentials", f"oauth2:{tok}"), ("gitlab_token", tok)], ".gitconfig insteadOf URL embeds a GitLab PAT"


@P
def aws_credentials_file():
    k1, s1, k2, s2 = aws_key_id("ABIA"), aws_secret(), aws_key_id("ACCA"), aws_secret()
    text = "\n".join([
        "[default]",
        f"aws_access_key_id = {k1}",
        f"aws_secret_access_key = {s1}",
        "region = us-west-2",
        "",
        "[profile billing-ro]",
        f"aws_access_key_id={k2}",
        f"aws_secret_access_key={s2}",
        "output = json",
    ])
    return text, [("aws_access_key_id", k1), ("aws_secret_access_key", s1), ("aws_access_key_id", k2), ("aws_secret_access_key", s2)], "~/.aws/credentials with the rarer ABIA/ACCA prefixes, spaced and unspaced '='"


@P
def sts_json():
    kid, sec, acct = aws_key_id("ASIA"), aws_secret(), digits(12, "3")
    text = jdump({"Credentials": {"AccessKeyId": kid, "SecretAccessKey": sec, "SessionToken": "IQoJb3JpZ2luX2Vj" + rs(B64, 200),
                                  "Expiration": "2025-11-30T18:04:11+00:00"},
                  "AssumedRoleUser": {"AssumedRoleId": f"AROA{rs(B32, 17)}:ci-session", "Arn": f"arn:aws:sts::{acct}:assumed-role/deploy/ci-session"}}, 4)
    return text, [("aws_access_key_id", kid), ("aws_secret_access_key", sec)], "aws sts assume-role JSON (SecretAccessKey spelling); AROA role id is not a key"


@P
def js_s3_client():
    kid, sec = aws_key_id("AKIA"), aws_secret()
    text = "\n".join([
        "// src/lib/s3.ts (committed by mistake, see INC-2291)",
        "export const s3 = new S3Client({",
        "  region: 'eu-west-1',",
        "  credentials: {",
        f"    accessKeyId: '{kid}',",
        f"    secretAccessKey: '{sec}',",
        "  },",
        "});",
    ])
    return text, [("aws_access_key_id", kid), ("aws_secret_access_key", sec)], "camelCase secretAccessKey in TypeScript"


@P
def cli_flag_secret():
    kid, sec = aws_key_id("AKIA"), aws_secret()
    text = "\n".join([
        f"$ ./bin/backup-runner --bucket s3://qf-db-backups-prod --aws-access-key-id {kid} --aws-secret-access-key={sec} --retain 14",
        "[backup-runner] 2025-11-30 02:00:01 starting pg_dump (database=orders, jobs=4)",
        f"[backup-runner] 2025-11-30 02:14:37 uploaded orders-20251130T020001Z.dump.zst ({R.randint(1, 9)}.{R.randint(0, 9)} GiB)",
    ])
    return text, [("aws_access_key_id", kid), ("aws_secret_access_key", sec)], "kebab-case flag secret-access-key=VALUE"


# --------------------------------------------------------- docker inspect --

def docker_inspect(env, labels=None, image="ghcr.io/quillfeather/shop-api:2.7.1"):
    return jdump([{
        "Id": hexs(64), "Created": ts_iso().replace("Z", ".%09dZ" % R.randint(0, 999999999)),
        "Path": "docker-entrypoint.sh", "Args": ["node", "server.js"],
        "State": {"Status": "running", "Running": True, "Pid": R.randint(1000, 60000), "ExitCode": 0},
        "Image": "sha256:" + hexs(64), "Name": "/" + image.split("/")[-1].split(":")[0] + "-1",
        "Config": {"Hostname": hexs(12), "Env": env, "Image": image, "Labels": labels or {}},
    }], 4)


@P
def docker_env_db_sendgrid():
    p, k = pw(22), sendgrid()
    env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "NODE_VERSION=20.18.0",
           f"DATABASE_URL=mysql://shop:{p}@mysql-primary:3306/shop", f"SENDGRID_API_KEY={k}", "PORT=8080"]
    return docker_inspect(env), [("url_credentials", f"shop:{p}"), ("sendgrid_key", k)], "docker inspect Env with DB URL password and SendGrid key"


@P
def docker_env_openai_legacy():
    k = openai_legacy()
    env = ["PATH=/usr/local/bin:/usr/bin:/bin", "PYTHON_VERSION=3.12.7", f"OPENAI_API_KEY={k}", "WORKERS=4"]
    return docker_inspect(env, image="ghcr.io/quillfeather/summarizer:0.9.3"), [("openai_key", k)], "legacy sk- key recognised by the T3BlbkFJ marker"


@P
def compose_azure():
    key = azure_key()
    text = "\n".join([
        "services:",
        "  blob-sync:",
        "    image: mcr.microsoft.com/azure-cli:2.67.0",
        "    environment:",
        f'      AZURE_STORAGE_CONNECTION_STRING: "DefaultEndpointsProtocol=https;AccountName=qfbackups;AccountKey={key};EndpointSuffix=core.windows.net"',
        "    command: az storage blob sync -c nightly -s /backups",
    ])
    return text, [("azure_storage_key", key)], "docker-compose environment with an Azure connection string"


@P
def appsettings_azure():
    key = azure_key()
    text = jdump({"Logging": {"LogLevel": {"Default": "Information"}},
                  "ConnectionStrings": {"Blob": f"DefaultEndpointsProtocol=https;AccountName=qfmediaprod;AccountKey={key};EndpointSuffix=core.windows.net"},
                  "AllowedHosts": "*"})
    return text, [("azure_storage_key", key)], "appsettings.json connection string"


# ------------------------------------------------------- support chats --

@P
def chat_card_phone_en():
    pan = card("4", 16)
    ph = na_phone("paren")
    g = grp(pan, " ")
    text = "\n".join([
        f"[14:02] Customer (Jordan P.): hi, my order #A-{R.randint(10000, 99999)} got charged twice",
        "[14:03] Agent Mia: Sorry about that! Can you confirm the card you used?",
        f"[14:03] Customer (Jordan P.): {g} exp 03/28",
        "[14:04] Agent Mia: Thanks. And a callback number in case we get disconnected?",
        f"[14:04] Customer (Jordan P.): {ph}, after 5pm please",
        f"[14:05] Agent Mia: Got it, refund of ${R.randint(10, 99)}.{R.randint(10, 99)} is on the way (ref RF-2025-{R.randint(100000, 999999)}).",
    ])
    return text, [("payment_card", g), ("phone", ph)], "customer pastes a spaced Visa and a (NXX) NXX-XXXX number"


@P
def chat_es_email_phone():
    mail = email("casa-tramonto.es", "f.l")
    ph = f"+34 6{digits(2)} {digits(3)} {digits(3)}"
    text = "\n".join([
        "Cliente: Hola, no me llega el correo de confirmación del pedido.",
        "Agente: ¿Nos confirma su dirección de correo y un teléfono de contacto?",
        f"Cliente: Claro: {mail} , y mi móvil es {ph}.",
        "Agente: Gracias. Reenviamos el correo ahora mismo.",
    ])
    return text, [("email", mail), ("phone", ph)], "Spanish chat; phone ends before a full stop"


@P
def chat_de_iban_phone():
    ib = iban_sp(iban("DE"))
    ph = f"+49 151 {digits(4)} {digits(4)}"
    text = "\n".join([
        f"Kunde: Bitte erstatten Sie den Betrag auf mein Konto: IBAN {ib}, Kontoinhaber Jonas Albrecht.",
        "Support: Danke! Unter welcher Nummer erreichen wir Sie für Rückfragen?",
        f"Kunde: {ph} (ab 17 Uhr).",
    ])
    return text, [("iban", ib), ("phone", ph)], "German chat: spaced IBAN and mobile number"


@P
def chat_fr_card_dashes():
    pan = card(R.choice(["51", "53", "55"]), 16)
    g = grp(pan, "-")
    text = "\n".join([
        f"Client : Bonjour, le paiement est refusé. Numéro de carte : {g}, expiration 09/27.",
        "Conseiller : Merci. Pour des raisons de sécurité, ne partagez jamais le cryptogramme.",
    ])
    return text, [("payment_card", g)], "French chat: dash-grouped Mastercard"


@P
def chat_ja_email_phone():
    mail = f"hiroshi.tanaka@hoshizora-shoji.co.jp"
    ph = f"+81-90-{digits(4)}-{digits(4)}"
    text = "\n".join([
        "お客様: 注文の配送先を変更したいです。",
        "担当: 承知しました。ご登録のメールアドレスとお電話番号をお願いします。",
        f"お客様: メール: {mail} 、電話: {ph} です。",
        "担当: ありがとうございます。変更を承りました。",
    ])
    return text, [("email", mail), ("phone", ph)], "Japanese chat, findings separated by spaces"


@P
def chat_es_webhook():
    hook = slack_hook()
    text = f"Agente: Para las alertas usamos este webhook: https://{hook} -- ¿lo puedes probar desde staging?\nCliente: Sí, ahora lo pruebo."
    return text, [("slack_webhook", hook)], "Spanish chat sharing a webhook"


@P
def chat_ssh_key_paste():
    key = pem_block("OPENSSH PRIVATE KEY", P_SSH, 360, width=70)
    text = f"[09:41] devon: here's the deploy key for the staging box, can you add it?\n[09:41] devon: {key}\n[09:42] ana: please don't paste private keys here, rotating it now"
    return text, [("private_key", key)], "OpenSSH private key pasted in team chat"


@P
def chat_de_jwt_period():
    tok = jwt({"alg": "HS256", "typ": "JWT"}, {"sub": "kunde-" + digits(5), "role": "support", "exp": R.randint(1760000000, 1790000000)}, 43)
    text = f"Hallo Support, hier ist mein Token zum Testen: {tok}. Es läuft morgen ab, bitte schnell prüfen."
    return text, [("jwt", tok)], "JWT followed by a sentence-ending period"


@P
def chat_anthropic_edge():
    k = "sk-ant-" + rs(ALNUM, 86)
    text = f"Kollege: Der neue Schlüssel für die Staging-Umgebung lautet {k} -- bitte nur in Vault ablegen."
    assert len(k) - 3 == 90
    return text, [("anthropic_key", k)], "anthropic key with exactly 90 chars after sk- (edge)"


@P
def chat_openai_edge():
    k = "sk-proj-" + rs(ALNUM, 35)
    assert len(k) - 3 == 40
    text = f"Agent: I generated a temporary key for your sandbox: {k} (expires Friday)."
    return text, [("openai_key", k)], "sk-proj- key with exactly 40 chars after sk- (edge)"


@P
def chat_gitlab_edge():
    tok = "glpat-" + rs(ALNUM, 20)
    text = f"fyi the old token was {tok}. I've revoked it in the admin area, new one is in 1Password."
    return text, [("gitlab_token", tok)], "glpat with exactly 20 chars, trailing sentence dot excluded"


# -------------------------------------------------------------- invoices --

@P
def invoice_fr():
    ib = iban_sp(iban("FR"))
    mail = "compta@lumenforge.fr"
    ph = f"+33 4 72 {digits(2)} {digits(2)} {digits(2)}"
    text = "\n".join([
        f"FACTURE N° FA-2025-{R.randint(100, 999):05d}",
        "Date : 30/11/2025 -- Échéance : 30/12/2025",
        "Lumenforge SAS · 14 rue des Tanneurs · 69002 Lyon",
        f"Contact facturation : {mail} · {ph}",
        "",
        "Désignation                          Qté    PU HT      Total HT",
        "Licence Quiver Team (annuelle)        12    480,00     5 760,00",
        "Support premium                        1    990,00       990,00",
        "Total TTC : 8 100,00 EUR",
        f"Règlement par virement : IBAN {ib} · BIC LUMFFRPPXXX",
    ])
    return text, [("email", mail), ("phone", ph), ("iban", ib)], "French invoice: billing contact and spaced IBAN (27 chars)"


@P
def invoice_nl():
    ib = iban("NL")
    text = "\n".join([
        f"Factuur 2025-{R.randint(1000, 9999)}",
        f"Polderbank Klantenservice BV -- KvK {digits(8, '8')} -- btw NL{digits(9)}B01",
        f"Gelieve binnen 14 dagen over te maken op {ib} t.n.v. Polderbank Klantenservice BV, o.v.v. het factuurnummer.",
    ])
    return text, [("iban", ib)], "Dutch invoice: contiguous NL IBAN; VAT id is not an IBAN"


@P
def invoice_ch_spaced():
    ib = iban_sp(iban("CH"))
    text = "\n".join([
        "Rechnung 2025-11-0418 · Zahlbar innert 30 Tagen",
        f"Zahlbar an: Nordwald AG, Bahnhofstrasse 7, 8001 Zürich, Konto / Zahlbar an: {ib}",
        "Referenz: 21 00000 00003 13947 14300 09017",
    ])
    return text, [("iban", ib)], "Swiss QR-bill style text: 21-char IBAN in groups; reference number is not a card (starts 21)"


@P
def iban_edges():
    no, mt, lc = iban("NO"), iban("MT"), iban("LC")
    no_s, mt_s, lc_s = iban_sp(no), iban_sp(mt), iban_sp(lc)
    text = "\n".join([
        "Treasury -- beneficiary whitelist (reviewed 2025-11-28)",
        f"- Oslo office ..... {no_s}",
        f"- Valletta escrow . {mt_s}",
        f"- Castries agent .. {lc}",
    ])
    return text, [("iban", no_s), ("iban", mt_s), ("iban", lc)], "IBAN length edges: Norway 15, Malta 31, Saint Lucia 32 (contiguous)"


# ----------------------------------------------------------------- prose --


@P
def prose_es_iban():
    ib = iban_sp(iban("ES"))
    text = f"Le recordamos que la cuota de noviembre (85,00 €) se cargará en la cuenta {ib} el día 5. Si desea cambiar la domiciliación, responda a este correo."
    return text, [("iban", ib)], "Spanish notice with spaced ES IBAN (6 full groups)"


@P
def prose_it_iban_email():
    ib = iban("IT")
    mail = f"amministrazione@ferrovia-sud.it"
    text = f"Gentile cliente, il bonifico va effettuato sul conto {ib} intestato a Ferrovia Sud S.r.l.; per domande scriva a {mail}."
    return text, [("iban", ib), ("email", mail)], "Italian prose; IT IBAN contains a CIN letter"


@P
def prose_fr_card_amex():
    pan = card(R.choice(["34", "37"]), 15)
    g = grp(pan, " ")
    text = f"Pour la réservation, j'ai utilisé ma carte American Express {g} ; merci de ne débiter qu'une seule nuit."
    return text, [("payment_card", g)], "Amex in 4-6-5 groups in French prose"


@P
def prose_ja_jcb():
    pan = card(str(R.randint(3528, 3589)), 16)
    g = grp(pan, " ")
    text = f"お支払いカード: {g} （有効期限 04/29）で決済をお願いします。"
    return text, [("payment_card", g)], "JCB in Japanese text, separated by spaces"


@P
def prose_en_contacts_edges():
    fk = f"+500 {digits(5, '2')}"
    itn = f"+882 {digits(4)} {digits(4)} {digits(4)}"
    text = "\n".join([
        "Remote sites directory",
        f"Stanley office (Falklands): {fk}",
        f"Vessel satellite line: {itn}",
        "Use the satellite line only for emergencies.",
    ])
    return text, [("phone", fk), ("phone", itn)], "international phone length edges: 8 digits and 15 digits"


# ------------------------------------------------ more context / formats --

@P
def pem_cat_pkcs8():
    key = pem_block("PRIVATE KEY", P_PKCS8, 1190)
    text = f"$ cat /tmp/signing/key.pem\n{key}\n$ openssl dgst -sha256 -sign /tmp/signing/key.pem -out release.sig release.tar.gz"
    return text, [("private_key", key)], "unlabelled PKCS#8 key printed by cat in a CI step"


@P
def pem_encrypted_ticket():
    key = pem_block("ENCRYPTED PRIVATE KEY", P_ENC, 1290)
    text = (f"Ticket #{R.randint(10000, 99999)} -- Subject: cannot import key into HSM\n"
            "Hi team, the import tool rejects this file (passphrase sent separately):\n\n"
            f"{key}\n\nError: PKCS#8 parse failed at offset 1218")
    return text, [("private_key", key)], "encrypted PKCS#8 block is still a private key"


@P
def pem_pgp_block():
    crc = base64.b64encode(R.randbytes(3)).decode()
    key = pem_block("PGP PRIVATE KEY BLOCK", b"\x95\x03\x98\x04", 900, extra=[""], trailer=["=" + crc])
    text = f'From a paste titled "backup keys (old laptop)":\n{key}\n(end of paste)'
    return text, [("private_key", key)], "armored PGP private key block"


@P
def pem_truncated():
    key = pem_block("RSA PRIVATE KEY", P_RSA, 400, end=False)
    text = f"2025-11-30 03:12:44 WARN  config-loader: unexpected key material in SSH_KEY env (len=1679), dumping first lines for debugging:\n{key}"
    return text, [("private_key", key)], "no END line: span runs to end of text"


@P
def pem_dsa_ls():
    key = pem_block("DSA PRIVATE KEY", P_DSA, 430)
    text = "\n".join([
        "$ ls -la ~/.ssh && cat ~/.ssh/id_dsa",
        "total 16",
        "drwx------  2 build build 4096 Mar  3  2019 .",
        "-rw-------  1 build build  668 Mar  3  2019 id_dsa",
        "-rw-r--r--  1 build build  606 Mar  3  2019 id_dsa.pub",
        key,
    ])
    return text, [("private_key", key)], "DSA key from an old home directory dump"


@P
def gh_oauth_gho():
    tok = gh_classic("gho")
    text = "\n".join([
        "POST https://github.com/login/oauth/access_token",
        "< HTTP/2 200",
        "< content-type: application/json; charset=utf-8",
        json.dumps({"access_token": tok, "token_type": "bearer", "scope": "read:org,repo"}, separators=(",", ":")),
    ])
    return text, [("github_token", tok)], "OAuth app token exchange response"


@P
def gh_app_user_tokens():
    a, r = gh_classic("ghu"), gh_classic("ghr")
    text = "Refreshed user-to-server token:\n" + json.dumps({"access_token": a, "expires_in": 28800, "refresh_token": r,
                                                             "refresh_token_expires_in": 15811200, "scope": "", "token_type": "bearer"})
    return text, [("github_token", a), ("github_token", r)], "GitHub App ghu_/ghr_ pair"


@P
def gh_pat_edge_60():
    tok = gh_pat(60)
    assert len(tok) - len("github_pat_") == 60
    text = "\n".join(["# .env.ci", "GITHUB_OWNER=quillfeather", f"GITHUB_TOKEN={tok}", "RENOVATE_PLATFORM=github"])
    return text, [("github_token", tok)], "github_pat_ with exactly 60 chars (lower edge)"


@P
def gitlab_tf_debug_dotted():
    tok = "glpat-" + rs(ALNUM, 1) + rs(URLSAFE, 25) + rs(ALNUM, 1) + ".01." + rs(ALNUM, 9)
    text = (f"{ts_iso()} [DEBUG] provider.terraform-provider-gitlab_v17.5.0: GitLab API request: "
            f"method=GET url=https://gitlab.kestrel-ops.dev/api/v4/projects/118 header.PRIVATE-TOKEN={tok} tf_rpc=ReadResource")
    return text, [("gitlab_token", tok)], "new-style glpat with internal dots in TF_LOG=DEBUG output"


@P
def slack_env_tokens():
    a = slack_tok("xoxp")
    b = f"xoxa-2-{digits(11, '4')}-{digits(13)}-{hexs(32)}"
    text = "\n".join(["# .env.local", f"SLACK_USER_TOKEN={a}", f"SLACK_LEGACY_WORKSPACE_TOKEN={b}", "SLACK_CHANNEL=#deploys"])
    return text, [("slack_token", a), ("slack_token", b)], ".env with user and legacy workspace tokens"


@P
def slack_rotation_json():
    a = slack_tok("xoxb")
    r = f"xoxe-1-{rs(ALNUM, 60)}-{digits(13)}"
    text = "oauth.v2.access -> " + json.dumps({"ok": True, "access_token": a, "token_type": "bot", "refresh_token": r, "expires_in": 43200})
    return text, [("slack_token", a), ("slack_token", r)], "token rotation response with bot and xoxe refresh tokens"


@P
def slack_edge_15():
    t = f"xoxs-{digits(4, '1')}-{digits(10)}"
    assert len(t) - 5 == 15
    r = f"xoxr-{digits(3, '7')}-{rs(ALNUM, 30)}"
    text = f"auth.test ok user=U07{rs(UPDG, 6)} team=T01{rs(UPDG, 6)} token={t} scopes=client\nlegacy refresh={r}"
    return text, [("slack_token", t), ("slack_token", r)], "slack token with exactly 15 chars after prefix (edge) and an xoxr token"


@P
def google_services_json():
    g = google_key()
    pn = digits(12, "8")
    text = jdump({"project_info": {"project_number": pn, "project_id": "qf-mobile-prod", "storage_bucket": "qf-mobile-prod.appspot.com"},
                  "client": [{"client_info": {"mobilesdk_app_id": f"1:{pn}:android:{hexs(16)}", "android_client_info": {"package_name": "io.quillfeather.app"}},
                              "api_key": [{"current_key": g}]}], "configuration_version": "1"})
    return text, [("google_api_key", g)], "google-services.json current_key"


@P
def android_manifest_google():
    g = google_key()
    text = "\n".join([
        "<application android:label=\"@string/app_name\" android:icon=\"@mipmap/ic_launcher\">",
        "    <meta-data",
        '        android:name="com.google.android.geo.API_KEY"',
        f'        android:value="{g}" />',
        "</application>",
    ])
    return text, [("google_api_key", g)], "AndroidManifest meta-data key; @string refs are not e-mails"


@P
def stripe_test_locals():
    k = stripe("sk_test_", 99)
    rk = stripe("rk_test_", R.choice([24, 40]))
    text = "\n".join([
        "stripe._error.AuthenticationError: Request req_" + rs(ALNUM, 14) + ": Invalid API Key provided",
        "  locals:",
        f"    stripe.api_key = '{k}'",
        f"    REPORTING_KEY = '{rk}'",
        f"    STRIPE_WEBHOOK_SECRET = 'whsec_{rs(ALNUM, 32)}'",
    ])
    return text, [("stripe_key", k), ("stripe_key", rk)], "test-mode secret and restricted keys; whsec_ is not a spec kind"


@P
def openai_svcacct_admin():
    a, b = openai_proj("svcacct"), openai_proj("admin", 80)
    text = "\n".join(["# deploy/summarizer.env", f"OPENAI_API_KEY={a}", f"OPENAI_ADMIN_KEY={b}", f"OPENAI_ORG=org-{rs(ALNUM, 24)}"])
    return text, [("openai_key", a), ("openai_key", b)], "service-account and admin key prefixes"


@P
def anthropic_admin_env():
    k = anthropic("admin01")
    text = f"ANTHROPIC_ADMIN_KEY={k}\nANTHROPIC_WORKSPACE=wrkspc_{rs(ALNUM, 24)}\n"
    return text, [("anthropic_key", k)], "admin key in an env file"


@P
def hf_notebook():
    t = hf_tok()
    text = "\n".join([
        "In [3]: from huggingface_hub import login",
        f'In [4]: login(token="{t}")',
        "Token is valid (permission: write).",
        "Your token has been saved to /home/jovyan/.cache/huggingface/token",
        "Login successful",
    ])
    return text, [("huggingface_token", t)], "notebook transcript"


@P
def hf_cli():
    t = hf_tok()
    text = f"$ huggingface-cli login --token {t} --add-to-git-credential\nToken has not been saved to git credential helper.\nLogin successful"
    return text, [("huggingface_token", t)], "CLI invocation with the token"


@P
def oauth_tokens_json():
    iat = R.randint(1740000000, 1760000000)
    idt = jwt({"alg": "RS256", "kid": hexs(20), "typ": "JWT"}, {"iss": "https://login.ambergrove.com", "sub": uuid4(), "aud": "web", "iat": iat, "exp": iat + 3600, "nonce": hexs(16)}, 342)
    at = jwt({"alg": "ES256", "typ": "at+jwt"}, {"scope": "openid profile", "client_id": "web", "iat": iat}, 86)
    text = "token endpoint response:\n" + jdump({"access_token": at, "token_type": "Bearer", "expires_in": 3600,
                                                 "refresh_token": rs(URLSAFE, 64), "id_token": idt})
    return text, [("jwt", at), ("jwt", idt)], "OIDC response with two JWTs; opaque refresh token is not a finding"


@P
def config_dump_urls():
    p1, p2, p3 = pw(20), pw(32), pw(16)
    text = "\n".join([
        "$ ./manage.py print_settings --format=ini | grep -E 'url|uri'",
        f"celery.broker_url = amqp://celery:{p1}@rabbitmq.internal:5672//",
        f"cache.url = rediss://default:{p2}@redis-{R.randint(10000, 99999)}.c1.eu-west-1.cache.amazonaws.com:6380/0",
        f"mongo.uri = mongodb+srv://analytics_ro:{p3}@cluster0.{rs(LO + DG, 5)}.mongodb.net/?retryWrites=true&w=majority",
        "static.url = https://cdn.quillfeather.io/static/",
    ])
    return text, [("url_credentials", f"celery:{p1}"), ("url_credentials", f"default:{p2}"), ("url_credentials", f"analytics_ro:{p3}")], "three connection URIs with inline passwords"


@P
def pip_index_url():
    p = rs(ALNUM, 6) + "%21" + rs(ALNUM, 10)
    text = f"$ pip config list\nglobal.extra-index-url='https://deploy:{p}@pypi.ferrovia-sud.it/simple'\nglobal.timeout='60'"
    return text, [("url_credentials", f"deploy:{p}")], "percent-encoded password in pip index URL"


@P
def csv_email_64():
    local = rs(LO, 30) + "." + rs(LO, 33)
    assert len(local) == 64
    mail = f"{local}@ambergrove.com"
    text = f"user_id,email,signup_source\n{R.randint(10000, 99999)},{mail},newsletter\n{R.randint(10000, 99999)},,import"
    return text, [("email", mail)], "local part of exactly 64 chars (edge)"


@P
def postfix_log_emails():
    m1 = f"zhang.wei{R.randint(10, 99)}@163.com"
    m2 = f"ANNA.KOWALSKI@FIRMA-NORD.PL"
    m3 = f"billing+eu@casa-tramonto.es"
    qid = lambda: rs("0123456789ABCDEF", 11)
    text = "\n".join([
        f"Nov 30 04:12:09 mx1 postfix/smtp[{R.randint(1000, 30000)}]: {qid()}: to=<{m1}>, relay=mx.163.com[220.181.12.17]:25, delay=1.2, delays=0.02/0/0.61/0.57, dsn=2.0.0, status=sent (250 Mail OK)",
        f"Nov 30 04:12:11 mx1 postfix/smtp[{R.randint(1000, 30000)}]: {qid()}: to=<{m2}>, relay=mx.firma-nord.pl[10.3.4.5]:25, delay=0.8, dsn=2.0.0, status=sent (250 OK)",
        f"Nov 30 04:12:15 mx1 postfix/smtp[{R.randint(1000, 30000)}]: {qid()}: to=<{m3}>, relay=none, delay=30, dsn=4.4.1, status=deferred (connect timed out)",
    ])
    return text, [("email", m1), ("email", m2), ("email", m3)], "mail log: numeric-first domain, upper-case address, plus-addressing"


@P
def git_log_author():
    mail = "sofia.ibarra@ferrovia-sud.it"
    text = "\n".join([
        f"commit {hexs(40)}",
        f"Author: Sofía Ibarra <{mail}>",
        "Date:   Fri Nov 28 16:40:12 2025 +0100",
        "",
        "    fix(billing): round VAT per line, not per invoice",
        "",
        f"commit {hexs(40)}",
        f"Author: renovate[bot] <{R.randint(10000000, 99999999)}+renovate[bot]@users.noreply.github.com>",
        "Date:   Thu Nov 27 02:11:09 2025 +0000",
        "",
        "    chore(deps): update dependency vitest to v2.1.6",
    ])
    return text, [("email", mail)], "git log; the renovate[bot] address has brackets so its local part is not valid"


@P
def json_bare_card():
    pan = card("65", 16)
    up = card("62", 19)
    text = f"{ts_iso()} WARN payment.failed " + json.dumps({"event": "payment.failed", "card": {"number": int(pan), "exp_month": R.randint(1, 12), "exp_year": 2028},
                                                         "fallback": {"unionpay_pan": up, "attempt": 2}})
    return text, [("payment_card", pan), ("payment_card", up)], "card as a bare JSON number (Discover 65) and a 19-digit UnionPay string"


@P
def invoice_cards_misc():
    d = card(str(R.randint(300, 305)), 14)
    m = card("6304", 16)
    v13 = card("4", 13)
    d644 = card(str(R.randint(644, 649)), 16)
    text = "\n".join([
        "Payments received -- November",
        f"  Diners Club ........ {grp(d, ' ')}   EUR 412,00",
        f"  Maestro ............ {grp(m, '-')}   EUR 89,90",
        f"  Visa (legacy 13) ... {v13}   EUR 15,00",
        f"  Discover ........... {grp(d644, ' ')}   USD 240.00",
    ])
    return text, [("payment_card", grp(d, " ")), ("payment_card", grp(m, "-")), ("payment_card", v13), ("payment_card", grp(d644, " "))], "Diners 14 (4-6-4), Maestro dashed, Visa 13 contiguous, Discover 644-649"


@P
def visa19_unionpay_log():
    v = card("4", 19)
    g = grp(v, "-")
    mae = card("67", 19)
    text = f"[pos-gateway] txn={uuid4()} status=DECLINED pan={g} reason=do_not_honor\n[pos-gateway] txn={uuid4()} status=OK pan={mae} amount=12.50"
    return text, [("payment_card", g), ("payment_card", mae)], "19-digit Visa (dashed 4-4-4-4-3) and 19-digit Maestro in a gateway log"


# ==========================================================================
# NEGATIVES
# ==========================================================================

def N(fn, n=1):
    return reg(fn, n)


@N
def n_gha_masked():
    text = gha([
        "##[group]Run aws-actions/configure-aws-credentials@v4",
        "with:",
        "  aws-access-key-id: ***",
        "  aws-secret-access-key: ***",
        "  aws-region: eu-central-1",
        "##[endgroup]",
        "Proceeding with IAM user credentials",
        "##[group]Run actions/checkout@v4",
        "Syncing repository: quillfeather/payments-api",
        f"Author: dependabot[bot] <49699333+dependabot[bot]@users.noreply.github.com>",
        f"HEAD is now at {hexs(7)} chore(deps): bump axios from 1.7.7 to 1.7.9",
    ])
    return text, [], "secrets masked as ***; action@version; bracketed bot address"


@N
def n_gitlab_masked():
    text = "\n".join([
        '$ git remote set-url origin "https://gitlab-ci-token:${CI_JOB_TOKEN}@gitlab.kestrel-ops.dev/platform/api.git"',
        '$ echo "https://gitlab-ci-token:[MASKED]@gitlab.kestrel-ops.dev/platform/api.git"',
        "https://gitlab-ci-token:[MASKED]@gitlab.kestrel-ops.dev/platform/api.git",
        '$ curl --header "PRIVATE-TOKEN: $GITLAB_API_TOKEN" "https://gitlab.kestrel-ops.dev/api/v4/projects/118/pipelines?per_page=5"',
        f'[{{"id":{R.randint(100000, 999999)},"iid":{R.randint(100, 999)},"status":"success","ref":"main","sha":"{hexs(40)}"}}]',
    ])
    return text, [], "URL passwords are ${VAR} and [MASKED] placeholders"


@N
def n_slack_webhook_malformed():
    text = "\n".join([
        "[Pipeline] sh",
        f"+ curl -X POST https://hooks.slack.com/services/T{rs(UPDG, 9)}/B{rs(UPDG, 10)}/{rs(ALNUM, 23)}",
        '{"error": "invalid_token"}',
        f"+ curl -X POST https://hooks.slack.com/services/t{rs(LO + DG, 9)}/b{rs(LO + DG, 10)}/{rs(ALNUM, 24)}",
        "no_service",
        f"+ echo 'workflow trigger: https://hooks.slack.com/triggers/T{rs(UPDG, 9)}/{digits(13)}/{hexs(32)}'",
    ])
    return text, [], "webhook with 23-char secret, lower-case ids, and a triggers URL"


@N
def n_npm_env():
    text = "\n".join([
        "npm_config_cache=/home/runner/.npm",
        "npm_config_user_agent=npm/10.8.2 node/v20.18.0 linux x64 workspaces/false",
        "npm_package_name=@quillfeather/ui-kit",
        "npm_package_version=4.2.0",
        "npm_lifecycle_event=prepublishOnly",
        f"NPM_TOKEN_SHORT_FIXTURE=npm_{rs(ALNUM, 35)}",
        f"NPM_TOKEN_LONG_FIXTURE=npm_{rs(ALNUM, 37)}",
    ])
    return text, [], "npm_config_* vars and npm_ tokens of 35/37 chars"


@N
def n_stripe_pk_short():
    text = "\n".join([
        f"STRIPE_PUBLISHABLE_KEY=pk_live_{rs(ALNUM, 99)}",
        f"STRIPE_SECRET_KEY_TRUNCATED=sk_live_{rs(ALNUM, 23)}",
        f"STRIPE_WEBHOOK_SECRET=whsec_{rs(ALNUM, 32)}",
        f"STRIPE_ACCOUNT=acct_{rs(ALNUM, 16)}",
    ])
    return text, [], "publishable key, 23-char secret, webhook secret, account id"


@N
def n_hf_env():
    mixed = rs(LET, 20) + str(R.randint(0, 9)) + rs(LET, 13)
    text = "\n".join([
        "HF_HOME=/data/hf-cache",
        "HF_HUB_ENABLE_HF_TRANSFER=1",
        f"HF_TOKEN_OLD=hf_{rs(LET, 33)}",
        f"HF_TOKEN_BAD=hf_{mixed}",
        "from huggingface_hub import hf_hub_download",
        'path = hf_hub_download(repo_id="quillfeather/intent-small-v2", filename="model.safetensors")',
    ])
    return text, [], "hf_ with 33 letters, with a digit inside; hf_hub_download"


@N
def n_jwt_two_parts():
    h = b64u(b'{"alg":"RS256","typ":"JWT"}')
    p = b64u(json.dumps({"sub": "svc-ci", "exp": R.randint(1760000000, 1790000000)}).encode())
    text = f"> GET /v2/builds HTTP/2\n> authorization: Bearer {h}.{p}… [truncated by log filter]\n< HTTP/2 401"
    return text, [], "token truncated to two parts"


@N
def n_github_lengths():
    text = "\n".join([
        "# test/fixtures/invalid_tokens.env -- all invalid on purpose",
        f"too_short=ghp_{rs(ALNUM, 35)}",
        f"too_long=ghp_{rs(ALNUM, 37)}",
        f"wrong_prefix=ghx_{rs(ALNUM, 36)}",
        f"pat_short=github_pat_{rs(ALNUM, 22)}_{rs(ALNUM, 36)}",
    ])
    return text, [], "ghp_ with 35/37 chars, ghx_ prefix, github_pat_ with 59 chars"


@N
def n_ci_ids_and_hashes():
    text = gha([
        f"Run id {digits(10, '1')} attempt 2 on runner ubuntu-24.04 (image 20251124.1.0)",
        f"Restored cache key: node-cache-Linux-x64-npm-{hexs(64)}",
        f"Cache size: ~{R.randint(100, 900)} MB ({R.randint(100000000, 999999999)} B)",
        f"Digest: sha256:{hexs(64)}",
        f"Image: ghcr.io/quillfeather/orders-api@sha256:{hexs(64)}",
        f"Test Suites: {R.randint(50, 99)} passed, {R.randint(50, 99)} total",
        f"Time:        {R.randint(10, 99)}.{R.randint(100, 999)} s",
        f"Coverage: 87.{R.randint(10, 99)}% statements (+0.4%)",
    ])
    return text, [], "run ids, cache keys, image digests, coverage"


@N
def n_tf_plan_sensitive():
    text = "\n".join([
        "  # tls_private_key.deploy will be created",
        '  + resource "tls_private_key" "deploy" {',
        '      + algorithm                     = "ED25519"',
        '      + ecdsa_curve                   = "P224"',
        "      + id                            = (known after apply)",
        "      + private_key_openssh           = (sensitive value)",
        "      + private_key_pem               = (sensitive value)",
        "      + private_key_pem_pkcs8         = (sensitive value)",
        "      + public_key_openssh            = (known after apply)",
        "      + rsa_bits                      = 2048",
        "    }",
        "",
        "  # aws_iam_access_key.ci will be created",
        '  + resource "aws_iam_access_key" "ci" {',
        "      + id                             = (known after apply)",
        "      + secret                         = (sensitive value)",
        "      + ses_smtp_password_v4           = (sensitive value)",
        '      + user                           = "ci-deployer"',
        "    }",
        "",
        "Plan: 2 to add, 0 to change, 0 to destroy.",
    ])
    return text, [], "terraform plan with sensitive values hidden"


@N
def n_tf_state_public():
    crt, pub = cert_pem(), pub_pem()
    text = jdump({"version": 4, "resources": [{"type": "tls_self_signed_cert", "name": "edge", "instances": [{"attributes": {
        "cert_pem": crt + "\n", "early_renewal_hours": 0, "id": hexs(32),
        "validity_end_time": "2026-11-30T00:00:00Z", "public_key_pem": pub + "\n", "public_key_openssh": ssh_pub() + "\n"}}]}]})
    return text, [], "certificate, public key PEM and OpenSSH public key only"


@N
def n_tf_outputs_servicebus():
    text = "\n".join([
        "Outputs:",
        "",
        f'servicebus_connection_string = "Endpoint=sb://qf-events-prod.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={rs(B64, 43)}="',
        "storage_connection_string = <sensitive>",
        'storage_template = "DefaultEndpointsProtocol=https;AccountName=${var.account};AccountKey=${var.key};EndpointSuffix=core.windows.net"',
        f'storage_key_fingerprint = "sha256:{hexs(64)}"',
    ])
    return text, [], "Service Bus SharedAccessKey and a templated AccountKey"


@N
def n_tf_secret_other_keys():
    text = "\n".join([
        'resource "aws_secretsmanager_secret_version" "ci" {',
        "  secret_id     = aws_secretsmanager_secret.ci.id",
        "  secret_string = jsonencode({",
        f'    aws_secret_key = "{aws_secret()}"',
        f'    secret_key     = "{aws_secret()}"',
        f'    access_secret  = "{aws_secret()}"',
        "  })",
        "}",
    ])
    return text, [], "40-char values under key names other than secret_access_key"


@N
def n_k8s_secret_base64():
    kid, sec = aws_key_id(), aws_secret()
    url = f"postgres://app:{pw(20)}@pg:5432/app"
    text = "\n".join([
        "apiVersion: v1",
        "data:",
        f"  AWS_ACCESS_KEY_ID: {base64.b64encode(kid.encode()).decode()}",
        f"  AWS_SECRET_ACCESS_KEY: {base64.b64encode(sec.encode()).decode()}",
        f"  DATABASE_URL: {base64.b64encode(url.encode()).decode()}",
        "kind: Secret",
        "metadata:",
        f'  creationTimestamp: "{ts_iso()}"',
        "  name: app-env",
        "  namespace: shop",
        f'  resourceVersion: "{R.randint(10000000, 99999999)}"',
        f"  uid: {uuid4()}",
        "type: Opaque",
    ])
    return text, [], "Secret data is base64-encoded; 56-char value under AWS_SECRET_ACCESS_KEY is not 40"


@N
def n_k8s_pod():
    ip = f"10.40.{R.randint(0, 255)}.{R.randint(2, 254)}"
    text = "\n".join([
        "apiVersion: v1",
        "kind: Pod",
        "metadata:",
        f"  name: orders-api-{hexs(10)}-{rs(LO + DG, 5)}",
        "  namespace: orders",
        f"  uid: {uuid4()}",
        "spec:",
        "  containers:",
        f"  - image: ghcr.io/quillfeather/orders-api@sha256:{hexs(64)}",
        "    env:",
        "    - name: POD_IP",
        "      valueFrom:",
        "        fieldRef:",
        "          fieldPath: status.podIP",
        "    - name: DB_PASSWORD",
        "      valueFrom:",
        "        secretKeyRef: {name: orders-db, key: password}",
        f"  nodeName: ip-10-40-{R.randint(0, 255)}-{R.randint(2, 254)}.eu-central-1.compute.internal",
        "status:",
        f"  podIP: {ip}",
        f"  startTime: \"{ts_iso()}\"",
        "  containerStatuses:",
        f"  - containerID: containerd://{hexs(64)}",
        f"    imageID: ghcr.io/quillfeather/orders-api@sha256:{hexs(64)}",
        "    restartCount: 0",
    ])
    return text, [], "pod YAML: digests, IPs, secretKeyRef"


@N
def n_k8s_ca_configmap():
    text = "apiVersion: v1\ndata:\n  ca.crt: |\n    " + cert_pem().replace("\n", "\n    ") + "\nkind: ConfigMap\nmetadata:\n  name: kube-root-ca.crt\n  namespace: default"
    return text, [], "CA certificate only"


@N
def n_k8s_events():
    rows = []
    for _ in range(4):
        rows.append(f"{R.randint(2, 59)}m         Normal    {R.choice(['Pulled', 'Created', 'Started', 'Scheduled'])}   pod/worker-{hexs(9)}-{rs(LO + DG, 5)}   Successfully assigned orders/worker to ip-10-40-{R.randint(0, 255)}-{R.randint(2, 254)}")
    text = "$ kubectl get events -n orders\nLAST SEEN   TYPE      REASON     OBJECT                               MESSAGE\n" + "\n".join(rows)
    return text, [], "kubectl events table"


@N
def n_sql_masked():
    rows = [[881, "d***@gmail.com", "(***) ***-0132", "t"], [882, "m.o***@quillfeather.io", "+1 ***-***-0187", "f"],
            [883, "qa+1@staging.test", "", "t"], [884, "test-user@example.com", "", "f"]]
    return "SELECT id, email_masked, phone_masked, consent FROM customers_export LIMIT 4;\n" + psql(["id", "email_masked", "phone_masked", "consent"], rows), [], "masked contacts and reserved-domain test addresses"


@N
def n_sql_card_meta():
    bad = card("4", 16, valid=False)
    rows = [[7781203, "VISA", "4242", "424242", "tok_" + rs(ALNUM, 24)], [7781204, "MC", "4444", "555555", "tok_" + rs(ALNUM, 24)],
            [7781299, "VISA", "--", "--", grp(bad, " ") + " (luhn fail)"]]
    return mysql(["order_id", "brand", "last4", "bin", "pan_token"], rows), [], "last4/BIN columns, tokens, and a Luhn-invalid PAN"


@N
def n_sql_secret_column():
    rows = [["ci-deployer", "AKIA" + "*" * 12 + rs(B32, 4), aws_secret(), "Active"],
            ["billing-ro", "AKIA" + "*" * 12 + rs(B32, 4), aws_secret(), "Inactive"]]
    return psql(["iam_user", "access_key_id", "secret_access_key", "status"], rows), [], "40-char secrets in a table column (not key=value); masked key ids"


@N
def n_md_limits_versions():
    text = md_table(["Endpoint", "Limit", "Burst", "Since"],
                    [["`/v1/search`", "600/min", "+20%", "v2.14.3"], ["`/v1/export`", "10/min", "+5", "2025-10-01"],
                     ["`/v1/ingest`", "1200/min", "+150", "10.0.19045.3803"]])
    text += "\n\nChangelog: bumped Node to 20.18.0; TZ offset +05:30 for IST dashboards; backoff 3+4 s; build 2025.11.30.1742."
    return text, [], "versions, offsets, '3+4', percentages"


@N
def n_md_token_docs():
    text = "\n".join([
        "### Credential formats we redact",
        "- GitHub classic tokens look like `ghp_` followed by 36 characters, e.g. `ghp_<your-token-here>`.",
        "- AWS access keys start with `AKIA` (for docs use `AKIAIOSFODNN7EXAMPLE`).",
        "- Slack bot tokens start with `xoxb-`; put yours in `SLACK_BOT_TOKEN=xoxb-your-bot-token`.",
        "- Stripe keys: `sk_live_...` / `sk_test_...`; OpenAI keys: `sk-proj-...`; Anthropic: `sk-ant-...`.",
        "- GitLab: `glpat-<20+ chars>`; Hugging Face: `hf_...`; npm: `npm_...`.",
    ])
    return text, [], "documentation describing formats with placeholders"


@N
def n_html_obfuscated():
    text = "\n".join([
        '<p>Schreiben Sie uns: <span class="obf">info&#64;nordwald-gmbh.de</span> oder info [at] nordwald-gmbh [dot] de</p>',
        '<img src="/img/logo.png" srcset="/img/logo@2x.png 2x, /img/logo@3x.png 3x" alt="Nordwald">',
        '<link rel="preload" href="/fonts/inter-var@4.1.woff2" as="font">',
        '<script src="https://cdn.jsdelivr.net/npm/alpinejs@3.14.1/dist/cdn.min.js" defer></script>',
    ])
    return text, [], "entity-obfuscated address, @2x assets, package@version in CDN URL"


@N
def n_html_meta():
    tag = "G-" + rs(UPDG, 10)
    text = "\n".join([
        f'<meta name="google-site-verification" content="{rs(URLSAFE, 43)}">',
        f'<script async src="https://www.googletagmanager.com/gtag/js?id={tag}"></script>',
        f"<script>gtag('config', '{tag}'); gtag('config', 'UA-{digits(8, '4')}-2');</script>",
        "<style>.btn{color:#1f6feb;background:#0d1117}</style>",
        f'<div data-build="{R.randint(1000, 9999)}" data-sha="{hexs(12)}"></div>',
    ])
    return text, [], "analytics ids, site verification, colours"


@N
def n_py_keyerror():
    text = "\n".join([
        "Traceback (most recent call last):",
        '  File "/srv/app/manage.py", line 22, in <module>',
        "    main()",
        '  File "/srv/app/settings/base.py", line 131, in <module>',
        '    AWS_SECRET_ACCESS_KEY = os.environ["AWS_SECRET_ACCESS_KEY"]',
        '  File "/usr/lib/python3.12/os.py", line 714, in __getitem__',
        "    raise KeyError(key) from None",
        "KeyError: 'AWS_SECRET_ACCESS_KEY'",
    ])
    return text, [], "secret key name without a value"


@N
def n_py_masked_openai():
    text = ("openai.AuthenticationError: Error code: 401 - {'error': {'message': 'Incorrect API key provided: sk-proj-"
            + "*" * 44 + rs(ALNUM, 4) + ". You can find your API key at https://platform.openai.com/account/api-keys.', 'type': 'invalid_request_error', 'code': 'invalid_api_key'}}")
    return text, [], "key masked by the API error message"


@N
def n_py_requests_redacted():
    text = "\n".join([
        "requests.exceptions.HTTPError: 403 Client Error: Forbidden for url: https://api.tidewater-analytics.co.uk/v3/exports/2025-11?format=csv",
        f"  headers = {{'Authorization': 'Bearer <redacted>', 'X-Request-Id': '{uuid4()}'}}",
        "  proxies = {'https': 'http://proxy-user:********@proxy.tidewater-analytics.co.uk:3128'}",
    ])
    return text, [], "redacted bearer and starred proxy password"


@N
def n_npmrc_placeholder():
    text = "\n".join([
        "//registry.npmjs.org/:_authToken=${NPM_TOKEN}",
        "//npm.pkg.github.com/:_authToken=${{ secrets.GITHUB_TOKEN }}",
        "@quillfeather:registry=https://npm.pkg.github.com",
        "email=dev@example.com",
    ])
    return text, [], "placeholder tokens, reserved e-mail domain"


@N
def n_pypirc():
    text = "\n".join([
        "[distutils]", "index-servers =", "    pypi", "    testpypi", "",
        "[pypi]", "username = __token__", f"password = pypi-AgEIcHlwaS5vcmcCJD{rs(URLSAFE, 140)}", "",
        "[testpypi]", "repository = https://test.pypi.org/legacy/", "username = __token__",
        f"password = pypi-AgENdGVzdC5weXBpLm9yZwIk{rs(URLSAFE, 140)}",
    ])
    return text, [], "PyPI API tokens are not one of the specified kinds"


@N
def n_netrc_placeholder():
    text = "machine github.com login x-access-token password ${GITHUB_TOKEN}\nmachine gitlab.kestrel-ops.dev login ci password <set-by-ci>\ndefault login anonymous password anonymous"
    return text, [], "placeholder passwords in .netrc"


@N
def n_gitconfig_ssh():
    text = "\n".join([
        "[user]", "\tname = CI Bot", "\temail = ci-bot@build.invalid",
        '[remote "origin"]', "\turl = git@github.com:quillfeather/infra-live.git", "\tfetch = +refs/heads/*:refs/remotes/origin/*",
        '[remote "mirror"]', "\turl = ssh://git@gitlab.kestrel-ops.dev:2222/mirrors/infra-live.git",
        '[includeIf "gitdir:~/work/"]', "\tpath = ~/.gitconfig-work",
    ])
    return text, [], "SSH remotes and a .invalid address"


@N
def n_docker_placeholders():
    env = ["DATABASE_URL=mysql://root:${MYSQL_ROOT_PASSWORD}@db:3306/app", "REDIS_URL=redis://cache:6379/0",
           "SENDGRID_API_KEY=", "SMTP_URL=smtp://mailer:changeme@smtp.internal:587", "ADMIN_EMAIL=admin@shop.localhost"]
    return docker_inspect(env), [], "placeholder and changeme passwords, .localhost address"


@N
def n_docker_network():
    text = jdump([{"Id": hexs(64), "RepoDigests": [f"ghcr.io/quillfeather/shop-api@sha256:{hexs(64)}"],
                   "NetworkSettings": {"Networks": {"shop_default": {"IPAddress": f"172.18.0.{R.randint(2, 20)}", "Gateway": "172.18.0.1",
                                                                    "MacAddress": ":".join(hexs(2) for _ in range(6)), "IPPrefixLen": 16}}},
                   "HostConfig": {"PortBindings": {"8080/tcp": [{"HostIp": "0.0.0.0", "HostPort": "18080"}]}, "Memory": 536870912}}], 4)
    return text, [], "digests, IPs, MAC, ports"


@N
def n_chat_last4():
    text = "\n".join([
        "Agent: For verification, can you share the last four digits of the card on file?",
        f"Customer: it ends in {digits(4)}, the expiry is 11/27",
        f"Agent: Thanks! I see two charges of $19.99 on Nov 28 and Nov 29, 2025. I've refunded one (refund ID re_{rs(ALNUM, 24)}).",
        f"Customer: ok. my phone is 555-01{digits(2)} if you need it",
    ])
    return text, [], "last four digits, 7-digit local number"


@N
def n_chat_ja_order():
    text = f"注文番号: 2025-1130-{digits(4)} / 郵便番号: 〒150-0002 / お届け予定日: 2025年12月3日 / お問い合わせ番号: 49{digits(2)}-{digits(4)}-{digits(4)} / 電話: 03-5550-{digits(4)}"
    return text, [], "Japanese order/postal numbers and a domestic number without +"


@N
def n_invoice_de_masked():
    text = "\n".join([
        f"Rechnung Nr. RE-2025-{R.randint(100000, 999999)} vom 30.11.2025",
        f"Kundennummer: {digits(8, '1')} · USt-IdNr.: DE{digits(9, '2')}",
        "Zahlbar innerhalb von 14 Tagen ohne Abzug auf das bekannte Konto (IBAN DE89 **** **** **** **** 00, BIC COBADEFFXXX).",
        f"Alte Bankverbindung: Kontonummer {digits(10, '0')}, BLZ {digits(8, '3')}",
        "Gesamtbetrag: 1.428,00 EUR",
    ])
    return text, [], "masked IBAN, VAT id, legacy account number"


@N
def n_invoice_bad_iban():
    gb = iban_sp(iban("GB", valid=False))
    de = iban("DE")[:-1]
    fr = iban("FR")
    text = "\n".join([
        f"Remittance advice -- please check: {gb} was rejected by the bank (checksum).",
        f"Old record (typo, one digit missing): {de}",
        f"Lower-case copy from a PDF: {fr.lower()}",
    ])
    return text, [], "bad check digits, wrong length, lower-case"


@N
def n_prose_de_domestic():
    text = f"Rufen Sie uns an: 030 5550 {digits(4)} oder mobil 0151 {digits(8)}. Geschäftszeiten: Mo.-Fr. 08:00-17:30, Stand 30.11.2025."
    return text, [], "German domestic numbers without country code"


@N
def n_prose_fr_domestic():
    text = f"Pour toute question, appelez le 01 42 68 {digits(2)} {digits(2)} ou le 06 12 {digits(2)} {digits(2)} {digits(2)}, du lundi au vendredi de 9h00 à 18h30."
    return text, [], "French domestic numbers"


@N
def n_phone_shapes():
    text = "\n".join([
        f"Release 2025-11-30 at 14:32:07 on host 192.168.{R.randint(0, 255)}.{R.randint(2, 254)} (v3.12.{R.randint(0, 9)})",
        "IST is UTC+05:30; 3+4 workers per shard",
        f"SSN on file: {R.randint(100, 665)}-{R.randint(10, 99)}-{R.randint(1000, 9999)} (test record)",
        "ISBN 978-3-16-148410-0, ISBN-10 0-306-40615-2",
        f"Serial {digits(10, '4')} and OID 1.3.6.1.4.1.311.21.8",
    ])
    return text, [], "dates, times, IPs, versions, offsets, SSN, ISBNs, unformatted digit run"


@N
def n_phone_na_invalid():
    text = "\n".join([
        f"Order line (123) 555-{digits(4)}: area code starts with 1",
        f"Fax 415-155-{digits(4)}: exchange starts with 1",
        f"Trace 2025-415-555-{digits(4)}-7 and build 10.415.555.{digits(4)}",
        f"Call 555-{digits(4)} or dial {R.choice(AREAS)}555{digits(4)}",
    ])
    return text, [], "NANP-invalid area/exchange, numbers inside longer runs, 7-digit and unformatted"


@N
def n_phone_intl_short():
    text = f"Niue office: +683 {digits(4, '4')}. Bad entry: +0 30 5550 {digits(4)}. Score went from 3 to +12 in v2."
    return text, [], "+ numbers with 7 digits or country code 0"


@N
def n_card_out_of_range():
    a, b, c, d = card("1", 16), card("7", 16), card("2100", 16), card("9", 16)
    text = f"Loyalty numbers: {grp(a, ' ')}, {grp(b, ' ')}, {grp(c, '-')}, {d}"
    return text, [], "Luhn-valid 16-digit numbers outside every network range"


@N
def n_card_wrong_length():
    v15 = card("4", 15)
    ax = card("37", 16)
    mc = card("54", 15)
    v17 = card("4", 17)
    text = f"Gift card batch: {v15} / {ax} / {mc} / {v17}"
    return text, [], "Luhn-valid but wrong length for the network (Visa 15/17, Amex 16, MC 15)"


@N
def n_card_mixed_sep():
    a = card("4", 16)
    b = card("51", 16)
    text = f"Card (pasted badly): {a[:4]} {a[4:8]}-{a[8:12]} {a[12:]} and {b[:4]}  {b[4:8]}  {b[8:12]}  {b[12:]}"
    return text, [], "mixed separators and double spaces"


@N
def n_card_luhn_invalid():
    xs = [card("4", 16, False), card("55", 16, False), card("34", 15, False), card("6011", 16, False), card("3530", 16, False)]
    text = "Declined (invalid number): " + "; ".join(grp(x, " ") for x in xs)
    return text, [], "Luhn-invalid numbers in every major range"


@N
def n_long_ids():
    text = "\n".join([
        f"tracking: {digits(22, '9')}",
        f"snowflake ids: {digits(19, '1')}, {digits(19, '1')}",
        f"epoch_ms={R.randint(1730000000000, 1760000000000)} epoch_ns={R.randint(1730000000000000000, 1760000000000000000)}",
        f"UPS 1Z {rs(UPDG, 3)} {rs(UP, 2)}{digits(1)} {digits(2)} {digits(4)} {digits(3)}",
    ])
    return text, [], "long numeric identifiers and timestamps"


@N
def n_iban_malformed():
    de = iban("DE")
    text = "\n".join([
        f"IBAN (dash-grouped in export): {'-'.join(de[i:i + 4] for i in range(0, 22, 4))}",
        f"IBAN (unknown country): XX{digits(2)}{digits(18)}",
        f"IBAN (groups of 3): {' '.join(de[i:i + 3] for i in range(0, 22, 3))}",
    ])
    return text, [], "dash grouping, unknown country, groups of 3"


@N
def n_aws_id_shapes():
    text = jdump({"eventName": "CreateAccessKey", "userIdentity": {"type": "IAMUser", "principalId": "AIDA" + rs(B32, 17),
                                                                 "accessKeyId": "AKIAIOSFODNN7EXAMPLE"},
                  "responseElements": {"accessKey": {"accessKeyId": "AKIA" + rs(B32, 15), "status": "Active"}},
                  "requestParameters": {"note": "rotated from AKIA1234567890ABCDEF and XAKIA" + rs(B32, 16),
                                        "lower": "akia" + rs(LO + "234567", 16), "long": "ASIA" + rs(B32, 17)}})
    return text, [], "EXAMPLE key, 15/17 chars, digits 0/1/8/9, letter before, lower-case"


@N
def n_aws_secret_shapes():
    text = "\n".join([
        "[example]",
        "aws_access_key_id = AKIAIOSFODNN7EXAMPLE",
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "[truncated]",
        f"aws_secret_access_key = {aws_secret(39)}",
        f"$ aws configure set aws_secret_access_key {aws_secret()}",
        f"secret_access_key: {aws_secret(41)}",
    ])
    return text, [], "EXAMPLE secret, 39/41 chars, space separator (no ':'/'=')"


@N
def n_email_shapes():
    text = "\n".join([
        "Contact: maintainers@example.org (placeholder) - staging alerts go to alerts@qa.test",
        "Retina assets: icon@2x.png, icon@3x.png",
        "Install: npm i @quillfeather/ui-kit@4.2.0 react@18.3.1 eslint-plugin-qf@2.1.0-next.canary",
        "Remote: git@github.com:quillfeather/ui-kit.git",
        "Mirror: https://mirror-bot@git.quillfeather.io/ui-kit.git",
        "Reviewers: @lena-vogt @k.mori",
        "Local: root@localhost, admin@10.0.0.5, a@b.c",
        "Docs: support@docs.invalid, dev@app.localhost, bob@corp.example",
    ])
    return text, [], "reserved domains, @2x, package@version, SSH remote, URL user, mentions"


@N
def n_url_placeholders():
    text = "\n".join([
        "DATABASE_URL=postgres://app:$DB_PASSWORD@db:5432/app",
        "DATABASE_URL=postgres://app:<password>@db:5432/app",
        "AMQP_URL=amqp://user:{{rabbit_password}}@rabbit:5672/",
        "MONGO=mongodb://reader:[REDACTED]@mongo-0.mongo:27017",
        "REDIS=redis://cache:*****@redis:6379",
        "FTP=ftp://upload:xxxxxxxx@ftp.ambergrove.com/incoming",
        "SMTP=smtp://mailer:Password@smtp.ambergrove.com:587",
        "HTTP_PROXY=http://proxy:CHANGEME@proxy.ambergrove.com:3128",
        "SFTP=sftp://backup:redacted@backup.ambergrove.com",
        "MIRROR=https://svc:pwd@mirror.ambergrove.com/ (also pass, passwd, Secret)",
    ])
    return text, [], "every placeholder password style"


@N
def n_url_no_password():
    text = "git clone https://deploy@git.ambergrove.com/repo.git\nrsync -e ssh backup@10.0.4.7:/srv/ ./srv/\npsql postgres://readonly@db-replica.ambergrove.com:5432/analytics"
    return text, [], "URL user without password"


@N
def n_jwt_shapes():
    p = b64u(json.dumps({"sub": "1234", "iat": R.randint(1730000000, 1760000000)}).encode())
    noalg = b64u(json.dumps({"typ": "JWT", "kid": "k1"}).encode())
    none_alg = b64u(b'{"alg":"none","typ":"JWT"}')
    badjson = b64u(b'{"alg":"HS256",')
    hs = b64u(b'{"alg":"HS256"}')
    text = "\n".join([
        f"no alg header: {noalg}.{p}.{b64u(R.randbytes(32))}",
        f"unsigned: {none_alg}.{p}.",
        f"short sig: {hs}.{p}.{rs(URLSAFE, 15)}",
        f"broken header: {badjson}.{p}.{b64u(R.randbytes(32))}",
        f"header only: {hs}",
    ])
    return text, [], "header without alg, empty/short signature, non-JSON header, lone header"


@N
def n_gitlab_shapes():
    text = "\n".join([
        f"Personal access token (truncated in screenshot): glpat-{rs(ALNUM, 19)}",
        f"copied with ellipsis: glpat-{rs(ALNUM, 19)}...",
        f"pipeline trigger: glptt-{rs(ALNUM, 20)}",
        "template: glpat-<your_token>",
    ])
    return text, [], "19-char glpat, trailing dots not counted, glptt- prefix, template"


@N
def n_slack_shapes():
    text = "\n".join([
        f"d cookie: xoxd-{rs(ALNUM, 20)}%2F{rs(ALNUM, 30)}",
        f"client token: xoxc-{digits(12)}-{digits(12)}-{hexs(64)}",
        f"bad: xoxb-abc-{digits(12)}",
        f"no dash: xoxb-{digits(15)}",
        f"short: xoxp-{digits(5)}-{digits(8)}",
    ])
    return text, [], "xoxd/xoxc prefixes, letter after prefix, no dash, 14 chars"


@N
def n_google_shapes():
    text = "\n".join([
        "const firebaseConfig = {",
        f'  apiKey: "AIza{rs(ALNUM, 34)}",',
        f'  backupKey: "AIza{rs(ALNUM, 36)}",',
        f'  otherKey: "AIzb{rs(ALNUM, 35)}",',
        '  authDomain: "qf-mobile-prod.firebaseapp.com",',
        "};",
    ])
    return text, [], "AIza with 34/36 chars and AIzb prefix"


@N
def n_stripe_masked():
    text = f"Dashboard > Developers > API keys\nSecret key  sk_live_••••••••••••{rs(ALNUM, 4)}   Reveal\nRestricted  rk_live_{rs(ALNUM, 23)}   Created Nov 2\nPublishable pk_test_{rs(ALNUM, 99)}"
    return text, [], "masked sk_live, 23-char rk_live, publishable key"


@N
def n_openai_shapes():
    text = "\n".join([
        "# .env.example",
        f"OPENAI_API_KEY=sk-proj-{rs(ALNUM, 34)}",
        f"DEEPSEEK_API_KEY=sk-{hexs(32)}",
        f"LEGACY_SHORT=sk-{rs(ALNUM, 15)}T3BlbkFJ{rs(ALNUM, 16)}",
        f"OTHER_VENDOR=sk-{rs(ALNUM, 48)}",
    ])
    return text, [], "sk-proj with 39 chars after sk-, generic sk- keys without marker, marker key too short"


@N
def n_anthropic_shapes():
    text = f"console> key created: sk-ant-{rs(ALNUM, 85)}\nconsole> displayed once as sk-ant-api03-****...{rs(ALNUM, 4)}"
    return text, [], "sk-ant- with 89 chars after sk-, masked form"


@N
def n_sendgrid_shapes():
    text = f"SENDGRID_API_KEY=SG.{rs(ALNUM, 22)}.{rs(ALNUM, 42)}\nSENDGRID_TEMPLATE=SG.xxxxxxxx.yyyyyyyy\nSG.{rs(ALNUM, 21)}.{rs(ALNUM, 43)}"
    return text, [], "SG. keys with 42/21-char parts and a template"


@N
def n_pubkeys():
    pgp = pem_block("PGP PUBLIC KEY BLOCK", b"\x99\x01\x8d\x04", 380, extra=[""], trailer=["=" + base64.b64encode(R.randbytes(3)).decode()])
    text = "$ gpg --armor --export release@quillfeather.example\n" + pgp + "\n$ openssl ecparam -name prime256v1\n-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----"
    return text, [], "PGP public key block and EC parameters"


@N
def n_authorized_keys():
    text = "\n".join([f"{ssh_pub()} ci@build-01", f"{ssh_pub()} deploy@bastion", "# -----BEGIN RSA PUBLIC KEY----- blocks are not accepted here",
                      pem_block("RSA PUBLIC KEY", b"0\x82\x01\n\x02\x82\x01\x01\x00", 260)])
    return text, [], "authorized_keys entries and an RSA PUBLIC KEY block"


@N
def n_webhook_other():
    text = f"SLACK_WORKFLOW_URL=https://hooks.slack.com/workflows/T{rs(UPDG, 9)}/A{rs(UPDG, 10)}/{digits(18)}/{rs(ALNUM, 24)}\nDISCORD_WEBHOOK=https://discord.com/api/webhooks/{digits(18)}/{rs(URLSAFE, 68)}"
    return text, [], "Slack workflow URL and a Discord webhook"


@N
def n_changelog_mentions():
    text = "\n".join([
        "## 4.2.0 (2025-11-30)",
        f"- fix: retry uploads on 503 (#{R.randint(1000, 9999)}) -- thanks @maria-lopez and @j.okafor",
        f"- deps: bump @types/node@20.11.5, vite@5.4.11 (#{R.randint(1000, 9999)})",
        f"- perf: 12.4% faster cold start on 2 vCPU (+0.3 ms p99)",
    ])
    return text, [], "@mentions, scoped package@version, PR numbers"


@N
def n_tf_apply_ids():
    acct = digits(12, "2")
    text = "\n".join([
        f"aws_vpc.main: Creation complete after 2s [id=vpc-0{hexs(16)}]",
        f"aws_subnet.private[0]: Creation complete after 1s [id=subnet-0{hexs(16)}]",
        f"aws_iam_role.ci: Creation complete after 1s [id=ci-deployer]",
        f"aws_kms_key.state: Creation complete after 14s [id={uuid4()}]",
        f"aws_s3_bucket.state: Creation complete [arn=arn:aws:s3:::qf-tfstate-{acct}]",
        "",
        "Apply complete! Resources: 5 added, 0 changed, 0 destroyed.",
    ])
    return text, [], "resource ids and ARNs"


@N
def n_random_password_state():
    text = jdump({"type": "random_password", "name": "db", "instances": [{"attributes": {
        "id": "none", "length": 32, "special": True, "result": rs(ALNUM + "!#%&*()-_=+[]{}<>:?", 32), "bcrypt_hash": "$2a$10$" + rs(ALNUM + "./", 53)}}]})
    return text, [], "generic generated password is not a specified kind"


@N
def n_data_uri():
    text = f'<img alt="logo" src="data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAA{rs(B64, 300)}==">\n<link rel="icon" href="data:image/svg+xml;base64,PHN2ZyB4bWxucz0i{rs(B64, 120)}">'
    return text, [], "base64 data URIs"


@N
def n_ids_table():
    rows = [[uuid4(), rs("0123456789ABCDEFGHJKMNPQRSTVWXYZ", 26), hexs(40), ts_iso()] for _ in range(3)]
    return md_table(["request_id", "ulid", "sha1", "at"], rows), [], "UUIDs, ULIDs, SHA-1s"


@N
def n_npm_install():
    text = "\n".join([
        "$ npm install",
        "npm warn deprecated inflight@1.0.6: This module is not supported",
        "npm warn deprecated glob@7.2.3: Glob versions prior to v9 are no longer supported",
        f"added {R.randint(500, 1500)} packages, and audited {R.randint(1500, 2000)} packages in {R.randint(5, 40)}s",
        "found 0 vulnerabilities",
    ])
    return text, [], "package@version in npm output"


@N
def n_ean_books():
    def ean(prefix):
        while True:
            b = prefix + digits(12 - len(prefix))
            s = sum(int(c) * (3 if i % 2 else 1) for i, c in enumerate(b))
            e = b + str((10 - s % 10) % 10)
            if not luhn_ok(e):
                return e
    text = f"Lieferschein: EAN {ean('40')} (2x), EAN {ean('978')} (1x), Artikel-Nr. {digits(6)}"
    return text, [], "EAN-13 codes that are not Luhn-valid"


@N
def n_es_dni():
    text = f"DNI: {digits(8)}{R.choice('TRWAGMYFPDXBNJZSQVHLCKE')} · NIE: X{digits(7)}{R.choice('TRWAGMYFPDXBNJZSQVHLCKE')} · Tel. fijo 91 {digits(3)} {digits(2)} {digits(2)} · CP 28013"
    return text, [], "Spanish ID numbers and a domestic landline"


@N
def n_support_reset():
    text = "\n".join([
        "Agent: I've sent a password reset link; it expires in 24h.",
        f"Customer: got it, ticket {digits(4)}-{digits(4)} right?",
        "Agent: Correct. Please don't share your password with anyone, including us.",
        "Customer: my password is Password but I'll change it",
    ])
    return text, [], "support chat about passwords, no credentials of any specified kind"


@N
def n_fr_prose_dates():
    text = f"Le rendez-vous est fixé au 30/11/2025 à 14h30 (salle 3.2). Référence dossier : 2025-11-{digits(5)}. Montant : 1 250,00 €."
    return text, [], "French dates, times, references, amounts"


@N
def n_ja_prose_domestic():
    text = f"お問い合わせ: 03-{digits(4)}-{digits(4)}（平日 9:00〜18:00）、携帯 090-{digits(4)}-{digits(4)}。"
    return text, [], "Japanese domestic numbers (no +)"


@N
def n_k8s_ingress():
    text = "\n".join([
        "apiVersion: networking.k8s.io/v1", "kind: Ingress", "metadata:", "  name: shop", "  annotations:",
        "    cert-manager.io/cluster-issuer: letsencrypt-prod", "    nginx.ingress.kubernetes.io/proxy-body-size: 8m",
        "spec:", "  tls:", "  - hosts: [shop.ambergrove.com]", "    secretName: shop-tls", "  rules:",
        "  - host: shop.ambergrove.com", "    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: shop, port: {number: 8080}}}}]}",
    ])
    return text, [], "ingress referencing a TLS secret by name"


@N
def n_tb_card_validation():
    bad = card("4", 16, valid=False)
    text = "\n".join([
        "Traceback (most recent call last):",
        '  File "/srv/pay/validators.py", line 40, in validate_pan',
        "    raise ValueError(f\"PAN failed Luhn check: {masked}\")",
        f"ValueError: PAN failed Luhn check: {bad[:6]}******{bad[-4:]}",
    ])
    return text, [], "masked PAN in an exception"


@N
def n_gha_summary_table():
    text = "## Deploy summary\n\n" + md_table(["Job", "Duration", "Result", "Artifact"],
                                              [["build", "3m 12s", "success", f"dist-{hexs(7)}.tgz"], ["test", "7m 48s", "success", f"junit-{digits(10, '1')}.xml"],
                                               ["deploy", "1m 02s", "success", f"release v4.2.{R.randint(0, 9)}"]])
    return text, [], "CI summary table"


@N
def n_aws_secret_example_json():
    text = jdump({"Credentials": {"AccessKeyId": "ASIA" + "*" * 16, "SecretAccessKey": "<redacted>", "SessionToken": "<redacted>",
                                  "Expiration": "2025-11-30T18:04:11+00:00"}}, 4)
    return text, [], "redacted STS credentials"


@N
def n_de_prose_ids():
    text = f"Ihre Steuer-ID lautet {digits(11, '1')}, die Versicherungsnummer 12 {digits(6)} A {digits(3)}. Termin: 02.12.2025, 10:15 Uhr."
    return text, [], "German tax/insurance numbers and dates"


@N
def n_html_form_placeholders():
    text = "\n".join([
        '<input type="email" name="email" placeholder="you@example.com">',
        '<input type="tel" name="phone" placeholder="+49 ...">',
        '<input type="text" name="card" placeholder="1234 5678 9012 3456" inputmode="numeric">',
        '<input type="text" name="iban" placeholder="DE00 0000 0000 0000 0000 00">',
    ])
    return text, [], "form placeholders (reserved domain, invalid card and IBAN)"


@N
def n_pgp_signature():
    sig = pem_block("PGP SIGNATURE", b"\x88\x75\x04", 110, extra=[""], trailer=["=" + base64.b64encode(R.randbytes(3)).decode()])
    text = "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\nrelease v4.2.0 sha256 " + hexs(64) + "\n" + sig
    return text, [], "PGP signed message"


@N
def n_csr():
    text = "$ openssl req -new -key server.key -out server.csr\n$ cat server.csr\n" + pem_block("CERTIFICATE REQUEST", b"0\x82\x02\x9a0\x82\x01\x82\x02\x01\x00", 640)
    return text, [], "CSR; the key file is only referenced by name"


@N
def n_mixed_lang_versions():
    text = f"Version 2.14.3 ist verfügbar · la versión 2.14.3 está disponible · バージョン 2.14.3 が利用可能です (build {digits(8, '2')})"
    return text, [], "multi-language release note"


@N
def n_tf_state_sg():
    text = jdump({"type": "aws_security_group_rule", "instances": [{"attributes": {
        "cidr_blocks": ["10.40.0.0/16"], "from_port": 5432, "to_port": 5432, "id": f"sgrule-{digits(10, '2')}",
        "security_group_id": f"sg-0{hexs(16)}", "description": "postgres from app subnets"}}]})
    return text, [], "security group rule state"


@N
def n_slack_message_export():
    text = jdump({"type": "message", "user": "U07" + rs(UPDG, 8), "text": "deploy done :rocket: cc <@U07" + rs(UPDG, 8) + ">",
                  "ts": f"{R.randint(1730000000, 1760000000)}.{digits(6)}", "team": "T01" + rs(UPDG, 8), "channel": "C0" + rs(UPDG, 9)})
    return text, [], "Slack export message with ids"


@N
def n_sql_orders():
    rows = [[R.randint(100000, 999999), f"2025-11-{R.randint(10, 28)}", f"{R.randint(1, 999)}.{R.randint(0, 99):02d}", R.choice(["paid", "refunded", "open"])] for _ in range(4)]
    return psql(["order_id", "order_date", "total", "status"], rows), [], "plain orders table"


# ------------------------------------------------------ extra positives --


@P
def p_tf_plan_slack():
    hook = slack_hook()
    text = "\n".join([
        "  # aws_sns_topic_subscription.alerts will be created",
        '  + resource "aws_sns_topic_subscription" "alerts" {',
        f'      + endpoint  = "https://{hook}"',
        '      + protocol  = "https"',
        f'      + topic_arn = "arn:aws:sns:eu-west-1:{digits(12, "3")}:alerts"',
        "    }",
    ])
    return text, [("slack_webhook", hook)], "webhook as a subscription endpoint in a plan"


@P
def p_chat_en_mc2_intl():
    pan = card(str(R.randint(2221, 2720)), 16)
    g = grp(pan, " ")
    ph = f"+44 20 7946 {digits(4)}"
    text = f"Customer: Please charge {g} instead; you can reach me on {ph} if it fails.\nAgent: Thank you, processing now."
    return text, [("payment_card", g), ("phone", ph)], "2-series Mastercard and UK number"


@P
def p_chat_paren_intl():
    ph = f"+44 (0) 20 7946 {digits(4)}"
    ph2 = f"+1 ({R.choice(AREAS)}) 555 01{digits(2)}"
    text = f"Signature:\nNoor Haddad | Tidewater Analytics\nT {ph} | US desk {ph2}"
    return text, [("phone", ph), ("phone", ph2)], "international numbers with one parenthesised group"


@P
def p_intl_dots_dashes():
    a = f"+1.{R.choice(AREAS)}.555.01{digits(2)}"
    b = f"+1-{R.choice(AREAS)}-555-01{digits(2)}"
    c = f"+{R.choice(['33', '49', '39'])}{digits(9, '3')}"
    text = f"Contacts exported from CRM: {a}; {b}; {c}."
    return text, [("phone", a), ("phone", b), ("phone", c)], "dotted, dashed and compact international numbers"


@P
def p_ja_prose_iban_email():
    ib = iban_sp(iban("GB"))
    mail = email("hoshizora-shoji.co.jp", "f.l")
    text = f"海外送金先: {ib} （英国口座）。ご不明点は {mail} までご連絡ください。"
    return text, [("iban", ib), ("email", mail)], "Japanese notice with spaced GB IBAN and e-mail"


@P
def p_jwt_in_url():
    tok = jwt({"alg": "HS256", "typ": "JWT"}, {"email_verified": True, "sub": digits(8)}, 43)
    text = f'{ts_iso()} INFO  GET /auth/callback?state={hexs(16)}&token={tok}&next=%2Fdashboard 302 12ms "Mozilla/5.0"'
    return text, [("jwt", tok)], "JWT in an access-log query string"


@P
def p_stripe_fr():
    k = stripe("sk_live_", R.choice([99, 107]))
    text = f"Bonjour, voici notre clé pour l'intégration : {k} -- merci de confirmer la réception."
    return text, [("stripe_key", k)], "live secret key in French prose"


# ---------------------------------------------------- extra negatives --

@N
def n_md_api_examples():
    text = "\n".join([
        "## Authenticating",
        "```bash",
        'curl -u "$QF_USER:$QF_TOKEN" https://api.quillfeather.io/v1/me',
        'curl -H "Authorization: Bearer $QF_TOKEN" https://api.quillfeather.io/v1/projects',
        "git clone https://oauth2:<personal-access-token>@gitlab.kestrel-ops.dev/group/repo.git",
        "export AWS_SECRET_ACCESS_KEY=<your secret>",
        "```",
    ])
    return text, [], "README examples with variables and <placeholders>"


@N
def n_chat_fr_delivery():
    text = "\n".join([
        f"Client : Bonjour, ma commande n° {R.randint(100000, 999999)} n'est pas arrivée.",
        f"Conseiller : Le colis {rs(UP, 2)}{digits(9)}FR est en transit depuis le 28/11/2025, livraison prévue le 02/12 avant 13h.",
        "Client : D'accord, merci. Je serai absent entre 10h et 12h.",
    ])
    return text, [], "French delivery chat: order and parcel numbers, dates"


@N
def n_chat_de_delivery():
    text = "\n".join([
        f"Kunde: Meine Sendungsnummer ist {digits(12, '3')}, PLZ 20457.",
        "Support: Danke! Das Paket liegt in der Filiale Hafenstraße, abholbereit bis 06.12.2025, 18:00 Uhr.",
        f"Kunde: Kann ich mit Abholcode {digits(6)} abholen?",
    ])
    return text, [], "German delivery chat with tracking and pickup codes"


@N
def n_invoice_es():
    text = "\n".join([
        f"FACTURA Nº 2025/{R.randint(1000, 9999)} · Fecha: 30/11/2025",
        f"Casa Tramonto S.L. · NIF B{digits(8)} · C/ Mayor 14, 28013 Madrid",
        f"Base imponible: 1.250,00 € · IVA 21 %: 262,50 € · Total: 1.512,50 €",
        "Forma de pago: transferencia (datos bancarios en su área de cliente)",
    ])
    return text, [], "Spanish invoice without bank details"


@N
def n_py_json_error():
    text = "\n".join([
        "Traceback (most recent call last):",
        '  File "/srv/ingest/load.py", line 77, in parse',
        "    return json.loads(raw)",
        '  File "/usr/lib/python3.12/json/__init__.py", line 346, in loads',
        "    return _default_decoder.decode(s)",
        "json.decoder.JSONDecodeError: Expecting ',' delimiter: line 1 column 4097 (char 4096)",
        f"raw[4080:4110] = '\"amount\": 1250.00 \"currency\": \"EUR\"'",
    ])
    return text, [], "JSON decode traceback"


@N
def n_docker_ps():
    rows = []
    for name, port in (("shop-api-1", "0.0.0.0:8080->8080/tcp"), ("shop-db-1", "5432/tcp"), ("shop-redis-1", "6379/tcp")):
        rows.append(f"{hexs(12)}   ghcr.io/quillfeather/{name[:-2]}:2.7.1   \"docker-entrypoint.s...\"   {R.randint(2, 9)} days ago   Up {R.randint(2, 9)} days (healthy)   {port}   {name}")
    return "CONTAINER ID   IMAGE   COMMAND   CREATED   STATUS   PORTS   NAMES\n" + "\n".join(rows), [], "docker ps table"


@N
def n_kubectl_get_pods():
    rows = [f"worker-{hexs(9)}-{rs(LO + DG, 5)}   1/1     Running   {R.randint(0, 3)}          {R.randint(1, 30)}d   10.40.{R.randint(0, 255)}.{R.randint(2, 254)}   ip-10-40-{R.randint(0, 255)}-{R.randint(2, 254)}.eu-central-1.compute.internal" for _ in range(3)]
    return "NAME   READY   STATUS   RESTARTS   AGE   IP   NODE\n" + "\n".join(rows), [], "kubectl get pods -o wide"


@N
def n_tf_lock():
    text = "\n".join([
        'provider "registry.terraform.io/hashicorp/aws" {',
        '  version     = "5.78.0"',
        '  constraints = ">= 5.0.0"',
        "  hashes = [",
        f'    "h1:{rs(B64, 43)}=",',
        f'    "zh:{hexs(64)}",',
        f'    "zh:{hexs(64)}",',
        "  ]",
        "}",
    ])
    return text, [], ".terraform.lock.hcl hashes"


@N
def n_gitconfig_aliases():
    text = "\n".join([
        "[alias]",
        "\tlg = log --graph --pretty=format:'%h %an <%ae> %s'",
        "\tco = checkout",
        '[credential "https://github.com"]',
        "\thelper = !/usr/bin/gh auth git-credential",
        "[init]",
        "\tdefaultBranch = main",
    ])
    return text, [], "git aliases and credential helper without secrets"


@N
def n_iban_like_codes():
    text = f"BIC: GEBABEBB · Postcode: SW1A 1AA · VAT: GB{digits(9)} · Sort code 20-{digits(2)}-{digits(2)} · Account {digits(8)}"
    return text, [], "BIC, UK postcode, VAT, sort code, account number"


@N
def n_jwe_compact():
    hdr = b64u(json.dumps({"alg": "dir", "enc": "A256GCM", "kid": hexs(8)}).encode())
    text = f"Set-Cookie: __Host-enc={hdr}..{b64u(R.randbytes(12))}.{b64u(R.randbytes(96))}.{b64u(R.randbytes(16))}; Path=/; Secure; HttpOnly"
    return text, [], "JWE with empty encrypted-key part (not a three-part JWT)"


@N
def n_code_at_signs():
    text = "\n".join([
        "@app.route('/users/<int:user_id>')",
        "def show(user_id):",
        "    addr = f'{user}@{domain}'",
        "    y = a@b.T  # matmul",
        "    return render('user.html', mail='noreply@company')",
    ])
    return text, [], "decorators, templates, matmul, single-label domain"


@N
def n_java_trace():
    text = "\n".join([
        "java.lang.IllegalStateException: Connection pool exhausted (max=20, active=20, idle=0)",
        "\tat com.zaxxer.hikari.pool.HikariPool.getConnection(HikariPool.java:181)",
        "\tat io.quillfeather.orders.repo.OrderRepo.find(OrderRepo.java:42)",
        f"\tat io.quillfeather.orders.api.OrderController.get(OrderController.java:{R.randint(50, 300)})",
        "\t... 38 more",
    ])
    return text, [], "Java stack trace"


@N
def n_ci_matrix():
    text = "\n".join([
        "strategy:",
        "  matrix:",
        "    node: [18, 20, 22]",
        "    os: [ubuntu-24.04, macos-14, windows-2022]",
        "steps:",
        "  - uses: actions/setup-node@v4",
        "    with: {node-version: '${{ matrix.node }}', registry-url: 'https://registry.npmjs.org'}",
        "  - run: npm ci && npm test -- --shard=${{ strategy.job-index }}/3",
        "    env:",
        "      NODE_AUTH_TOKEN: ${{ secrets.NPM_TOKEN }}",
    ])
    return text, [], "workflow matrix with secret references"


@N
def n_ja_release_notes():
    text = f"リリースノート v4.2.0（2025年11月30日）: 起動時間を12%短縮。API 上限を 600/分 に変更。ビルド番号 {digits(8, '2')}。"
    return text, [], "Japanese release notes"


@N
def n_sql_invoices_amounts():
    rows = [[f"INV-2025-{R.randint(1000, 9999)}", f"2025-11-{R.randint(10, 28)}", f"{R.randint(100, 9999)}.{R.randint(0, 99):02d}", R.choice(["EUR", "USD", "GBP"]), uuid4()] for _ in range(4)]
    return mysql(["invoice_no", "issued", "amount", "currency", "customer_id"], rows), [], "invoice table with ids and amounts"


@N
def n_md_extensions():
    text = md_table(["Team", "Room", "Extension"], [["Payments", "3.14", f"x{digits(4)}"], ["SRE", "2.07", f"x{digits(4)}"], ["Legal", "5.01", "via reception"]])
    return text, [], "room numbers and internal extensions"


@N
def n_tf_sensitive_output_json():
    text = jdump({"db_password": {"sensitive": True, "type": "string", "value": "(sensitive value)"},
                  "db_endpoint": {"sensitive": False, "type": "string", "value": f"orders.c{rs(LO + DG, 12)}.eu-central-1.rds.amazonaws.com:5432"},
                  "db_url_template": {"sensitive": False, "type": "string", "value": "postgres://orders:{password}@orders-db:5432/orders"}})
    return text, [], "terraform output -json with hidden and templated values"


@N
def n_chat_es_no_findings():
    text = "\n".join([
        f"Cliente: Hola, el pedido {R.randint(100000, 999999)} llegó roto.",
        "Agente: Lo siento mucho. ¿Puede enviarnos una foto? Le abriremos una incidencia.",
        f"Agente: Incidencia INC-{R.randint(10000, 99999)} creada el 30/11/2025 a las 12:45.",
    ])
    return text, [], "Spanish support chat with only reference numbers"


N(n_card_wrong_length)


@N
def n_email_shapes2():
    text = "\n".join([
        '<a href="mailto:someone@example.net">someone@example.net</a>',
        '<img srcset="/img/hero@1.5x.webp 1.5x, /img/hero@2x.webp 2x">',
        '"dependencies": {"lodash": "npm:lodash@4.17.21", "qf-ui": "npm:@quillfeather/ui-kit@4.2.0"}',
        "origin  git@gitlab.kestrel-ops.dev:platform/charts.git (fetch)",
        "dsn: postgres://analytics@warehouse.ambergrove.com:5432/dw",
        "cc @ops.oncall -- fallback nobody@invalid",
    ])
    return text, [], "reserved .net, 1.5x asset, npm alias versions, SSH remote, URL user, mention"


@N
def n_phone_shapes2():
    text = "\n".join([
        f"Uptime 99.95% - p99 {R.randint(100, 999)} ms - 2025-11-30 23:59:59 UTC+01:00",
        f"Build 1.24.0-rc.3 - docker 27.3.1 - kernel 6.8.0-{R.randint(10, 99)}-generic",
        f"IPv4 203.0.113.{R.randint(2, 254)}, mask 255.255.255.0",
        "Tax id 123-45-6789; ISBN 979-10-90636-07-1",
        f"Coordinates 48.137154, 11.576124; jingle 867-5309; raw {R.choice(AREAS)}555{digits(4)}",
    ])
    return text, [], "uptime, versions, IPs, SSN/ISBN, coordinates, 7-digit and unformatted numbers"


@N
def n_jwt_shapes2():
    text = "\n".join([
        json.dumps({"issuer": "https://login.ambergrove.com", "jwks_uri": "https://login.ambergrove.com/.well-known/jwks.json",
                    "id_token_signing_alg_values_supported": ["RS256", "ES256"]}),
        json.dumps({"keys": [{"kty": "RSA", "kid": hexs(16), "use": "sig", "alg": "RS256", "n": b64u(R.randbytes(256)), "e": "AQAB"}]}),
        "Authorization: Bearer eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOi...<snip>...",
    ])
    return text, [], "OIDC discovery, JWKS, and a snipped bearer token"


N(n_tf_state_public)
N(n_card_luhn_invalid)
N(n_card_out_of_range)
N(n_long_ids)
N(n_sql_orders)
N(n_ids_table)
N(n_k8s_pod)
N(n_ci_ids_and_hashes)


# ==========================================================================
# build + verify
# ==========================================================================

def verify(text, expect):
    base = scan(text)
    got = collections.Counter((k, m) for k, m, s, e in base)
    for var in VARIANTS:
        alt = collections.Counter((k, m) for k, m, s, e in scan(text, frozenset([var])))
        if alt != got:
            return False, f"variant {var} disagrees: +{dict(alt - got)} -{dict(got - alt)}"
    for k, m, s, e in base:
        for ch in ((text[s - 1] if s > 0 else ""), (text[e] if e < len(text) else "")):
            if ch and ch.isalnum() and not ch.isascii():
                return False, f"{k} {m!r} touches non-ASCII letter {ch!r}"
    want = collections.Counter(expect)
    if got != want:
        return False, f"label mismatch: missing {dict(want - got)} extra {dict(got - want)}"
    return True, ""


def main():
    lines, retries = [], collections.Counter()
    for fn in REG:
        why = ""
        for attempt in range(80):
            text, expect, note = fn()
            ok, why = verify(text, expect)
            if ok:
                break
            retries[fn.__name__] += 1
        else:
            raise SystemExit(f"{fn.__name__}: could not generate a consistent case: {why}")
        for k, m in expect:
            assert k in KINDS, k
        lines.append({"text": text, "expect": [{"kind": k, "match": m} for k, m in expect], "note": note})
    with open(OUT, "w", encoding="utf-8") as f:
        for obj in lines:
            f.write(json.dumps(obj, ensure_ascii=False) + "\n")

    # self-check of the written file
    per_kind, pos, neg = collections.Counter(), 0, 0
    with open(OUT, encoding="utf-8") as f:
        for i, raw in enumerate(f, 1):
            obj = json.loads(raw)
            assert set(obj) == {"text", "expect", "note"}, i
            c = collections.Counter(e["match"] for e in obj["expect"])
            for m, n in c.items():
                assert obj["text"].count(m) >= n, (i, m)
            ok, why = verify(obj["text"], [(e["kind"], e["match"]) for e in obj["expect"]])
            assert ok, (i, why)
            if obj["expect"]:
                pos += 1
            else:
                neg += 1
            per_kind.update(e["kind"] for e in obj["expect"])
    print(f"lines={pos + neg} positive_lines={pos} negative_lines={neg}")
    for k in sorted(KINDS):
        print(f"  {k:24s} {per_kind[k]}")
    if retries:
        print("regenerated (random filler tripped a check):", dict(retries), file=sys.stderr)


if __name__ == "__main__":
    main()
