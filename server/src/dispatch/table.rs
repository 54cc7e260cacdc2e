//! The method table: every JSON-RPC method this server answers, with the eras that have it,
//! how a 2026-07-28 result of it is stamped, and its handler. Both eras route through it.
//! It is also the one list of method names: the `method` label values of the request metrics
//! ([`LABELS`]) and the methods 2026-07-28 removed (the `Handshake` entries) come from it.
//!
//! A new method is one handler function in its family's module and one line here.

use super::completion;
use super::prompts;
use super::request::{Answer, Later};
use super::resources;
use super::revision::Stamp;
use super::sessions;
use super::tasks;
use super::tools;

/// Which protocol eras have a method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Eras {
    /// Both the handshake era and 2026-07-28.
    Both,
    /// The handshake era only (2026-07-28 removed it: `Method not found`, HTTP 404).
    Handshake,
    /// 2026-07-28 only.
    Stateless,
}

impl Eras {
    /// Whether the era (stateless or not) has the method.
    pub(super) fn has(self, stateless: bool) -> bool {
        match self {
            Eras::Both => true,
            Eras::Handshake => !stateless,
            Eras::Stateless => stateless,
        }
    }
}

/// How a method is answered.
#[derive(Debug, Clone, Copy)]
pub(super) enum Handler {
    /// At once, into the answer buffer.
    Now(Answer),
    /// `tools/call`: may wait for a slow tool, or hand the call back to the transport.
    ToolCall,
    /// May wait (for a task's end, a shared store): the handler's future is awaited where
    /// the request is, so the request's deadline and a client gone end it.
    Later(Later),
}

/// One method's entry.
#[derive(Debug)]
pub(super) struct Method {
    /// Its slot in [`LABELS`]: its place in the table.
    pub metric: usize,
    pub eras: Eras,
    pub stamp: Stamp,
    pub handler: Handler,
}

macro_rules! table {
    ($($name:literal => $eras:ident, $stamp:ident, $handler:expr;)*) => {
        /// Every method of the table, in its order.
        pub(super) const NAMES: &[&str] = &[$($name),*];

        /// The entry of `method`, if this server has it in any era.
        #[inline]
        pub(super) fn lookup(method: &str) -> Option<&'static Method> {
            match method {
                $($name => {
                    static M: Method = Method {
                        metric: slot($name),
                        eras: Eras::$eras,
                        stamp: Stamp::$stamp,
                        handler: $handler,
                    };
                    Some(&M)
                })*
                _ => None,
            }
        }
    };
}

/// The `method` labels of messages that are not a request of a method in the table:
/// notifications, answers to the server's requests, unreadable messages, refused batches,
/// and requests of methods this server does not have.
const NOT_METHODS: [&str; 5] = ["notification", "response", "invalid", "batch", "other"];

/// Every `method` label value of the request metrics: the table's methods, then
/// [`NOT_METHODS`]. A message is counted in the slot of its label's place here.
pub(super) const LABELS: [&str; NAMES.len() + NOT_METHODS.len()] = {
    let mut all = [""; NAMES.len() + NOT_METHODS.len()];
    let mut i = 0;
    while i < all.len() {
        all[i] = if i < NAMES.len() {
            NAMES[i]
        } else {
            NOT_METHODS[i - NAMES.len()]
        };
        i += 1;
    }
    all
};

/// The place of `label` in [`LABELS`]. For constants only (`const X: usize = slot(..)`):
/// evaluated while compiling, a name that is not a label fails the build.
pub(super) const fn slot(label: &str) -> usize {
    let mut i = 0;
    while i < LABELS.len() {
        if str_eq(LABELS[i], label) {
            return i;
        }
        i += 1;
    }
    panic!("not a method label")
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

use Handler::{Later as Wait, Now, ToolCall};

table! {
    "tools/call"               => Both,      Own,    ToolCall;
    "tools/list"               => Both,      Cached, Now(tools::list);
    "initialize"               => Handshake, Own,    Now(sessions::initialize);
    "ping"                     => Handshake, Own,    Now(sessions::ping);
    "resources/list"           => Both,      Cached, Now(resources::list);
    "resources/templates/list" => Both,      Cached, Now(resources::templates);
    "resources/read"           => Both,      Cached, Wait(resources::read);
    "resources/subscribe"      => Handshake, Own,    Now(resources::subscribe);
    "resources/unsubscribe"    => Handshake, Own,    Now(resources::unsubscribe);
    "prompts/list"             => Both,      Cached, Now(prompts::list);
    "prompts/get"              => Both,      Own,    Wait(prompts::get);
    "completion/complete"      => Both,      Plain,  Wait(completion::complete);
    "logging/setLevel"         => Handshake, Own,    Now(completion::set_level);
    "server/discover"          => Stateless, Own,    Now(sessions::discover);
    "subscriptions/listen"     => Stateless, Own,    Now(sessions::listen);
    "tasks/get"                => Both,      Plain,  Wait(tasks::get);
    "tasks/cancel"             => Both,      Plain,  Wait(tasks::cancel);
    "tasks/update"             => Both,      Plain,  Wait(tasks::update);
    "tasks/result"             => Handshake, Own,    Wait(tasks::result);
    "tasks/list"               => Handshake, Own,    Wait(tasks::list);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_of_the_table_has_its_own_metric_label() {
        for name in NAMES {
            let m = lookup(name).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(LABELS[m.metric], *name);
        }
    }

    #[test]
    fn no_two_series_share_a_label_and_a_label_of_no_method_finds_no_entry() {
        for (i, label) in LABELS.iter().enumerate() {
            assert!(!LABELS[..i].contains(label), "{label} twice");
        }
        for label in NOT_METHODS {
            assert!(lookup(label).is_none(), "{label}");
        }
        for other in [
            "",
            "tools",
            "tools/call ",
            "TOOLS/CALL",
            "notifications/cancelled",
        ] {
            assert!(lookup(other).is_none(), "{other}");
        }
        assert_eq!(LABELS[slot("other")], "other");
    }

    #[test]
    fn observability_md_lists_every_method_label() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/observability.md");
        let doc = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let start = doc
            .find("The `method` label is")
            .expect("the paragraph of method labels");
        let paragraph = doc[start..].split("\n\n").next().unwrap_or_default();
        let named: Vec<&str> = paragraph.split('`').skip(1).step_by(2).skip(1).collect();
        let mut labels = LABELS.to_vec();
        let mut listed = named.clone();
        labels.sort_unstable();
        listed.sort_unstable();
        assert_eq!(
            listed, labels,
            "docs/observability.md's method labels and the table differ"
        );
    }
}
