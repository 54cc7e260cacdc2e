#!/usr/bin/env python3
"""Deterministic generator for the result-guard evaluation corpus.

Writes corpus.jsonl next to this file. One JSON object per line:

    {"text": "...", "expect": [{"kind": ..., "match": ...}, ...], "note": "..."}

"expect" lists every finding that should be reported for "text" (empty for
look-alikes), and "match" is the exact span that should be reported.

Labels are hand-assigned from the documented formats of the detectors, not
from the implementation. Every value is synthetic and generated here with a
fixed seed (cards are Luhn-valid, IBANs are mod-97 valid, JWT headers are real
base64url JSON), so re-running the script reproduces the file byte for byte.

As a guard against labeling mistakes, the script also runs an independent
reference matcher written from the same format descriptions and asserts that
it agrees with every hand-assigned label (see reference_findings()).

Standard library only. Usage: python3 generate.py
"""
import base64
import json
import os
import random
import re
import string
from collections import Counter

SEED = 20260611
R = random.Random(SEED)

UP = string.ascii_uppercase
LO = string.ascii_lowercase
DIG = string.digits
LET = UP + LO
ALNUM = LET + DIG
URLSAFE = ALNUM + "_-"
B64 = ALNUM + "+/"
B32 = UP + "234567"
HEX = "0123456789abcdef"

RECORDS = []


def rs(alphabet, n):
    return "".join(R.choice(alphabet) for _ in range(n))


def add(text, findings, note):
    RECORDS.append(
        {
            "text": text,
            "expect": [{"kind": k, "match": m} for k, m in findings],
            "note": note,
        }
    )


def neg(text, note):
    add(text, [], note)


# --------------------------------------------------------------------------
# checksums
# --------------------------------------------------------------------------


def luhn_ok(digits):
    total = 0
    for i, ch in enumerate(reversed(digits)):
        x = int(ch)
        if i % 2 == 1:
            x *= 2
            if x > 9:
                x -= 9
        total += x
    return total % 10 == 0


def card_network_ok(d):
    """Documented network prefix/length table (13-19 digits overall)."""
    n = len(d)
    if not 13 <= n <= 19:
        return False
    p2, p3, p4 = int(d[:2]), int(d[:3]), int(d[:4])
    if d[0] == "4":
        return n in (13, 16, 19)
    if 51 <= p2 <= 55 or 2221 <= p4 <= 2720:
        return n == 16
    if p2 in (34, 37):
        return n == 15
    if p4 == 6011 or 644 <= p3 <= 649 or p2 == 65:
        return n >= 16
    if p2 == 62:
        return n >= 16
    if 3528 <= p4 <= 3589:
        return n >= 16
    if 300 <= p3 <= 305 or p2 in (36, 38, 39):
        return n >= 14
    if p2 in (50, 56, 57, 58, 63, 67, 69):
        return n >= 12
    return False


def is_card(d):
    return luhn_ok(d) and card_network_ok(d)


IBAN_LEN = {
    "DE": 22, "GB": 22, "FR": 27, "NL": 18, "ES": 24, "IT": 27, "CH": 21,
    "BE": 16, "NO": 15, "AT": 20, "PL": 28, "SE": 24, "IE": 22, "PT": 25,
    "MT": 31, "LU": 20, "DK": 18, "FI": 18, "CZ": 24,
}

IBAN_BBAN = {  # (count, alphabet) segments
    "DE": [(18, DIG)],
    "GB": [(4, UP), (14, DIG)],
    "FR": [(23, DIG)],
    "NL": [(4, UP), (10, DIG)],
    "ES": [(20, DIG)],
    "IT": [(1, UP), (10, DIG), (12, UP + DIG)],
    "CH": [(17, DIG)],
    "BE": [(12, DIG)],
    "NO": [(11, DIG)],
    "AT": [(16, DIG)],
    "PL": [(24, DIG)],
    "SE": [(20, DIG)],
    "IE": [(4, UP), (14, DIG)],
    "PT": [(21, DIG)],
    "MT": [(4, UP), (5, DIG), (18, UP + DIG)],
    "LU": [(3, DIG), (13, UP + DIG)],
    "DK": [(14, DIG)],
    "FI": [(14, DIG)],
    "CZ": [(20, DIG)],
}


def iban_numeric(s):
    return int("".join(str(int(c, 36)) for c in s))


def iban_valid(s):
    s = s.replace(" ", "")
    return iban_numeric(s[4:] + s[:4]) % 97 == 1


def iban_with_check(cc, bban):
    check = 98 - iban_numeric(bban + cc + "00") % 97
    return f"{cc}{check:02d}{bban}"


def spaced(s):
    return " ".join(s[i:i + 4] for i in range(0, len(s), 4))


# --------------------------------------------------------------------------
# "accidental finding" screen used while drawing random values
# --------------------------------------------------------------------------

DIGIT_CHAIN = re.compile(r"[0-9]+(?:[ -][0-9]+)*")


def card_like_spans(text):
    """Aggressive card screen: every maximal digit chain (single spaces or
    dashes between groups); if the whole chain is not a card, every run of
    consecutive groups joined by one separator kind is also tried. Used to
    make sure no unlabeled card hides inside IDs, IBANs, tokens, etc."""
    spans = []
    for m in DIGIT_CHAIN.finditer(text):
        parts = re.split(r"([ -])", m.group())
        groups = parts[0::2]
        seps = parts[1::2]
        starts = []
        pos = m.start()
        for i, g in enumerate(groups):
            starts.append(pos)
            pos += len(g) + (1 if i < len(seps) else 0)
        whole = "".join(groups)
        whole_sep_ok = len(set(seps)) <= 1
        if whole_sep_ok and is_card(whole):
            spans.append((m.start(), m.end()))
            continue
        for i in range(len(groups)):
            for j in range(i, len(groups)):
                if i == 0 and j == len(groups) - 1 and whole_sep_ok:
                    continue
                if len(set(seps[i:j])) > 1:
                    continue
                d = "".join(groups[i:j + 1])
                if is_card(d):
                    spans.append((starts[i], starts[j] + len(groups[j])))
    return spans


def clean(v):
    return (
        "EXAMPLE" not in v
        and "T3BlbkFJ" not in v
        and not card_like_spans(v)
        and not re.search(r"\+[1-9]", v)
    )


def make(fn):
    for _ in range(10000):
        v = fn()
        if clean(v):
            return v
    raise RuntimeError("could not draw a clean value")


# --------------------------------------------------------------------------
# value factories (all synthetic)
# --------------------------------------------------------------------------


def aws_id(prefix="AKIA"):
    return make(lambda: prefix + rs(B32, 16))


def aws_secret(n=40):
    return make(lambda: rs(B64, n))


def gh(prefix="ghp_", n=36):
    return make(lambda: prefix + rs(ALNUM, n))


def gh_pat():
    return make(lambda: "github_pat_" + rs(ALNUM, 22) + "_" + rs(ALNUM, 59))


def glpat(n=20):
    return make(lambda: "glpat-" + rs(ALNUM, 3) + rs(URLSAFE, n - 5) + rs(ALNUM, 2))


def slack_bot():
    return make(lambda: f"xoxb-{rs(DIG, 11)}-{rs(DIG, 13)}-{rs(ALNUM, 24)}")


def slack_user():
    return make(lambda: f"xoxp-{rs(DIG, 11)}-{rs(DIG, 11)}-{rs(DIG, 13)}-{rs(HEX, 32)}")


def slack_hook():
    return make(
        lambda: "hooks.slack.com/services/T"
        + rs(UP + DIG, R.choice([8, 9, 10]))
        + "/B"
        + rs(UP + DIG, R.choice([8, 9, 10]))
        + "/"
        + rs(ALNUM, 24)
    )


def google_key(n=35):
    return make(lambda: "AIzaSy" + rs(URLSAFE, n - 2))


def stripe(prefix="sk_live_", n=24):
    return make(lambda: prefix + rs(ALNUM, n))


def openai_proj(prefix="sk-proj-"):
    return prefix + make(lambda: rs(URLSAFE, 74)) + "T3BlbkFJ" + make(lambda: rs(URLSAFE, 74))


def openai_legacy():
    return "sk-" + make(lambda: rs(ALNUM, 20)) + "T3BlbkFJ" + make(lambda: rs(ALNUM, 20))


def anthropic(prefix="sk-ant-api03-", n=93):
    return make(lambda: prefix + rs(URLSAFE, n) + "AA")


def npm_tok(n=36):
    return make(lambda: "npm_" + rs(ALNUM, n))


def hf_tok(n=34):
    return make(lambda: "hf_" + rs(LET, n))


def sendgrid(a=22, b=43):
    return make(lambda: "SG." + rs(URLSAFE, a) + "." + rs(URLSAFE, b))


def azure_key(nbytes=64):
    return make(lambda: base64.b64encode(R.randbytes(nbytes)).decode())


def b64u(b):
    return base64.urlsafe_b64encode(b).decode().rstrip("=")


def jwt(header=None, payload=None, sig_bytes=32, compact=True):
    if header is None:
        header = {"alg": "HS256", "typ": "JWT"}
    if payload is None:
        payload = {
            "sub": "usr_" + rs(HEX, 12),
            "iat": 1767225600 + R.randrange(0, 9_000_000),
            "exp": 1767229200 + R.randrange(9_000_000, 9_100_000),
        }
    seps = (",", ":") if compact else (", ", ": ")

    def build():
        h = b64u(json.dumps(header, separators=seps).encode())
        p = b64u(json.dumps(payload, separators=seps).encode())
        s = b64u(R.randbytes(sig_bytes)) if sig_bytes else ""
        return f"{h}.{p}.{s}"

    return make(build)


def card(prefix, length, network=True):
    """Luhn-valid number; network=False asks for one outside the card ranges."""

    def build():
        body = prefix + rs(DIG, length - len(prefix) - 1)
        for c in DIG:
            if luhn_ok(body + c):
                return body + c

    for _ in range(10000):
        v = build()
        if card_network_ok(v) == network:
            return v
    raise RuntimeError


def luhn_break(num):
    last = (int(num[-1]) + 3) % 10
    return num[:-1] + str(last)


def grp(num, sizes, sep=" "):
    out, i = [], 0
    for s in sizes:
        out.append(num[i:i + s])
        i += s
    assert i == len(num)
    return sep.join(out)


def g4(num, sep=" "):
    return sep.join(num[i:i + 4] for i in range(0, len(num), 4))


def iban(cc):
    def build():
        bban = "".join(rs(a, n) for n, a in IBAN_BBAN[cc])
        return iban_with_check(cc, bban)

    for _ in range(10000):
        v = build()
        if not card_like_spans(v) and not card_like_spans(spaced(v)):
            assert len(v) == IBAN_LEN[cc] and iban_valid(v)
            return v
    raise RuntimeError


def hexs(n):
    return make(lambda: rs(HEX, n))


def uuid4():
    h = hexs(32)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{R.choice('89ab')}{h[17:20]}-{h[20:]}"


def pem(label, nbytes=150, lead=b"", headers=None, join="\n"):
    def body():
        b = base64.b64encode(lead + R.randbytes(nbytes)).decode()
        return [b[i:i + 64] for i in range(0, len(b), 64)]

    lines = make(lambda: "\n".join(body())).split("\n")
    out = [f"-----BEGIN {label}-----"]
    if headers:
        out += headers + [""]
    out += lines
    out.append(f"-----END {label}-----")
    return join.join(out)


RSA_LEAD = bytes.fromhex("308204a40201000282010100")
PKCS8_LEAD = bytes.fromhex("308204bd020100300d06092a864886f70d0101010500048204a7")
EC_LEAD = bytes.fromhex("307702010104")
OPENSSH_LEAD = b"openssh-key-v1\x00"
SPKI_LEAD = bytes.fromhex("30820122300d06092a864886f70d01010105000382010f00")
CERT_LEAD = bytes.fromhex("3082036130820249a003020102")


# ==========================================================================
# private_key
# ==========================================================================

k = pem("OPENSSH PRIVATE KEY", 230, OPENSSH_LEAD)
add(f"$ cat ~/.ssh/id_ed25519\n{k}\n$ ", [("private_key", k)], "openssh key in shell output")

cert = pem("CERTIFICATE", 200, CERT_LEAD)
k = pem("RSA PRIVATE KEY", 260, RSA_LEAD)
ind = "    "
add(
    "apiVersion: v1\nkind: Secret\nmetadata:\n  name: ingress-tls\ntype: kubernetes.io/tls\nstringData:\n"
    f"  tls.crt: |\n{ind}" + cert.replace("\n", "\n" + ind) + f"\n  tls.key: |\n{ind}" + k.replace("\n", "\n" + ind) + "\n",
    [("private_key", k.replace("\n", "\n" + ind))],
    "rsa key in k8s yaml, indented; certificate is not a finding",
)

params = "-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----"
k = pem("EC PRIVATE KEY", 80, EC_LEAD)
add(f"$ openssl ecparam -name prime256v1 -genkey\n{params}\n{k}\n", [("private_key", k)], "ec key after ec parameters")

k = pem("PRIVATE KEY", 300, PKCS8_LEAD) + "\n"
sa_email = "svc-deploy@proj-ops-4821.iam.gserviceaccount.com"
sa = {
    "type": "service_account",
    "project_id": "proj-ops-4821",
    "private_key_id": hexs(40),
    "private_key": k,
    "client_email": sa_email,
    "client_id": "104857392018374659",
    "auth_uri": "https://accounts.google.com/o/oauth2/auth",
    "client_x509_cert_url": "https://www.googleapis.com/robot/v1/metadata/x509/svc-deploy%40proj-ops-4821.iam.gserviceaccount.com",
}
t = json.dumps(sa, indent=2)
esc = json.dumps(k.rstrip("\n"))[1:-1]
add(t, [("private_key", esc), ("email", sa_email)], "gcp service account json; key has escaped newlines")

k = pem("ENCRYPTED PRIVATE KEY", 200, bytes.fromhex("308202e0305a06092a864886f70d01050d"))
add(f"Here is the key file you asked for (passphrase in the vault):\n\n{k}\n\nLet me know if it fails to load.", [("private_key", k)], "pkcs8 encrypted key in prose")

pgp_body = make(lambda: base64.b64encode(b"\x95\x03\x98\x04" + R.randbytes(180)).decode())
pgp_lines = [pgp_body[i:i + 64] for i in range(0, len(pgp_body), 64)]
k = "-----BEGIN PGP PRIVATE KEY BLOCK-----\nComment: synthetic test key\n\n" + "\n".join(pgp_lines) + "\n=" + rs(B64, 4) + "\n-----END PGP PRIVATE KEY BLOCK-----"
add(f"gpg --export-secret-keys --armor releases@build.invalid\n{k}", [("private_key", k)], "pgp private key block; .invalid uid is not an email")

k_full = pem("RSA PRIVATE KEY", 600, RSA_LEAD)
cut = k_full[: k_full.index("\n", 200) + 31]
add(f"[tool output truncated at 4 KiB]\ncontent of deploy/keys/prod.pem:\n{cut}", [("private_key", cut)], "no END line: span runs to end of text")

k = pem("DSA PRIVATE KEY", 120, bytes.fromhex("308201bb02010002818100"), join="\n+")
add(
    "diff --git a/ops/legacy.key b/ops/legacy.key\nnew file mode 100644\nindex 0000000..3f1c2aa\n--- /dev/null\n+++ b/ops/legacy.key\n@@ -0,0 +1,12 @@\n+" + k + "\n",
    [("private_key", k)],
    "dsa key added in a git diff (+ prefixed lines)",
)

k = pem("RSA PRIVATE KEY", 200, RSA_LEAD, headers=["Proc-Type: 4,ENCRYPTED", "DEK-Info: AES-128-CBC," + hexs(32).upper()])
add(f"root@web01:~# cat /etc/nginx/ssl/site.key\n{k}\nroot@web01:~# ", [("private_key", k)], "legacy encrypted pem with headers; root@web01 is not an email")

# negatives
neg(pem("PUBLIC KEY", 270, SPKI_LEAD), "spki public key")
neg("subject=CN = api.synthco.io\nissuer=CN = Synth Test CA\n" + pem("CERTIFICATE", 300, CERT_LEAD) + "\n" + pem("CERTIFICATE", 280, CERT_LEAD), "certificate chain")
neg(pem("CERTIFICATE REQUEST", 250, bytes.fromhex("308202a23082018a020100")), "csr")
neg("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI" + make(lambda: rs(B64, 43)) + " deploy@ci-runner-07", "openssh public key line")
neg("-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQINBG" + "\n".join(make(lambda: rs(B64, 64)) for _ in range(4)) + "\n=Xk3a\n-----END PGP PUBLIC KEY BLOCK-----", "pgp public key block")
neg('$ grep -rl "BEGIN RSA PRIVATE KEY" ./deploy\n$ echo $?\n1', "header text without PEM dashes in a grep")
neg(pem("RSA PUBLIC KEY", 260, bytes.fromhex("3082010a0282010100")), "pkcs1 public key")
neg("Never paste a private key into chat. If a PRIVATE KEY block leaks, rotate it and revoke the certificate.", "prose about private keys")
neg('if line.startswith("-----BEGIN") and "PRIVATE KEY" in line:\n    raise LeakError(path)', "detector source code, no PEM header")
neg(pem("X509 CRL", 120, bytes.fromhex("308201")), "crl")

# ==========================================================================
# AWS
# ==========================================================================


a2, s2 = aws_id(), aws_secret()
add(f"[default]\naws_access_key_id = {a2}\naws_secret_access_key = {s2}\nregion = eu-central-1\n", [("aws_access_key_id", a2), ("aws_secret_access_key", s2)], "aws credentials ini")

a3, s3 = aws_id("ASIA"), aws_secret()
sts = {
    "Credentials": {
        "AccessKeyId": a3,
        "SecretAccessKey": s3,
        "SessionToken": "IQoJb3JpZ2luX2VjE" + make(lambda: rs(B64, 180)),
        "Expiration": "2026-03-14T10:22:31+00:00",
    },
    "AssumedRoleUser": {
        "AssumedRoleId": aws_id("AROA") + ":ci-session",
        "Arn": "arn:aws:sts::123456789012:assumed-role/ci-deployer/ci-session",
    },
}
add(json.dumps(sts, indent=4), [("aws_access_key_id", a3), ("aws_secret_access_key", s3)], "sts assume-role json; AROA role id is not a key")

a4 = aws_id()
add(f"Rotate key {a4} (owner: platform team) before Friday.", [("aws_access_key_id", a4)], "prose in parentheses context")

a5 = aws_id("ABIA")
add(f'ts=2026-02-03T08:11:09Z level=warn msg="access denied" key_id={a5} region=us-east-1', [("aws_access_key_id", a5)], "logfmt line")

a6, s6 = aws_id(), aws_secret()
add(
    f"User name,Password,Access key ID,Secret access key,Console login link\nci-bot,,{a6},{s6},https://123456789012.signin.aws.amazon.com/console\n",
    [("aws_access_key_id", a6)],
    "console csv: secret has no key=value label, so only the id",
)

a7 = aws_id("ACCA")
add(f"{a7} is still active on the legacy account", [("aws_access_key_id", a7)], "start of text")

a8 = aws_id()
add(f"export AWS_ACCESS_KEY_ID='{a8}'", [("aws_access_key_id", a8)], "end of text in quotes")


a10 = aws_id()
add(f"Clé d'accès : {a10} — à révoquer immédiatement.", [("aws_access_key_id", a10)], "french prose")

s11 = aws_secret()
add(f'variable "creds" {{}}\nprovider "aws" {{\n  region     = "us-west-2"\n  secret_access_key = "{s11}"\n}}', [("aws_secret_access_key", s11)], "terraform hcl")

s12 = aws_secret()
add(f"storage:\n  s3:\n    bucket: backups-eu\n    secretAccessKey: '{s12}'\n    region: eu-west-3\n", [("aws_secret_access_key", s12)], "yaml camelCase")

s13 = aws_secret()
add(f"$ aws configure set default.region us-east-1 && ./sync --secret-access-key={s13} --dry-run", [("aws_secret_access_key", s13)], "cli flag with =")

a14, s14 = aws_id(), aws_secret()
add(f"docker run -e AWS_ACCESS_KEY_ID={a14} -e AWS_SECRET_ACCESS_KEY={s14} synth/uploader:1.4", [("aws_access_key_id", a14), ("aws_secret_access_key", s14)], "docker run env flags")

s15 = aws_secret()
add(f"aws.accessKeyId=${{AWS_KEY}}\naws.secretAccessKey={s15}\n", [("aws_secret_access_key", s15)], "java properties; placeholder id")

# negatives
neg("Example from the docs:\n[default]\naws_access_key_id = AKIAIOSFODNN7EXAMPLE\naws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n", "aws documentation example pair")
neg("Use an access key such as AKIAI44QH8DHBEXAMPLE in the request.", "second doc example")
neg(f"key id {aws_id()[:19]} was truncated in the audit export", "AKIA + 15 chars")
neg(f"token={aws_id()}{R.choice(UP)} expired", "AKIA + 17 chars")
neg(f'"UserId": "{aws_id("AIDA")}", "Arn": "arn:aws:iam::123456789012:user/ci-bot"', "AIDA user id prefix")
neg("AKIA" + make(lambda: rs(UP, 4) + "0" + rs(B32, 5) + "8" + rs(B32, 5)) + " contains 0 and 8, outside base32", "invalid base32 chars")
neg(f"s3://uploads/tmp-{aws_id()}.csv", "preceded by dash")
neg(f"cache key: {aws_id()}_v2", "followed by underscore")
neg(f"lower-cased log: akia{rs(LO + '234567', 16)}", "lowercase")
neg(f'[default]\naws_access_key_id = ${{AWS_ACCESS_KEY_ID}}\naws_secret_access_key = "<your secret key>"\n', "placeholders")
neg(f"aws_secret_access_key = {aws_secret(39)}", "secret 39 chars")
neg(f'SECRET_ACCESS_KEY="{aws_secret(41)}"', "secret 41 chars")
neg(f"commit: {hexs(40)}\ntree: {hexs(40)}\nsecret_key_ref: vault://aws/creds", "40-hex git shas not under the key name")
neg(f"s3cmd:\n  access_key: {aws_id()[:4].lower()}-rotated\n  secret_key = {aws_secret()}", "generic secret_key label, not secret_access_key")
neg("secretAccessKey: ''\nsecretAccessKeyRef: aws-creds", "empty value")
neg(f"AccessKeyId: ********************  SecretAccessKey: ****************************************", "masked")

# ==========================================================================
# GitHub / GitLab
# ==========================================================================

t1 = gh("ghp_")
add(f"GITHUB_TOKEN={t1}\nGITHUB_REPOSITORY=synth-org/infra", [("github_token", t1)], "env")
t2 = gh("gho_")
add(f"GET /user HTTP/1.1\nHost: api.github.com\nAuthorization: token {t2}\nAccept: application/vnd.github+json", [("github_token", t2)], "http header")
t3, t3r = gh("ghu_"), gh("ghr_")
add(json.dumps({"access_token": t3, "expires_in": 28800, "refresh_token": t3r, "token_type": "bearer"}), [("github_token", t3), ("github_token", t3r)], "oauth json ghu + ghr")
t4 = gh("ghs_")
add(f"remote: https://x-access-token:{t4}@github.com/synth-org/api.git", [("url_credentials", f"x-access-token:{t4}"), ("github_token", t4)], "installation token inside url credentials")
t5 = gh_pat()
add(f"I created a fine-grained token {t5} for the release bot.", [("github_token", t5)], "fine-grained pat in prose")
t6 = gh("ghp_")
add(f"The leaked token was {t6}.", [("github_token", t6)], "end of sentence")
t8 = gh("ghp_")
add(f"トークン「{t8}」を無効化してください。", [("github_token", t8)], "japanese prose")
t9 = gh("ghp_")
add(f"$ git remote -v\norigin\thttps://{t9}@github.com/synth-org/web.git (fetch)\norigin\thttps://{t9}@github.com/synth-org/web.git (push)", [("github_token", t9), ("github_token", t9)], "same token twice; user-only url is not url_credentials")

neg(f"token {gh('ghp_', 35)} rejected: bad length", "ghp_ + 35")
neg(f"token {gh('ghp_', 37)} rejected: bad length", "ghp_ + 37")
neg("Set GITHUB_TOKEN=ghp_<your token here> or use `gh auth login`.", "placeholder")
neg("Authorization: token ghp_****************************", "masked")
neg(f"GHP_{rs(ALNUM, 36)} is not a valid prefix (case matters)", "uppercase prefix")
neg(f"github_pat_{rs(ALNUM, 40)}", "github_pat_ with 40 chars (<60)")
neg("Tokens look like ghp_..., gho_..., ghs_... depending on type.", "prefixes only")
neg(f"artifact gha_{rs(ALNUM, 36)}.zip uploaded", "gha_ is not a token prefix")

g1 = glpat()
add(f"PRIVATE-TOKEN: {g1}", [("gitlab_token", g1)], "http header")
g2 = glpat()
add(f"Use the project token {g2}.", [("gitlab_token", g2)], "trailing sentence dot excluded")
g3 = "glpat-" + make(lambda: rs(URLSAFE, 27)) + ".01." + make(lambda: rs(ALNUM, 9))
add(f'variables:\n  GL_TOKEN: "{g3}"\n', [("gitlab_token", g3)], "new-format token with internal dots")
g4_ = glpat(26)
add(f"git clone https://oauth2:{g4_}@gitlab.synthco.io/platform/api.git", [("url_credentials", f"oauth2:{g4_}"), ("gitlab_token", g4_)], "token in clone url")
g5 = glpat()
add(f"{g5}", [("gitlab_token", g5)], "whole text is the token")
g6 = glpat(32)
add(f'{{"name":"ci","token":"{g6}","scopes":["api"]}}', [("gitlab_token", g6)], "json")

neg(f"PRIVATE-TOKEN: glpat-{make(lambda: rs(ALNUM, 19))}", "19 chars after prefix")
neg("PRIVATE-TOKEN: glpat-<redacted>", "placeholder")
neg(f"deploy token: gldt-{make(lambda: rs(ALNUM, 20))}", "gldt- prefix")
neg("Personal access tokens start with glpat- followed by 20 characters.", "prose")
neg(f"token glpat-{make(lambda: rs(ALNUM, 19))}..", "19 chars then trailing dots")

# ==========================================================================
# Slack
# ==========================================================================

sb = slack_bot()
add(f"SLACK_BOT_TOKEN={sb}", [("slack_token", sb)], "bot token env")
sp = slack_user()
add(f'{{"ok":true,"access_token":"{sp}","scope":"chat:write"}}', [("slack_token", sp)], "user token json")
se = "xoxe-1-" + make(lambda: rs(ALNUM, 120))
add(f"refresh_token: {se}\n", [("slack_token", se)], "refresh token yaml")
sa_ = make(lambda: f"xoxa-2-{rs(DIG, 12)}-{rs(DIG, 12)}-{rs(ALNUM, 32)}")
add(f"legacy app token ({sa_}) found in settings.py", [("slack_token", sa_)], "xoxa in parens")
sr = make(lambda: f"xoxr-{rs(DIG, 11)}-{rs(ALNUM, 30)}")
add(f"[INFO] refreshed slack credential {sr}", [("slack_token", sr)], "xoxr log line")
ss = make(lambda: f"xoxs-{rs(DIG, 10)}-{rs(DIG, 10)}-{rs(DIG, 12)}-{rs(HEX, 64)}")
add(f"curl -H 'Authorization: Bearer {ss}' https://slack.com/api/auth.test", [("slack_token", ss)], "xoxs in curl")
so = make(lambda: f"xoxo-{rs(DIG, 9)}-{rs(ALNUM, 18)}")
add(f"token={so}", [("slack_token", so)], "xoxo minimal-ish")

neg("SLACK_BOT_TOKEN=xoxb-your-bot-token", "placeholder starting with a letter")
neg(f"xoxc-{rs(DIG, 11)}-{rs(DIG, 12)}-{rs(HEX, 32)}", "xoxc not in prefix list")
neg("token=xoxb-1234-abc", "too short")
neg(f"token=xoxb-{make(lambda: rs(DIG, 24))}", "no dash after prefix")
neg("SLACK_TOKEN=xoxb-***", "masked")
neg("Slack bot tokens begin with xoxb- and user tokens with xoxp-.", "prose")

h1 = slack_hook()
add(json.dumps({"channel": "#alerts", "webhook_url": "https://" + h1}), [("slack_webhook", h1)], "webhook in json")
h3 = slack_hook()
add(f"curl -X POST -H 'Content-type: application/json' --data '{{\"text\":\"deploy done\"}}' https://{h3}", [("slack_webhook", h3)], "curl")
h4 = slack_hook()
add(f"Notifications go to https://{h4}.", [("slack_webhook", h4)], "sentence end")
h5 = slack_hook()
add(f"alertmanager:\n  receivers:\n    - name: oncall\n      slack_configs:\n        - api_url: 'https://{h5}'\n", [("slack_webhook", h5)], "alertmanager yaml")
h6 = slack_hook()
add(f"hook={h6}", [("slack_webhook", h6)], "no scheme")

hb = slack_hook()
neg(f"https://{hb[:-1]}", "secret 23 chars")
neg(f"https://{hb}{R.choice(ALNUM)}", "secret 25 chars")
neg(f"https://hooks.slack.com/services/t{rs(LO + DIG, 9)}/b{rs(LO + DIG, 9)}/{rs(ALNUM, 24)}", "lowercase team/channel ids")
neg("SLACK_WEBHOOK_URL=https://hooks.slack.com/services/<team>/<channel>/<token>", "placeholder")
neg(f"https://hooks.slack.com/workflows/T{rs(UP + DIG, 9)}/A{rs(UP + DIG, 10)}/{rs(DIG, 18)}/{rs(ALNUM, 24)}", "workflow url, not services")
neg(f"https://hooks.slack.com/services/T{rs(UP + DIG, 9)}/B{rs(UP + DIG, 9)}", "no secret segment")

# ==========================================================================
# Google / Stripe / OpenAI / Anthropic / npm / HF / SendGrid / Azure
# ==========================================================================

k1 = google_key()
add(f"GET https://maps.googleapis.com/maps/api/geocode/json?address=Main+St&key={k1} 200 OK", [("google_api_key", k1)], "query string")
k2 = google_key()
add("const firebaseConfig = {\n  apiKey: \"" + k2 + "\",\n  authDomain: \"synth-app.firebaseapp.com\",\n  projectId: \"synth-app\"\n};", [("google_api_key", k2)], "firebase config")
k4 = google_key()
add(f'<string name="google_maps_key">{k4}</string>', [("google_api_key", k4)], "android xml")
k5 = google_key()
add(f"The browser key is {k5}.", [("google_api_key", k5)], "sentence end")
k6 = google_key()
add(f"https://www.googleapis.com/youtube/v3/videos?key={k6}&part=snippet&id=dQw", [("google_api_key", k6)], "followed by &")

neg(f"key={google_key(34)}", "AIza + 34")
neg(f"key={google_key(36)}", "AIza + 36")
neg("Restrict your key (it starts with AIzaSy...) to specific referrers.", "placeholder")
neg("AIza is the prefix used by Google API keys.", "bare prefix")

p1 = stripe("sk_live_", 24)
add(f"STRIPE_SECRET_KEY={p1}", [("stripe_key", p1)], "24-char live key")
p2 = stripe("sk_live_", 99)
add(f'stripe.api_key = "{p2}"', [("stripe_key", p2)], "long live key")
p3 = stripe("sk_test_", 99)
add(f"curl https://api.stripe.com/v1/charges -u {p3}:", [("stripe_key", p3)], "curl -u with trailing colon")
p4 = stripe("rk_live_", 99)
add(json.dumps({"restricted_key": p4, "livemode": True}), [("stripe_key", p4)], "restricted live key json")
p5 = stripe("rk_test_", 40)
add(f"Using restricted test key {p5} for webhooks.", [("stripe_key", p5)], "restricted test key prose")

neg(f"STRIPE_PUBLISHABLE_KEY=pk_live_{rs(ALNUM, 99)}", "publishable key")
neg(f"pk_test_{rs(ALNUM, 99)}", "publishable test key")
neg(f"STRIPE_SECRET_KEY={stripe('sk_live_', 23)}", "23 chars")
neg("STRIPE_SECRET_KEY=sk_test_...", "placeholder")
neg(f"STRIPE_WEBHOOK_SECRET=whsec_{rs(ALNUM, 32)}", "webhook secret prefix")
neg(json.dumps({"id": "pi_3" + rs(ALNUM, 23), "client_secret": "pi_3" + rs(ALNUM, 23) + "_secret_" + rs(ALNUM, 25), "customer": "cus_" + rs(ALNUM, 14)}), "stripe object ids")

o1 = openai_proj()
add(f"OPENAI_API_KEY={o1}\n", [("openai_key", o1)], "project key env")
o2 = openai_proj("sk-svcacct-")
add(f'client = OpenAI(api_key="{o2}")', [("openai_key", o2)], "service account key python")
o3 = "sk-admin-" + make(lambda: rs(URLSAFE, 40))
add(f"admin key: {o3}", [("openai_key", o3)], "admin key without T3Blbk")
o4 = openai_legacy()
add(f"openai.error.AuthenticationError: Incorrect API key provided: {o4}. You can find your API key at https://platform.openai.com/account/api-keys.", [("openai_key", o4)], "legacy key in error message")
o5 = "sk-proj-" + make(lambda: rs(ALNUM, 35))
add(f"key={o5}", [("openai_key", o5)], "proj key, exactly 40 chars after sk-")

neg("OPENAI_API_KEY=sk-proj-abc123", "short project key")
neg("export OPENAI_API_KEY=sk-...", "placeholder")
neg(f"DEEPSEEK_API_KEY=sk-{make(lambda: rs(ALNUM, 48))}", "sk- + 48 without marker")
neg(f"key=sk-proj-{make(lambda: rs(ALNUM, 34))}", "39 chars after sk- (one short)")
neg("Incorrect API key provided: sk-proj-********************************************Xk2Q.", "masked by the api")
neg("task-runner-7f3a: disk-usage-ok; ask-before-delete=true", "words containing sk-")

n1 = anthropic()
add(f"ANTHROPIC_API_KEY={n1}", [("anthropic_key", n1)], "api key env")
n2 = anthropic("sk-ant-admin01-", 91)
add(f'headers = {{"x-api-key": "{n2}", "anthropic-version": "2023-06-01"}}', [("anthropic_key", n2)], "admin key in headers")
n3 = anthropic()
add(f"2026-01-09 12:00:01 ERROR auth failed for key {n3}", [("anthropic_key", n3)], "log")
n4 = anthropic("sk-ant-api03-", 78)
add(f"key: {n4}\n", [("anthropic_key", n4)], "exactly 90 after sk-")

neg(f"ANTHROPIC_API_KEY=sk-ant-api03-{make(lambda: rs(URLSAFE, 79))}", "89 chars after sk- (one short)")
neg("ANTHROPIC_API_KEY=sk-ant-...", "placeholder")
neg("key sk-ant-api03-****...****AA was revoked", "masked")

m1 = npm_tok()
add(f"//registry.npmjs.org/:_authToken={m1}\n", [("npm_token", m1)], ".npmrc")
m2 = npm_tok()
add(f"env:\n  NPM_TOKEN: {m2}\n", [("npm_token", m2)], "yaml")
m3 = npm_tok()
add(f"Publishing with {m3}, scope @synth.", [("npm_token", m3)], "prose with comma")
m4 = npm_tok()
add(json.dumps({"token": m4, "readonly": False, "cidr_whitelist": None}), [("npm_token", m4)], "npm token list json")

neg(f"//registry.npmjs.org/:_authToken={npm_tok(35)}", "npm_ + 35")
neg(f"NPM_TOKEN={npm_tok(37)}", "npm_ + 37")
neg("npm_config_registry=https://registry.npmjs.org/\nnpm_package_version=4.2.1\nnpm_lifecycle_event=build", "npm env var names")
neg("//registry.npmjs.org/:_authToken=${NPM_TOKEN}", "placeholder")

f1 = hf_tok()
add(f"HF_TOKEN={f1}", [("huggingface_token", f1)], "env")
f2 = hf_tok()
add(f"Authorization: Bearer {f2}", [("huggingface_token", f2)], "bearer header")
f3 = hf_tok()
add(f'login(token="{f3}")\nmodel = AutoModel.from_pretrained("synth/tiny")', [("huggingface_token", f3)], "python")
f4 = hf_tok()
add(f"Token is valid (permission: write).\nYour token has been saved to /root/.cache/huggingface/token\nToken: {f4}", [("huggingface_token", f4)], "cli output")

neg(f"HF_TOKEN=hf_{rs(LET, 33)}", "33 letters")
neg(f"HF_TOKEN=hf_{make(lambda: rs(LET, 20) + R.choice(DIG) + rs(LET, 13))}", "34 chars with a digit")
neg("from huggingface_hub import hf_hub_download\nos.environ['HF_HUB_ENABLE_HF_TRANSFER'] = '1'  # needs hf_transfer", "hf_ identifiers")
neg(f"HF_TOKEN=hf_{rs(LET, 35)}", "35 letters")

q1 = sendgrid()
add(f"SENDGRID_API_KEY={q1}", [("sendgrid_key", q1)], "env")
q2 = sendgrid()
add(f"sg = SendGridAPIClient('{q2}')", [("sendgrid_key", q2)], "python")
q3 = sendgrid()
add(f"smtp:\n  host: smtp.sendgrid.net\n  user: apikey\n  pass: {q3}\n", [("sendgrid_key", q3)], "yaml")
q4 = sendgrid()
add(f"Found key {q4} in build log.", [("sendgrid_key", q4)], "prose")

neg(f"SENDGRID_API_KEY={sendgrid(22, 42)}", "second part 42")
neg("SENDGRID_API_KEY=SG.xxxxx.yyyyy", "short placeholder")
neg("Keys have the form SG.<id>.<secret>.", "prose")

z1 = azure_key()
add(f"AZURE_STORAGE_CONNECTION_STRING=DefaultEndpointsProtocol=https;AccountName=stsynthdemo01;AccountKey={z1};EndpointSuffix=core.windows.net", [("azure_storage_key", z1)], "connection string env")
z2 = azure_key()
add(json.dumps({"ConnectionStrings": {"Blob": f"DefaultEndpointsProtocol=https;AccountName=stsynthlogs;AccountKey={z2};EndpointSuffix=core.windows.net"}}, indent=2), [("azure_storage_key", z2)], "appsettings.json")
z3 = azure_key()
add(f"Connection failed: AccountName=stsynthbk;AccountKey={z3}", [("azure_storage_key", z3)], "end of text")
z4 = azure_key()
add(f"storage:\n  conn: \"AccountKey={z4};AccountName=stsynthq\"\n", [("azure_storage_key", z4)], "yaml, key first")

neg("DefaultEndpointsProtocol=https;AccountName=stsynthdemo01;AccountKey=<storage-account-key>;EndpointSuffix=core.windows.net", "placeholder")
neg(f"AccountName=stsynth;AccountKey={azure_key()[:-4]}==", "84 chars + == (two short)")
neg(f"Endpoint=sb://synth-bus.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={azure_key(32)}", "service bus SharedAccessKey")
neg(f"https://stsynth.blob.core.windows.net/c/a.txt?sv=2022-11-02&ss=b&srt=o&sp=r&se=2026-12-31T00:00:00Z&sig={azure_key(32).replace('+', '%2B').replace('/', '%2F')}", "sas url")
neg(f"Content-Digest: sha-512=:{azure_key()}:", "88-char base64 without AccountKey=")

# ==========================================================================
# JWT
# ==========================================================================

j1 = jwt()
add(f"GET /api/v1/orders HTTP/1.1\nHost: api.synthco.io\nAuthorization: Bearer {j1}\nUser-Agent: curl/8.5.0", [("jwt", j1)], "bearer header")
j2 = jwt({"alg": "RS256", "kid": hexs(16), "typ": "JWT"}, sig_bytes=256)
j3 = jwt({"alg": "RS256", "kid": hexs(16)}, sig_bytes=256)
add(json.dumps({"access_token": j2, "id_token": j3, "token_type": "Bearer", "expires_in": 3600}, indent=2), [("jwt", j2), ("jwt", j3)], "oidc token response, two jwts")
j4 = jwt({"alg": "ES256", "typ": "JWT"}, sig_bytes=64)
add(f"Set-Cookie: session={j4}; Path=/; HttpOnly; Secure", [("jwt", j4)], "cookie")
j5 = jwt()
add(f"https://app.synthco.io/sso/callback?token={j5}&next=%2Fdashboard", [("jwt", j5)], "query string")
j6 = jwt({"alg": "HS512", "typ": "JWT"}, sig_bytes=64, compact=False)
add(f"level=debug msg=\"verified\" jwt={j6} dur=3ms", [("jwt", j6)], "spaced json header")
j7 = jwt()
add(f"The token {j7}.", [("jwt", j7)], "sentence end")
j8 = jwt({"alg": "EdDSA"}, sig_bytes=64)
add(f"{j8}", [("jwt", j8)], "whole text")

neg(f"Bearer {jwt({'typ': 'JWT', 'kid': 'k1'})}", "header without alg")
neg(f"Bearer {jwt(sig_bytes=11)}", "15-char signature")
neg(f"Bearer {jwt({'alg': 'none'}, sig_bytes=0)}", "unsigned, empty signature")
jj = jwt()
neg(f"header.payload only: {jj.rsplit('.', 1)[0]}", "two parts")
neg(f"{b64u(json.dumps({'alg': 'RSA-OAEP', 'enc': 'A256GCM'}).encode())}.{b64u(R.randbytes(256))}.{b64u(R.randbytes(12))}.{b64u(R.randbytes(64))}.{b64u(R.randbytes(16))}", "jwe: second part is not eyJ")
neg(json.dumps({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson", "data": {".dockerconfigjson": base64.b64encode(json.dumps({"auths": {"registry.synthco.io": {"auth": "cHVsbGVyOnNlY3JldA=="}}}).encode()).decode()}}), "base64 json blob, no dots")
neg("Authorization: Bearer eyJhbGciOi...", "truncated placeholder")
neg(json.dumps({"keys": [{"kty": "RSA", "kid": hexs(16), "use": "sig", "alg": "RS256", "n": b64u(R.randbytes(256)), "e": "AQAB"}]}), "jwks document")
neg(f"{b64u(json.dumps({'alg': 'HS256'}).encode())}.e30.{b64u(R.randbytes(32))}", "payload {} is not eyJ")

# ==========================================================================
# URL credentials
# ==========================================================================


def pw(n=16):
    return make(lambda: R.choice(LET) + rs(ALNUM + "-_.~", n - 2) + R.choice(ALNUM))


u1 = pw()
add(f"DATABASE_URL=postgres://app_rw:{u1}@db.internal:5432/orders?sslmode=require", [("url_credentials", f"app_rw:{u1}")], "postgres env")
u2 = pw()
add(f"sqlalchemy.exc.OperationalError: (psycopg2.OperationalError) could not connect\n[SQL: SELECT 1]\n(url: postgresql+psycopg2://reporter:{u2}@10.0.4.12/analytics)", [("url_credentials", f"reporter:{u2}")], "scheme with +, in traceback")
u3 = pw(20)
add(f'spring:\n  data:\n    mongodb:\n      uri: "mongodb+srv://svc-api:{u3}@cluster0.ab1cd.mongodb.net/prod?retryWrites=true"\n', [("url_credentials", f"svc-api:{u3}")], "mongodb+srv yaml; password@host is not an email")
add("BROKER_URL=amqp://guest:guest@localhost:5672//", [("url_credentials", "guest:guest")], "default creds are still credentials")
u5 = pw(12)
add(f"redis://default:{u5}@cache-01.synthco.io:6379/0", [("url_credentials", f"default:{u5}")], "redis")
u7 = pw(10)
add(f"smtp://mailer%40synthco.io:{u7}@smtp.synthco.io:587", [("url_credentials", f"mailer%40synthco.io:{u7}")], "percent-encoded user")
u8 = pw()
add(f"Fehler beim Verbinden mit mysql://root:{u8}@127.0.0.1:3306/shop – Zugriff verweigert.", [("url_credentials", f"root:{u8}")], "german prose")
u9 = pw()
add(f'{{"proxy": "http://proxyuser:{u9}@proxy.corp.synthco.io:3128"}}', [("url_credentials", f"proxyuser:{u9}")], "proxy json")

for p, why in [
    ("password", "literal password"),
    ("PASSWORD", "uppercase placeholder"),
    ("${DB_PASSWORD}", "env interpolation"),
    ("<password>", "angle placeholder"),
    ("[REDACTED]", "bracket redaction"),
    ("****", "stars"),
    ("xxxxxxxx", "all x"),
    ("changeme", "changeme"),
    ("Secret", "secret any case"),
    ("pwd", "pwd"),
    ("passwd", "passwd"),
    ("pass", "pass"),
    ("redacted", "redacted"),
    ("{{DB_PASS}}", "template"),
]:
    neg(f"DATABASE_URL=postgres://app:{p}@db.synthco.io:5432/app", f"placeholder password: {why}")
neg("git clone ssh://git@bitbucket.org/synth/infra.git", "no password")
neg("docker login https://deploy@registry.synthco.io/v2/", "user without password")
neg("See https://social.synthco.io:8443/users/@maria for details.", "port and @ in path")
neg("curl -u admin:hunter2-synthetic https://api.synthco.io/health", "no scheme:// form")

# ==========================================================================
# Email
# ==========================================================================

emails_simple = [
    ("maria.gonzalez@northwind-traders.io", "Please forward the contract to maria.gonzalez@northwind-traders.io before Monday.", "prose"),
    ("ops-oncall@kestrel-health.org", "Escalate to <ops-oncall@kestrel-health.org>.", "angle brackets"),
    ("chen.wei@orbitlabs.ai", '{"id": 4412, "email": "chen.wei@orbitlabs.ai", "role": "admin"}', "json"),
    ("priya_k@bluefin-analytics.co.uk", "contact: priya_k@bluefin-analytics.co.uk\n", "yaml, multi-label domain"),
    ("x@synthco.io", "x@synthco.io", "one-char local part, whole text"),
    ("Support@Contoso-Retail.COM", "Questions? Write to Support@Contoso-Retail.COM", "mixed case, end of text"),
    ("billing%ops@relay.fabrikam.io", "forwarded via billing%ops@relay.fabrikam.io (relay)", "percent in local part"),
    ("lars.eriksson@vasa-logistik.se", "mailto:lars.eriksson@vasa-logistik.se?subject=Faktura", "mailto link"),
    ("sales@examples.com", "Reach sales@examples.com for a quote.", "examples.com is not the reserved example.com"),
]
for e, t, why in emails_simple:
    add(t, [("email", e)], why)
add("From: Tailspin Air <noreply@notify.tailspin-air.net>\nReply-To: j.smith+billing@fabrikam-mail.com\nSubject: Your booking",
    [("email", "noreply@notify.tailspin-air.net"), ("email", "j.smith+billing@fabrikam-mail.com")], "mail headers, plus tag")

e1 = "41928374+octo-synth@users.noreply.github.com"
add(f"commit {hexs(40)}\nAuthor: Octo Synth <{e1}>\nDate:   Tue Mar 3 10:12:44 2026 +0100\n\n    fix: handle empty cart", [("email", e1)], "git log author")
add("2026-02-14T09:00:01.123Z INFO user.login email=t.okafor@synthbank.ng ip=203.0.113.45 ua=\"Mozilla/5.0\"", [("email", "t.okafor@synthbank.ng")], "log line with ip")
add("お問い合わせは「taro.yamada@synth-shop.jp」までご連絡ください。", [("email", "taro.yamada@synth-shop.jp")], "japanese prose with brackets")
add("Für Rückfragen: anna.mueller@beispielfirma.de, Tel. intern 4711.", [("email", "anna.mueller@beispielfirma.de")], "german prose, comma")
add("id,name,email,plan\n101,Ada Quinn,ada.quinn@quillmail.io,pro\n102,Bo Reyes,bo.reyes@quillmail.io,free\n103,Cy Test,cy@example.com,free\n",
    [("email", "ada.quinn@quillmail.io"), ("email", "bo.reyes@quillmail.io")], "csv; example.com row excluded")
add("Thread: dana.li@harbor-freight-synth.com wrote: ... > dana.li@harbor-freight-synth.com wrote earlier: ...",
    [("email", "dana.li@harbor-freight-synth.com"), ("email", "dana.li@harbor-freight-synth.com")], "same email twice")
add("Traceback (most recent call last):\n  File \"/srv/app/notify.py\", line 88, in send\n    smtp.sendmail(sender, [rcpt], msg)\nsmtplib.SMTPRecipientsRefused: {'kim.park@lumen-dental.kr': (550, b'5.1.1 User unknown')}",
    [("email", "kim.park@lumen-dental.kr")], "stack trace")

neg("Use user@example.com, admin@example.org or noreply@example.net in tests.", "reserved example domains")
neg("qa@staging.test, bot@ci.invalid, dev@api.localhost and alice@corp.example are fixtures.", "reserved tlds")
neg('<img src="/img/logo@2x.png" srcset="/img/hero-banner@3x.webp 3x">', "image scale suffixes")
neg("added lodash@4.17.21, @angular/core@17.3.0 and typescript@5.4.5 (3 packages)", "package@version")
neg("git@github.com:synth-org/infra.git\ngit@gitlab.synthco.io:platform/api.git", "ssh remotes")
neg("@maria-gonzalez please review; cc @ops-team", "mentions")
neg("root@localhost:~# whoami\npostgres@db01 $ psql", "single-label hosts")
neg(f"image: nginx@sha256:{hexs(64)}", "docker digest")
neg('@app.get("/users/{user_id}")\ndef read_user(user_id: int): ...', "python decorator")
neg("Reply from j***@fabrikam-mail.com was masked by the API.", "masked local part")
neg("ping admin@10.0.0.5 failed; try admin@[10.0.0.5]", "ip literal domain")
neg("The address name@domain.c is invalid (one-letter TLD).", "one-letter tld")
neg("Write to maria dot gonzalez at northwind dot io.", "obfuscated")
neg("pnpm add -D @types/node@20.11.5 vitest@1.6.0", "scoped package versions")

# ==========================================================================
# Phone
# ==========================================================================

phones = [
    ("+1 415 555 0132", "Call me at +1 415 555 0132 tomorrow.", "us intl spaces"),
    ("+44 20 7946 0958", '{"name": "Oliver Hart", "phone": "+44 20 7946 0958"}', "uk json"),
    ("+49 (0)30 901820", "Tel.: +49 (0)30 901820\nFax: keine", "parenthesized trunk zero"),
    ("+33 6 12 34 56 78", "Téléphone : +33 6 12 34 56 78.", "french prose"),
    ("+81-3-1234-5678", "電話番号（+81-3-1234-5678）までお電話ください。", "japanese fullwidth parens"),
    ("+4915112345670", "WhatsApp: +4915112345670", "contiguous 13 digits"),
    ("+1 (628) 555-0147", "Mobile: +1 (628) 555-0147 (after 6pm)", "us intl with area parens"),
    ("(415) 555-0199", "Please call (415) 555-0199.", "nanp parens"),
    ("212-555-0143", "name,phone\nRuth Cole,212-555-0143\n", "nanp dashes csv"),
    ("+55 11 91234-5678", "Celular: +55 11 91234-5678", "brazil mixed separators"),
    ("+7 495 123-45-67", "Телефон: +7 495 123-45-67", "russian"),
    ("+1-202-555-0187", "[sms] delivered to +1-202-555-0187 at 09:14", "dashes with country code"),
]
for p_, t, why in phones:
    add(t, [("phone", p_)], why)
add("Office: 312.555.0178 | Sydney: phone=+61.2.9876.5432;", [("phone", "312.555.0178"), ("phone", "+61.2.9876.5432")], "nanp dots and intl dots")
add("Support lines: India +91 98765 43210, Netherlands +31 (0)20 555 0147.", [("phone", "+91 98765 43210"), ("phone", "+31 (0)20 555 0147")], "two intl numbers, sentence end")
add("phone_home: (646) 555-0110\nphone_work: +353 1 555 0142\n", [("phone", "(646) 555-0110"), ("phone", "+353 1 555 0142")], "two phones yaml")

neg("Release 2026-11-30, hotfix 2026.12.01, rollback 01.12.2026 at 14:05:33.", "dates and times")
neg("Peers: 192.168.100.200, 10.212.55.143, 172.16.254.1", "ip addresses")
neg("Running build 4.212.555.0143 of the agent (v10.2.3).", "version run containing nanp shape")
neg("Timestamp: 2026-03-14T09:15:00+05:30", "utc offset")
neg("Quick check: 3+4=7 and 12+30=42.", "arithmetic")
neg("SSN on file: 219-09-9999", "ssn shape")
neg("ISBN 978-3-16-148410-0 and ISBN-13 978-0-306-40615-7", "isbns")
neg("Extension: 555-0123", "7-digit local")
neg(f"order_ref=4155550132 tracking=1Z999AA10123456784", "unformatted 10 digits")
neg("Sample: 123-456-7890 and (055) 123-4567", "area code starting 1 or 0")
neg("Bad number 212-155-0143 (exchange starts with 1).", "exchange starting 1")
neg("dial +1 234 56 for the lobby", "too few digits")
neg("+49 1234 5678 9012 3456 is not a number", "too many digits")
neg("Spacing test: +44  20  7946  0958", "double spaces")
neg("part no. 10-212-555-0143-7 and 212-555-01434", "embedded in longer dashed run")
neg("@@ -12,7 +12,9 @@ def handler(event):", "diff hunk header")
neg("Coordinates: +37.7749, -122.4194", "coordinates")
neg("uptime 1995-2026, +30 days, latency +1234ms", "ranges and deltas")
neg("Date: Tue, 03 Mar 2026 10:12:44 +0000", "rfc 2822 date offset")

# ==========================================================================
# Payment cards
# ==========================================================================

c = card("4", 16)
add(f"Charge the Visa {g4(c)} for the annual renewal.", [("payment_card", g4(c))], "visa spaced")
c = card("5" + R.choice("12345"), 16)
add(json.dumps({"payment": {"card_number": c, "exp": "09/29", "holder": "A. Quinn"}}), [("payment_card", c)], "mastercard json")
c = card(str(R.randint(2221, 2720)), 16)
add(f"level=info pan={g4(c, '-')} amount=49.90 currency=EUR", [("payment_card", g4(c, "-"))], "mc 2-series dashes")
c = card("37", 15)
add(f"Card on file: AmEx {grp(c, [4, 6, 5])}", [("payment_card", grp(c, [4, 6, 5]))], "amex 4-6-5")
c = card("6011", 16)
add(f"order_id,card,total\n9912,{c},120.00\n", [("payment_card", c)], "discover csv")
c = card("65", 16)
add(f"Discover {g4(c)}", [("payment_card", g4(c))], "discover 65")
c = card(str(R.randint(644, 649)), 16)
add(f"card={g4(c, '-')}", [("payment_card", g4(c, "-"))], "discover 64x dashes")
c = card("62", 19)
add(f"银联卡号：{c}，请核对。", [("payment_card", c)], "unionpay 19 in chinese prose")
c = card(str(R.randint(3528, 3589)), 16)
c2 = card("39", 16)
add(f"Cards on file: JCB: {g4(c)}; Diners: {g4(c2)}", [("payment_card", g4(c)), ("payment_card", g4(c2))], "jcb and diners 39 (16 digits)")
c = card("36", 14)
add(f"Diners Club {grp(c, [4, 6, 4])} exp 11/27", [("payment_card", grp(c, [4, 6, 4]))], "diners 36 4-6-4")
c = card(str(R.randint(300, 305)), 14)
add(f'"pan": "{c}"', [("payment_card", c)], "diners 30x contiguous")
c = card("6759", 16)
add(f"Maestro {g4(c)}", [("payment_card", g4(c))], "maestro 67")
c = card("5018", 19)
add(f"maestro_pan={c}", [("payment_card", c)], "maestro 50, 19 digits")
c = card("4", 13)
add(f"legacy visa {c} (13 digits)", [("payment_card", c)], "visa 13")
c = card("4", 19)
add(f"Tarjeta: {grp(c, [4, 4, 4, 4, 3])}.", [("payment_card", grp(c, [4, 4, 4, 4, 3]))], "visa 19 spanish")
c = card("51", 16)
add(f"billing:\n  card: \"{g4(c, '-')}\"\n  zip: \"94107\"\n", [("payment_card", g4(c, "-"))], "mc 51 yaml")
c = card("34", 15)
add(f"stripe.error.CardError: Your card {c} was declined.\n  at charge (billing.js:88:13)", [("payment_card", c)], "amex in error")
c = card("63", 16)
add(f"{g4(c)}", [("payment_card", g4(c))], "maestro 63 whole text")

cv = card("4", 16)
neg(f"Charge the Visa {g4(luhn_break(cv))} for the renewal.", "luhn-invalid visa")
neg(f"card_number={card('4', 15, False)}", "visa length 15")
neg(f"card_number={card('37', 16, False)}", "amex prefix with 16 digits")
neg(f"order {card('7001', 16, False)} shipped", "order id prefix 7")
neg("created_at_ms=1767225600000 updated_at_ms=1767312000000", "epoch millis")
neg(f"discord user id {card('11873', 19, False)}", "snowflake prefix 1")
cm = card("54", 16)
neg(f"card {cm[:4]} {cm[4:8]}-{cm[8:12]} {cm[12:]}", "mixed separators")
cd = card("45", 16)
neg(f"card {cd[:4]}  {cd[4:8]}  {cd[8:12]}  {cd[12:]}", "double spaces")
while True:
    c20 = card("4", 20, False)
    if not card_like_spans(g4(c20)):
        break
neg(f"ref {g4(c20)}", "20 digits")
neg("Card: **** **** **** 4242 (Visa), 5555 55** **** 4444", "masked pans")
cs = card("4", 16)
neg(f"path /cards/{cs[:4]}/{cs[4:8]}/{cs[8:12]}/{cs[12:]}/", "slash separators")
neg(f"IMEI: {card('3520', 15, False)}", "imei, luhn-valid but not a card range")
neg(f"ICCID {card('8944', 19, False)}", "sim iccid prefix 89")
neg(f"acct {card('31', 16, False)}", "prefix 31 not a network")
neg(f"UnionPay {card('62', 15, False)}", "unionpay 15 digits")
neg("USPS 9400 1000 0000 0000 0000 00, FedEx 7712 3456 7890", "tracking numbers")

# ==========================================================================
# IBAN
# ==========================================================================

i = iban("DE")
add(f"Bitte überweisen Sie den Betrag auf IBAN {spaced(i)} bis Freitag.", [("iban", spaced(i))], "german prose spaced")
i = iban("GB")
add(json.dumps({"beneficiary": "Synth Ltd", "iban": i, "bic": "SYNTGB2L"}), [("iban", i)], "gb json contiguous")
i = iban("FR")
add(f"RIB / IBAN : {spaced(i)}\nBIC : SYNTFRPP", [("iban", spaced(i))], "french invoice")
i = iban("NL")
add(f"name;iban;amount\nJ. de Vries;{i};250,00\n", [("iban", i)], "nl csv semicolons")
i = iban("ES")
add(f"Cuenta: {spaced(i)}.", [("iban", spaced(i))], "spanish sentence end")
i = iban("IT")
add(f"iban={i}", [("iban", i)], "it with letters")
i = iban("CH")
add(f"Konto (IBAN): {spaced(i)}", [("iban", spaced(i))], "swiss in parens label")
i = iban("BE")
add(f"{spaced(i)}", [("iban", spaced(i))], "be whole text")
i = iban("NO")
add(f"Betal til {i} innen 14 dager", [("iban", i)], "no shortest 15")
i = iban("PL")
add(f'"account": "{i}"', [("iban", i)], "pl 28")
i = iban("MT")
add(f"MT account {spaced(i)} confirmed", [("iban", spaced(i))], "malta 31 with letters")
i = iban("PT")
add(f"NIB/IBAN: {i}\n", [("iban", i)], "portugal")
i_ie, e_ie, c_ie = iban("IE"), "niamh.byrne@clover-accounts.ie", "+353 87 555 0123"
add(f"Customer: Niamh Byrne <{e_ie}>, mobile {c_ie}, IBAN {spaced(i_ie)}", [("email", e_ie), ("phone", c_ie), ("iban", spaced(i_ie))], "mixed pii")

iw = iban("DE")
bad = iw[:2] + f"{(int(iw[2:4]) + 1) % 100:02d}" + iw[4:]
assert not iban_valid(bad)
neg(f"IBAN {spaced(bad)}", "wrong check digits")
ig = iban("GB")
short = iban_with_check("GB", ig[4:-1])
assert iban_valid(short) and len(short) == 21
neg(f"IBAN {short}", "gb 21 chars, mod-97 valid but wrong length")
ide = iban("DE")
long_ = iban_with_check("DE", ide[4:] + "7")
neg(f"IBAN {spaced(long_)}", "de 23 chars, mod-97 valid but wrong length")
neg(f"iban: {spaced(iban('NL')).lower()}", "lowercase")
zz = iban_with_check("ZZ", "".join(rs(DIG, 18)))
neg(f"IBAN {zz}", "unregistered country code")
ifr = iban("FR")
neg(f"IBAN {' '.join(ifr[i:i + 3] for i in range(0, len(ifr), 3))}", "groups of 3")
neg("Format: DEkk bbbb bbbb cccc cccc cc (kk = check digits)", "format template")
neg("BIC codes: DEUTDEFF, COBADEFFXXX, SYNTGB2L", "bics")
while True:
    itr = iban("ES")
    swapped = itr[:10] + itr[11] + itr[10] + itr[12:]
    if not iban_valid(swapped) and not card_like_spans(spaced(swapped)):
        break
neg(f"Cuenta {spaced(swapped)}", "transposed digits")

# ==========================================================================
# mixed multi-finding documents
# ==========================================================================

ma, ms, mw, mk, mg, mpw = aws_id(), aws_secret(), slack_hook(), stripe("sk_live_", 99), sendgrid(), pw()
add(
    "# .env.production\nNODE_ENV=production\n"
    f"AWS_ACCESS_KEY_ID={ma}\nAWS_SECRET_ACCESS_KEY={ms}\n"
    f"DATABASE_URL=postgres://api:{mpw}@db.prod.synthco.io:5432/api\n"
    f"SLACK_WEBHOOK=https://{mw}\nSTRIPE_KEY={mk}\nSENDGRID_API_KEY={mg}\nLOG_LEVEL=info\n",
    [("aws_access_key_id", ma), ("aws_secret_access_key", ms), ("url_credentials", f"api:{mpw}"), ("slack_webhook", mw), ("stripe_key", mk), ("sendgrid_key", mg)],
    "env file with six secrets",
)

mc, mi = card("4", 16), iban("DE")
cust = {
    "id": "cus_" + rs(ALNUM, 14),
    "name": "Lena Vogel",
    "email": "lena.vogel@postfach-synth.de",
    "phone": "+49 170 5550123",
    "card": {"number": g4(mc), "exp": "04/28"},
    "iban": spaced(mi),
    "created": "2026-01-15T08:30:00Z",
}
add(json.dumps(cust, indent=2, ensure_ascii=False), [("email", "lena.vogel@postfach-synth.de"), ("phone", "+49 170 5550123"), ("payment_card", g4(mc)), ("iban", spaced(mi))], "customer record json")

mj = jwt()
add(
    f'203.0.113.9 - - [14/Mar/2026:10:00:01 +0000] "GET /me HTTP/1.1" 200 512 "-" "curl/8.5"\n'
    f"DEBUG auth: bearer={mj} user=felix.ng@quantum-synth.io\n",
    [("jwt", mj), ("email", "felix.ng@quantum-synth.io")],
    "access log + debug with jwt and email",
)

add(
    "name,email,phone\nRosa Lind,rosa.lind@kvarn-synth.se,+46 8 555 012 34\nTom Ueda,tom.ueda@kaze-synth.jp,(917) 555-0166\nTest User,test@example.com,555-0100\n",
    [("email", "rosa.lind@kvarn-synth.se"), ("phone", "+46 8 555 012 34"), ("email", "tom.ueda@kaze-synth.jp"), ("phone", "(917) 555-0166")],
    "contacts csv; reserved email and 7-digit number excluded",
)

mgh, mnpm, mrpw = gh("ghp_"), npm_tok(), pw()
add(
    "apiVersion: v1\nkind: Secret\nmetadata:\n  name: ci-creds\nstringData:\n"
    f"  GH_TOKEN: {mgh}\n  NPM_TOKEN: {mnpm}\n  REGISTRY_URL: https://ci-pull:{mrpw}@registry.synthco.io\n",
    [("github_token", mgh), ("npm_token", mnpm), ("url_credentials", f"ci-pull:{mrpw}")],
    "k8s secret stringData",
)

mpw2 = pw()
add(
    "Exception in thread \"main\" java.sql.SQLException: Access denied for user 'etl'\n"
    f"\tat com.synth.etl.Db.connect(Db.java:42) url=jdbc:mysql://etl:{mpw2}@mysql-02.synthco.io:3306/dw\n"
    "\tat com.synth.etl.Main.main(Main.java:17)\nReport to data-eng@synthco.io",
    [("url_credentials", f"etl:{mpw2}"), ("email", "data-eng@synthco.io")],
    "java stack trace",
)

mhf, moa, man, mgk = hf_tok(), openai_proj(), anthropic(), google_key()
add(
    "$ env | sort\nHOME=/home/dev\n"
    f"ANTHROPIC_API_KEY={man}\nGOOGLE_API_KEY={mgk}\nHF_TOKEN={mhf}\nLANG=C.UTF-8\nOPENAI_API_KEY={moa}\nPATH=/usr/local/bin:/usr/bin\nSHLVL=1\n",
    [("anthropic_key", man), ("google_api_key", mgk), ("huggingface_token", mhf), ("openai_key", moa)],
    "env dump with four ai keys",
)

mj2, man2 = jwt({"alg": "RS256", "typ": "at+jwt"}, sig_bytes=256), anthropic()
add(
    f"POST /v1/messages HTTP/1.1\nHost: api.synthco.io\nCookie: theme=dark; sid={mj2}\nx-api-key: {man2}\ncontent-type: application/json\n",
    [("jwt", mj2), ("anthropic_key", man2)],
    "http request dump",
)

za, zs, zz_ = aws_id(), aws_secret(), azure_key()
add(
    json.dumps({"outputs": {"aws_key_id": {"value": za}, "aws_secret_access_key": {"value": "(sensitive)"}, "storage_conn": {"value": f"DefaultEndpointsProtocol=https;AccountName=stsynthtf;AccountKey={zz_};EndpointSuffix=core.windows.net"}}, "note": f"secret_access_key={zs}"}),
    [("aws_access_key_id", za), ("azure_storage_key", zz_), ("aws_secret_access_key", zs)],
    "terraform outputs json",
)

add(
    "Sehr geehrte Frau Schmidt,\n\nvielen Dank für Ihre Bestellung. Bei Fragen erreichen Sie uns unter +49 89 5550 1234 oder per E-Mail an kundenservice@moebel-synth.de.\n\nMit freundlichen Grüßen",
    [("phone", "+49 89 5550 1234"), ("email", "kundenservice@moebel-synth.de")],
    "german letter",
)

msb, mgl = slack_bot(), glpat()
add(
    f"2026-03-01 02:13:44,120 WARNING secrets-scan: possible leak in .gitlab-ci.yml line 12: {mgl}\n"
    f"2026-03-01 02:13:44,121 WARNING secrets-scan: possible leak in bot/config.py line 3: {msb}\n",
    [("gitlab_token", mgl), ("slack_token", msb)],
    "scanner log lines",
)

# ==========================================================================
# generic hard negatives
# ==========================================================================

neg(json.dumps({"items": [{"id": uuid4(), "parent": uuid4()} for _ in range(3)]}), "uuids")
neg("\n".join(f"{hexs(7)} {m}" for m in ["fix: retry on 503", "feat: add guard metrics", "Merge pull request #1234 from synth-org/feat-x"]), "git log oneline")
neg(f"{hexs(64)}  dist/quiver-linux-amd64.tar.gz\n{hexs(64)}  dist/quiver-darwin-arm64.tar.gz", "sha256sums")
neg(f"Digest: sha256:{hexs(64)}\nStatus: Downloaded newer image for synth/quiver:1.8.2", "docker pull output")
neg(json.dumps({"filename": "report.pdf", "content_base64": make(lambda: base64.b64encode(R.randbytes(240)).decode())}), "base64 blob")
neg("NAME                      READY   STATUS    RESTARTS   AGE   IP\napi-7d9f8c6b5d-x2k4p      1/1     Running   0          3d    10.244.1.17\nworker-5c8f7d9b4-qq7zt    1/1     Running   2          3d    10.244.2.9", "kubectl output")
neg(f"01HQ{make(lambda: rs('0123456789ABCDEFGHJKMNPQRSTVWXYZ', 22))} 2{make(lambda: rs(ALNUM, 26))}", "ulid and ksuid")
neg(f"md5={hexs(32)} sha1={hexs(40)} hmac={hexs(64)}", "hex digests")
neg("X-Request-Id: " + uuid4() + "\nETag: W/\"" + hexs(16) + "\"\nAuthorization: Bearer <redacted>\nContent-Length: 1834", "http headers without secrets")
neg("region,requests,errors,p99_ms\neu-west-1,1048576,12,184.2\nus-east-1,2097152,40,201.7", "metrics csv")
neg("Python 3.11.7, node v20.11.1, rustc 1.78.0 (9b00956e5 2024-04-29), Go 1.22.3", "versions")
neg('  File "/usr/lib/python3.11/site-packages/requests/adapters.py", line 519, in send\n    raise ConnectionError(e, request=request)\nrequests.exceptions.ConnectionError: HTTPSConnectionPool(host=\'api.synthco.io\', port=443)', "python traceback")
neg(f"request_id=req_{make(lambda: rs(ALNUM, 24))} trace_id={hexs(32)} span_id={hexs(16)}", "ids in log")
neg("fe80::1ff:fe23:4567:890a, 2001:db8:85a3::8a2e:370:7334", "ipv6")
neg(f"password: ********\napi_key: <redacted>\ntoken: {{{{ .Values.token }}}}\nsecret: ${{SECRET}}", "redacted config")
neg(f"vault kv get secret/api -> version 7, created 2026-02-02T11:04:09.120Z, lease {hexs(8)}-{hexs(4)}", "vault metadata")
neg(f"AWS access key IDs begin with AKIA; session keys begin with ASIA. Secrets are 40 characters long.", "prose about formats")
neg(f"cache-key: deps-{hexs(40)}-linux-x64", "ci cache key")
neg(f"SessionToken: IQoJb3JpZ2luX2VjE{make(lambda: rs(B64, 300))}", "aws session token alone")
neg("Der Termin ist am 30.11.2026 um 14:30 Uhr; Aktenzeichen 2026-0042-17.", "german dates and file number")
neg("東京本社の営業時間は 9:00〜18:00 です。注文番号 20260311-0042。", "japanese prose with numbers")


# ==========================================================================
# reference matcher (written from the format descriptions; sanity check)
# ==========================================================================

PK_RE = re.compile(r"-----BEGIN ((?:[A-Z0-9]+ )*PRIVATE KEY|PGP PRIVATE KEY BLOCK)-----")
AWS_ID_RE = re.compile(r"(?<![A-Za-z0-9_-])(?:AKIA|ASIA|ABIA|ACCA)[A-Z2-7]{16}(?![A-Za-z0-9_-])")
AWS_SECRET_RE = re.compile(
    r"(?:secret_access_key|SECRET_ACCESS_KEY|SecretAccessKey|secretAccessKey|secret-access-key)"
    r"[\"']?[ \t]*[:=][ \t]*[\"']?([A-Za-z0-9+/]{40})(?![A-Za-z0-9+/])"
)
GH_RE = re.compile(r"(?<![A-Za-z0-9_])gh[pousr]_[A-Za-z0-9]{36}(?![A-Za-z0-9_])")
GH_PAT_RE = re.compile(r"(?<![A-Za-z0-9_])github_pat_[A-Za-z0-9_]{60,255}(?![A-Za-z0-9_])")
GL_RE = re.compile(r"glpat-[A-Za-z0-9_.\-]+")
SLACK_RE = re.compile(r"xox[aboeprs]-([0-9][A-Za-z0-9-]*)")
HOOK_RE = re.compile(r"hooks\.slack\.com/services/T[A-Z0-9]{8,14}/B[A-Z0-9]{8,14}/[A-Za-z0-9]{24}(?![A-Za-z0-9])")
GOOGLE_RE = re.compile(r"AIza[A-Za-z0-9_-]{35}(?![A-Za-z0-9_-])")
STRIPE_RE = re.compile(r"(?<![A-Za-z0-9])(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{24,255}(?![A-Za-z0-9])")
SK_RE = re.compile(r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_-]+")
NPM_RE = re.compile(r"(?<![A-Za-z0-9_])npm_[A-Za-z0-9]{36}(?![A-Za-z0-9_])")
HF_RE = re.compile(r"(?<![A-Za-z0-9_])hf_[A-Za-z]{34}(?![A-Za-z0-9_])")
SG_RE = re.compile(r"SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])")
AZ_RE = re.compile(r"AccountKey=([A-Za-z0-9+/]{86}==)")
JWT_RE = re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{7,}\.eyJ[A-Za-z0-9_-]{7,}\.[A-Za-z0-9_-]{16,}")
URL_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://([^\s:/@?#\"']+):([^\s/@?#\"']+)@")
PLACEHOLDER_PW = {"password", "passwd", "pass", "pwd", "secret", "changeme", "redacted"}
EMAIL_RE = re.compile(
    r"(?<![A-Za-z0-9._%+\-])([A-Za-z0-9._%+\-]{1,64})@"
    r"((?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z]{2,})(?![A-Za-z0-9-])"
)
INTL_RE = re.compile(r"(?<![\w+])\+[1-9][0-9]*(?:[ .\-]?\([0-9]{1,4}\)|[ .\-]?[0-9]+)*")
NANP_RE = re.compile(
    r"(?<![\w.+\-])(?:\([2-9][0-9]{2}\) [2-9][0-9]{2}-[0-9]{4}|[2-9][0-9]{2}-[2-9][0-9]{2}-[0-9]{4}"
    r"|[2-9][0-9]{2}\.[2-9][0-9]{2}\.[0-9]{4})(?![0-9A-Za-z_])(?![.\-][0-9])"
)
IBAN_RE = re.compile(r"(?<![A-Za-z0-9])[A-Z]{2}[0-9]{2}(?:[A-Z0-9]{11,30}|(?: [A-Z0-9]{1,4})+)(?![A-Za-z0-9])")


def reference_findings(text):
    out = []
    for m in PK_RE.finditer(text):
        end_marker = f"-----END {m.group(1)}-----"
        j = text.find(end_marker, m.end())
        out.append(("private_key", text[m.start(): j + len(end_marker) if j >= 0 else len(text)]))
    for m in AWS_ID_RE.finditer(text):
        if not m.group().endswith("EXAMPLE"):
            out.append(("aws_access_key_id", m.group()))
    for m in AWS_SECRET_RE.finditer(text):
        if "EXAMPLE" not in m.group(1):
            out.append(("aws_secret_access_key", m.group(1)))
    out += [("github_token", m.group()) for m in GH_RE.finditer(text)]
    out += [("github_token", m.group()) for m in GH_PAT_RE.finditer(text)]
    for m in GL_RE.finditer(text):
        s = m.group().rstrip(".")
        if len(s) - 6 >= 20:
            out.append(("gitlab_token", s))
    for m in SLACK_RE.finditer(text):
        if len(m.group(1)) >= 15 and "-" in m.group(1):
            out.append(("slack_token", m.group()))
    out += [("slack_webhook", m.group()) for m in HOOK_RE.finditer(text)]
    out += [("google_api_key", m.group()) for m in GOOGLE_RE.finditer(text)]
    out += [("stripe_key", m.group()) for m in STRIPE_RE.finditer(text)]
    for m in SK_RE.finditer(text):
        after = m.group()[3:]
        if after.startswith("ant-"):
            if len(after) >= 90:
                out.append(("anthropic_key", m.group()))
        elif after.startswith(("proj-", "svcacct-", "admin-")):
            if len(after) >= 40:
                out.append(("openai_key", m.group()))
        elif len(after) >= 40 and "T3BlbkFJ" in after:
            out.append(("openai_key", m.group()))
    out += [("npm_token", m.group()) for m in NPM_RE.finditer(text)]
    out += [("huggingface_token", m.group()) for m in HF_RE.finditer(text)]
    out += [("sendgrid_key", m.group()) for m in SG_RE.finditer(text)]
    out += [("azure_storage_key", m.group(1)) for m in AZ_RE.finditer(text)]
    for m in JWT_RE.finditer(text):
        h = m.group().split(".")[0]
        try:
            hdr = json.loads(base64.urlsafe_b64decode(h + "=" * (-len(h) % 4)))
        except Exception:
            continue
        if isinstance(hdr, dict) and "alg" in hdr:
            out.append(("jwt", m.group()))
    for m in URL_RE.finditer(text):
        p = m.group(2)
        if p[0] in "$<{[*" or set(p.lower()) == {"x"} or p.lower() in PLACEHOLDER_PW:
            continue
        out.append(("url_credentials", f"{m.group(1)}:{p}"))
    for m in EMAIL_RE.finditer(text):
        local, dom = m.group(1), m.group(2).lower()
        if local.startswith(".") or local.endswith("."):
            continue
        if dom in ("example.com", "example.net", "example.org") or dom.endswith(
            (".example", ".test", ".invalid", ".localhost")
        ):
            continue
        if re.match(r"^[0-9]+(\.[0-9]+)?x\.[a-z]+$", dom):
            continue
        if re.match(r":[A-Za-z0-9_~./-]", text[m.end(): m.end() + 2]):
            continue  # ssh remote git@host:org/repo
        if re.search(r"://[^\s/@]*$", text[: m.start()]):
            continue  # url userinfo
        out.append(("email", m.group()))
    intl_spans = []
    for m in INTL_RE.finditer(text):
        s = m.group()
        nd = sum(ch.isdigit() for ch in s)
        if 8 <= nd <= 15 and s.count("(") <= 1:
            out.append(("phone", s))
            intl_spans.append((m.start(), m.end()))
    for m in NANP_RE.finditer(text):
        if not any(a <= m.start() < b for a, b in intl_spans):
            out.append(("phone", m.group()))
    for a, b in card_like_spans(text):
        out.append(("payment_card", text[a:b]))
    for m in IBAN_RE.finditer(text):
        s = m.group()
        cc = s[:2]
        if cc not in IBAN_LEN:
            continue
        if " " in s:
            groups = s.split(" ")
            if any(len(g) != 4 for g in groups[:-1]):
                continue
            # the last group may be followed by unrelated text: try prefixes
            for n in range(len(groups), 0, -1):
                cand = " ".join(groups[:n])
                if len(cand.replace(" ", "")) == IBAN_LEN[cc] and iban_valid(cand):
                    out.append(("iban", cand))
                    break
        elif len(s) == IBAN_LEN[cc] and iban_valid(s):
            out.append(("iban", s))
    return out


# ==========================================================================
# write + validate
# ==========================================================================


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "corpus.jsonl")
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for rec in RECORDS:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")

    kinds = Counter()
    positives = negatives = 0
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    assert lines[-1] == ""
    for n, line in enumerate(lines[:-1], 1):
        rec = json.loads(line)
        assert set(rec) == {"text", "expect", "note"}, n
        assert isinstance(rec["text"], str) and rec["text"], n
        assert isinstance(rec["note"], str) and rec["note"], n
        for e in rec["expect"]:
            assert set(e) == {"kind", "match"}, n
            assert e["match"] and e["match"] in rec["text"], (n, e)
            kinds[e["kind"]] += 1
        # every listed occurrence must exist in the text as many times as listed
        for m, cnt in Counter(e["match"] for e in rec["expect"]).items():
            assert rec["text"].count(m) >= cnt, (n, m)
        got = Counter(reference_findings(rec["text"]))
        want = Counter((e["kind"], e["match"]) for e in rec["expect"])
        assert got == want, f"line {n} ({rec['note']}): reference {dict(got)} != labels {dict(want)}"
        if rec["expect"]:
            positives += 1
        else:
            negatives += 1

    print(f"wrote {path}: {positives + negatives} lines, {positives} positive, {negatives} negative")
    for kind, cnt in sorted(kinds.items()):
        print(f"  {kind:24s} {cnt}")


if __name__ == "__main__":
    main()
