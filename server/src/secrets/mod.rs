//! Secret values tools read through `{{secret.NAME.KEY}}`, and the bearer tokens clients
//! present: one store, filled by one source and swapped whole on every change, so a rotated
//! value is what the next call uses.
//!
//! Sources (`--secrets`):
//! - `kube:NAMESPACE`: a watch on each Secret the serving ToolSet references (and the one
//!   holding client tokens), by name. The set follows reloads; the pod's Role grants exactly
//!   those names.
//! - `dir:PATH`: `PATH/NAME/KEY` files (the layout of Secret volumes mounted under `PATH`),
//!   watched with inotify.
//! - `env`: `QUIVER_SECRET_<NAME>_<KEY>` variables (upper-cased, `-` as `_`), read at start.
//!
//! Values never reach logs, errors, `/status` or metrics: only names and keys do, and what a
//! tool returns has the values it used replaced by [`REDACTED`].

mod dir;
mod env;
#[cfg(feature = "kube")]
mod kubernetes;
mod store;

pub use crate::spec::context::{CONFIG_MAP_PREFIX, valid_config_map_name};
pub use dir::watch_dir;
pub use env::env_var;
#[cfg(feature = "kube")]
pub use kubernetes::watch_kube;
pub use store::{
    Keys, MAX_DIR_SECRETS, MAX_KEYS, MAX_VALUE_BYTES, MIN_REDACTED_LEN, Presence, REDACTED, Secrets,
    WithSecrets, value_in,
};

pub use quiver_flags::{SecretSource, parse_ref};
