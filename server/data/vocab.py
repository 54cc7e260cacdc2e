"""Writes a BPE vocabulary in the form server/src/tokens/bpe.rs reads: each token's bytes,
in rank order, each preceded by its length (one byte). The input is one of OpenAI's
tiktoken encoding files ("BASE64 RANK" per line, gzipped or not), e.g.
https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken; its SHA-256 is
checked against the one tiktoken itself expects.

    python3 server/data/vocab.py o200k_base.tiktoken server/data/o200k_base.tokens
"""
import base64
import gzip
import hashlib
import sys

EXPECTED = {
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}

src, dst = sys.argv[1], sys.argv[2]
raw = open(src, "rb").read()
if raw[:2] == b"\x1f\x8b":
    raw = gzip.decompress(raw)
digest = hashlib.sha256(raw).hexdigest()
name = next((n for n, h in EXPECTED.items() if h == digest), None)
if name is None:
    sys.exit(f"{src}: sha256 {digest} is none of {sorted(EXPECTED)}")
out = bytearray()
for expected_rank, line in enumerate(l for l in raw.decode().splitlines() if l):
    b64, rank = line.split()
    token = base64.b64decode(b64)
    if int(rank) != expected_rank or not 1 <= len(token) <= 255:
        sys.exit(f"{src}: rank {rank} out of order or token of {len(token)} bytes")
    out.append(len(token))
    out += token
open(dst, "wb").write(out)
print(f"{name}: {expected_rank + 1} tokens, {len(out)} bytes -> {dst}")
