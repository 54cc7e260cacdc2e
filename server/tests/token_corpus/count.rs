// The reference counts of the token-count corpus: each text of texts.jsonl counted by
// tiktoken-rs (a port of OpenAI's tiktoken) in o200k_base and cl100k_base, written to
// corpus.jsonl. Not part of the build: see README.md in this folder for how it is run.
use std::io::{BufRead, Write};

fn main() {
    let o200k = tiktoken_rs::o200k_base().expect("o200k_base");
    let cl100k = tiktoken_rs::cl100k_base().expect("cl100k_base");
    let input = std::fs::File::open(std::env::args().nth(1).expect("texts.jsonl")).expect("open");
    let mut out = std::io::stdout().lock();
    for line in std::io::BufReader::new(input).lines() {
        let mut v: serde_json::Value = serde_json::from_str(&line.expect("line")).expect("json");
        let text = v["text"].as_str().expect("text").to_owned();
        v["o200k_base"] = o200k.encode_ordinary(&text).len().into();
        v["cl100k_base"] = cl100k.encode_ordinary(&text).len().into();
        writeln!(out, "{v}").expect("write");
    }
}
