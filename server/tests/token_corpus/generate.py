"""Builds the texts of the token-count corpus (texts.jsonl): slices of this repository's
docs, dashboards and code, multilingual text, whitespace and number edge cases, and seeded
random strings. Their reference counts (corpus.jsonl) come from tiktoken-rs, a port of
OpenAI's tiktoken, run by count.rs in this folder (see README.md there)."""
import json
import pathlib
import random

ROOT = pathlib.Path(__file__).resolve().parents[3]
texts = []


def add(name, text):
    texts.append({"name": name, "text": text})


def slices(path, size, count, step):
    data = (ROOT / path).read_text()
    for i in range(count):
        start = i * step
        chunk = data[start:start + size]
        if chunk:
            add(f"{path}@{start}", chunk)


slices("docs/guards.md", 3000, 4, 3500)
slices("docs/governance.md", 3000, 3, 9000)
slices("docs/performance.md", 2500, 2, 6000)
slices("README.md", 2500, 1, 0)
slices("deploy/grafana/quiver-dispatch.json", 3000, 3, 20000)
dash = json.loads((ROOT / "deploy/grafana/quiver-operator.json").read_text())
add("dashboard compact", json.dumps(dash, separators=(",", ":"))[:4000])
add("dashboard ascii-escaped", json.dumps(dash["panels"][:3])[:3000])
slices("server/src/exec/output.rs", 2500, 2, 2500)
slices("model/src/guard/secrets.rs", 2500, 1, 0)
slices("deploy/samples/governed-gateway.yaml", 2500, 1, 0)
slices("tests/observability/drive_traffic.py", 2500, 1, 0)

for name, text in [
    ("german", "Größenänderung der Straße: Über 10.000 Bäume wurden gefällt, sagte die Behörde."),
    ("french", "L'été dernier, nous n'avons pas pu aller à la plage ; c'était « impossible »."),
    ("japanese", "東京都は日本の首都です。人口は約1400万人で、世界有数の大都市です。"),
    ("chinese", "模型上下文协议（MCP）是一个开放标准，用于连接人工智能助手与数据源。"),
    ("russian", "Съешь же ещё этих мягких французских булок, да выпей чаю."),
    ("arabic", "مرحبا بالعالم! هذا نص تجريبي باللغة العربية ١٢٣٤٥."),
    ("greek", "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. ΑΒΓΔ αβγδ"),
    ("korean", "다람쥐 헌 쳇바퀴에 타고파. 한국어 텍스트 123"),
    ("emoji", "Deploy 🚀 done ✅ — 3 warnings ⚠️, 0 errors 🎉👍🏽 family: 👨‍👩‍👧‍👦"),
    ("combining", "e\u0301cole cafe\u0301 n\u0303 A\u030a Ω\u0308 x\u20d7"),
    ("curly quotes", "He said, “it’s done” — and left… ‘don’t’ isn’t ASCII."),
    ("nbsp and unicode spaces", "a\u00a0b\u2003c\u2009d\u3000e\u0085f\u2028g"),
    ("mixed scripts", "user_名前=\"Ærøskøbing\" id=42 città=Milano straße"),
]:
    add(name, text)

for name, text in [
    ("crlf", "line one\r\nline two\r\n\r\n  indented\r\n"),
    ("tabs", "\tkey:\tvalue\n\t\tnested\t \n"),
    ("space runs", "a  b   c    d     e\n      \n   x"),
    ("trailing spaces", "end with spaces   "),
    ("only whitespace", " \t\n \n\n   \t"),
    ("numbers", "3.14159 2026-11-30 1234567890 0x1F 1e-9 -42 +7 1,000,000 12:34:56"),
    ("contractions", "I'm you're they've we'll she'd it's DON'T WE'LL He'S 'tis o'clock"),
    ("url", "https://example.com/api/v1/items?page=2&per_page=100#frag /var/log/app.log"),
    ("base64", "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"),
    ("hex", "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"),
    ("camel and caps", "HTTPServerError getHTTPResponseCode XMLHttpRequest IOError ABCdefGHI"),
    ("punctuation runs", "!!! ??? ... --- *** /// ((( ))) {{}} [[]] <<>> ;; :: ,, \"\" ''"),
    ("slash newline", "a}\n/b\n//c\r\n/d"),
    ("control chars", "a\x00b\x01c\x1bd\x7fe\x0bf\x0cg\x1ch"),
    ("json escapes", '{"text":"line\\nnext\\t\\"quoted\\" \\u00e9","n":[1,2,3],"ok":true}'),
    ("markdown table", "| a | b |\n|---|---|\n| `x` | **y** |\n"),
    ("long word", "Pneumonoultramicroscopicsilicovolcanoconiosis supercalifragilisticexpialidocious"),
    ("long digits", "12345678901234567890123456789"),
]:
    add(name, text)

rng = random.Random(20261130)
alphabet = ["a", "Z", "'", "s", "T", "re", "LL", " ", "  ", "\t", "\n", "\r\n", "1", "234",
            "{", "}", '"', ":", ",", "/", "-", "_", "é", "日", "\u00a0", "\u0085", "hello",
            "World", "don't", "🚀", "\u0301", "ß", "Ω"]
for i in range(12):
    add(f"random {i}", "".join(rng.choice(alphabet) for _ in range(rng.randint(20, 300))))

out = pathlib.Path(__file__).with_name("texts.jsonl")
with out.open("w") as f:
    for t in texts:
        f.write(json.dumps(t, ensure_ascii=False) + "\n")
print(len(texts), "texts,", sum(len(t["text"].encode()) for t in texts), "bytes")
