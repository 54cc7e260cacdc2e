//! The method table: every JSON-RPC method this server answers, with the eras that have it,
//! how a 2026-07-28 result of it is stamped, and its handler. Both eras route through it.
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
use crate::metrics::method_index;

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
    /// Its slot in [`crate::metrics::METHODS`] (`other` for methods without their own).
    pub metric: usize,
    pub eras: Eras,
    pub stamp: Stamp,
    pub handler: Handler,
}

macro_rules! table {
    ($($name:literal => $eras:ident, $stamp:ident, $handler:expr;)*) => {
        /// The entry of `method`, if this server has it in any era.
        #[inline]
        pub(super) fn lookup(method: &str) -> Option<&'static Method> {
            match method {
                $($name => {
                    static M: Method = Method {
                        metric: method_index($name),
                        eras: Eras::$eras,
                        stamp: Stamp::$stamp,
                        handler: $handler,
                    };
                    Some(&M)
                })*
                _ => None,
            }
        }

        /// Every method of the table, in its order.
        #[cfg(test)]
        pub(super) const NAMES: &[&str] = &[$($name),*];
    };
}

use Handler::{Later as Wait, Now, ToolCall};

table! {
    "tools/call"               => Both,      Own,    ToolCall;
    "tools/list"               => Both,      Cached, Now(tools::list);
    "initialize"               => Handshake, Own,    Now(sessions::initialize);
    "ping"                     => Handshake, Own,    Now(sessions::ping);
    "resources/list"           => Both,      Cached, Now(resources::list);
    "resources/templates/list" => Both,      Cached, Now(resources::templates);
    "resources/read"           => Both,      Cached, Now(resources::read);
    "resources/subscribe"      => Handshake, Own,    Now(resources::subscribe);
    "resources/unsubscribe"    => Handshake, Own,    Now(resources::unsubscribe);
    "prompts/list"             => Both,      Cached, Now(prompts::list);
    "prompts/get"              => Both,      Own,    Now(prompts::get);
    "completion/complete"      => Both,      Plain,  Now(completion::complete);
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
    fn every_name_finds_its_entry_and_nothing_else_matches() {
        for name in NAMES {
            let m = lookup(name).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(m.metric, method_index(name));
        }
        for other in [
            "",
            "tools",
            "tools/call ",
            "TOOLS/CALL",
            "notifications/cancelled",
            "batch",
        ] {
            assert!(lookup(other).is_none(), "{other}");
        }
    }

    #[test]
    fn the_methods_2026_07_28_removed_are_exactly_the_handshake_only_ones() {
        let mut handshake: Vec<&str> = NAMES
            .iter()
            .copied()
            .filter(|n| lookup(n).is_some_and(|m| m.eras == Eras::Handshake))
            .collect();
        let mut removed = crate::dispatch::stateless::REMOVED_METHODS.to_vec();
        handshake.sort_unstable();
        removed.sort_unstable();
        assert_eq!(handshake, removed);
    }

    #[test]
    fn eras() {
        assert!(Eras::Both.has(true) && Eras::Both.has(false));
        assert!(Eras::Handshake.has(false) && !Eras::Handshake.has(true));
        assert!(Eras::Stateless.has(true) && !Eras::Stateless.has(false));
    }
}
