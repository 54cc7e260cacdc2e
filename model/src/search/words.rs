//! Words of tool names, descriptions and queries: camelCase and snake_case split, lowercased,
//! plurals and verb endings folded, a few synonyms and abbreviations mapped to one form.

use std::sync::OnceLock;

use rustc_hash::FxHashMap;

/// Longest word indexed or looked up, in bytes (longer ones are cut here).
pub const MAX_WORD: usize = 40;

/// Calls `f` with each word of `text`: runs of ASCII letters and digits, split where the case
/// turns (`listCoreV1NamespacedPod`: list, Core, V1, Namespaced, Pod; `HTTPRoute`: HTTP,
/// Route). Anything else (punctuation, `_`, `-`, non-ASCII) separates words.
pub fn split(text: &str, mut f: impl FnMut(&str)) {
    let b = text.as_bytes();
    let mut start = None;
    for i in 0..=b.len() {
        let c = b.get(i).copied().unwrap_or(b' ');
        if !c.is_ascii_alphanumeric() {
            if let Some(s) = start.take() {
                f(&text[s..i]);
            }
            continue;
        }
        let Some(s) = start else {
            start = Some(i);
            continue;
        };
        if c.is_ascii_uppercase() && i > s {
            let prev = b[i - 1];
            let next_lower = b.get(i + 1).is_some_and(u8::is_ascii_lowercase);
            if !prev.is_ascii_uppercase() || next_lower {
                f(&text[s..i]);
                start = Some(i);
            }
        }
    }
}

/// Lowercases `word` into `buf` (cut at [`MAX_WORD`] bytes) and folds its ending.
pub fn normalize(word: &str, buf: &mut String) {
    buf.clear();
    let cut = &word.as_bytes()[..word.len().min(MAX_WORD)];
    // ASCII only (see `split`), so every byte is a char.
    buf.extend(cut.iter().map(|b| char::from(b.to_ascii_lowercase())));
    stem(buf);
}

/// Folds plurals and verb endings, and a final `e`, so that `namespaces`, `namespaced` and
/// `namespace` meet, and `deleting`, `deleted` and `delete`. Not a full stemmer: queries and
/// tools go through the same folding, so both sides only need to agree.
fn stem(w: &mut String) {
    let n = w.len();
    if n <= 3 {
        return;
    }
    if w.ends_with("ies") && n > 4 {
        w.truncate(n - 3);
        w.push('y');
    } else if w.ends_with("sses") {
        w.truncate(n - 2);
    } else if w.ends_with("ss") || w.ends_with("us") || w.ends_with("is") {
    } else if w.ends_with("es") && ends_sibilant(&w[..n - 2]) {
        w.truncate(n - 2);
    } else if w.ends_with('s') {
        w.truncate(n - 1);
    }
    let n = w.len();
    if n > 5 && w.ends_with("ing") {
        w.truncate(n - 3);
        undouble(w);
    } else if n > 4 && w.ends_with("ed") {
        w.truncate(n - 2);
        undouble(w);
    }
    if w.len() > 3 && w.ends_with('e') {
        w.pop();
    }
}

fn ends_sibilant(w: &str) -> bool {
    w.ends_with(['s', 'x', 'z']) || w.ends_with("ch") || w.ends_with("sh")
}

/// `runn` → `run`, but `install` stays.
fn undouble(w: &mut String) {
    let b = w.as_bytes();
    let n = b.len();
    if n > 3 && b[n - 1] == b[n - 2] && !matches!(b[n - 1], b'l' | b's' | b'z') {
        w.pop();
    }
}

/// Words that carry no meaning for a search (folded forms).
const STOP: &[&str] = &[
    "a", "an", "the", "of", "in", "on", "to", "for", "from", "by", "with", "and", "or", "is", "are", "be",
    "me", "my", "i", "it", "its", "this", "that", "what", "which", "pleas", "can", "you", "do", "how",
    "there", "any", "some", "into", "at", "as", "we", "our", "us", "should", "would", "want", "need", "let",
    "tool",
];

/// Words that mean the same to a tool's user: each maps to the first of its group, in tools
/// and queries alike.
const SAME: &[&[&str]] = &[
    &[
        "read", "get", "fetch", "show", "describe", "view", "retrieve", "inspect", "display", "lookup", "see",
    ],
    &["list", "enumerate", "browse"],
    &[
        "delete",
        "remove",
        "destroy",
        "erase",
        "drop",
        "kill",
        "terminate",
        "purge",
        "wipe",
    ],
    &[
        "create", "add", "new", "make", "insert", "register", "submit", "spawn", "launch",
    ],
    &[
        "patch",
        "update",
        "modify",
        "change",
        "edit",
        "alter",
        "tweak",
        "adjust",
        "partially",
    ],
    &["replace", "overwrite", "put", "swap"],
    &[
        "watch",
        "monitor",
        "follow",
        "observe",
        "subscribe",
        "stream",
        "tail",
    ],
    &["exec", "execute", "shell"],
    &["scale", "resize"],
    &["evict", "eviction"],
    &["log", "logs"],
];

/// Words a query may use for something a tool spells out: looked up besides the word itself.
const ALSO: &[(&str, &[&str])] = &[
    ("svc", &["service"]),
    ("ns", &["namespace"]),
    ("deploy", &["deployment"]),
    ("pvc", &["persistentvolumeclaim"]),
    ("pv", &["persistentvolume"]),
    ("cm", &["configmap"]),
    ("sa", &["serviceaccount"]),
    ("sts", &["statefulset"]),
    ("ds", &["daemonset"]),
    ("rs", &["replicaset"]),
    ("rc", &["replicationcontroller"]),
    ("ep", &["endpoint"]),
    ("po", &["pod"]),
    ("password", &["secret"]),
    ("credential", &["secret"]),
    ("container", &["pod"]),
    ("machine", &["node"]),
    ("cluster", &["all"]),
    ("every", &["all"]),
    ("everywhere", &["all"]),
    ("run", &["exec"]),
    ("command", &["exec"]),
    ("output", &["log"]),
    ("forward", &["portforward"]),
    ("rollout", &["deployment"]),
];

/// The folded-word tables: stop words, synonym groups and query expansions.
struct Tables {
    stop: FxHashMap<&'static str, ()>,
    same: FxHashMap<String, String>,
    also: FxHashMap<String, Vec<String>>,
}

fn tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| {
        let fold = |w: &str| {
            let mut b = String::new();
            normalize(w, &mut b);
            b
        };
        let mut same = FxHashMap::default();
        for group in SAME {
            let head = fold(group[0]);
            for w in &group[1..] {
                same.insert(fold(w), head.clone());
            }
        }
        let also = ALSO
            .iter()
            .map(|(w, more)| {
                (
                    fold(w),
                    more.iter().map(|m| canonical_in(&same, &fold(m))).collect(),
                )
            })
            .collect();
        Tables {
            stop: STOP.iter().map(|w| (*w, ())).collect(),
            same,
            also,
        }
    })
}

fn canonical_in(same: &FxHashMap<String, String>, w: &str) -> String {
    same.get(w).map_or_else(|| w.to_owned(), Clone::clone)
}

/// Whether a folded word is a stop word.
pub fn is_stop(w: &str) -> bool {
    tables().stop.contains_key(w)
}

/// Replaces a folded word by its synonym group's head.
pub fn canonical(w: &mut String) {
    if let Some(head) = tables().same.get(w.as_str()) {
        w.clear();
        w.push_str(head);
    }
}

/// The words a query's folded, canonical word also looks up.
pub fn also(w: &str) -> &'static [String] {
    tables().also.get(w).map_or(&[], Vec::as_slice)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        let mut out = Vec::new();
        split(s, |w| out.push(w.to_owned()));
        out
    }

    fn folded(s: &str) -> String {
        let mut b = String::new();
        normalize(s, &mut b);
        canonical(&mut b);
        b
    }

    #[test]
    fn names_split_at_case_turns_and_separators() {
        assert_eq!(
            words("listCoreV1NamespacedPod"),
            ["list", "Core", "V1", "Namespaced", "Pod"]
        );
        assert_eq!(
            words("HTTPRoute get_user-by.id"),
            ["HTTP", "Route", "get", "user", "by", "id"]
        );
        assert_eq!(words("v1beta1 ÄpodÖ  "), ["v1beta1", "pod"]);
        assert!(words("").is_empty() && words("__--..").is_empty());
    }

    #[test]
    fn endings_fold_so_forms_of_one_word_meet() {
        for group in [
            &["namespace", "namespaces", "Namespaced"][..],
            &["delete", "deleted", "deleting"],
            &["status", "statuses"],
            &["policy", "policies"],
            &["patch", "patches", "patched"],
            &["binding", "bindings"],
            &["run", "running"],
            &["ingress", "ingresses"],
        ] {
            let forms: Vec<String> = group.iter().map(|w| folded(w)).collect();
            assert!(
                forms.iter().all(|f| *f == forms[0]),
                "{group:?} folded to {forms:?}"
            );
        }
        assert_ne!(folded("pod"), folded("node"));
    }

    #[test]
    fn synonyms_meet_and_abbreviations_expand() {
        assert_eq!(folded("fetch"), folded("read"));
        assert_eq!(folded("Remove"), folded("delete"));
        assert_eq!(folded("update"), folded("patch"));
        assert_ne!(folded("update"), folded("replace"));
        assert_eq!(also(&folded("pvc")), [folded("persistentvolumeclaim")]);
        assert!(is_stop(&folded("the")) && !is_stop(&folded("pods")));
    }

    #[test]
    fn long_and_odd_words_are_bounded() {
        let mut b = String::new();
        normalize(&"x".repeat(10_000), &mut b);
        assert_eq!(b.len(), MAX_WORD);
        for w in ["s", "es", "ies", "ed", "ing", "sses", "e"] {
            normalize(w, &mut b);
            assert!(!b.is_empty() || w.is_empty());
        }
    }
}
