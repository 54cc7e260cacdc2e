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

use std::path::PathBuf;
use std::str::FromStr;

use crate::spec::context::SecretRef;

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

/// Where secret values come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// Secrets of this namespace, watched through the Kubernetes API.
    Kube(String),
    /// `PATH/NAME/KEY` files.
    Dir(PathBuf),
    /// `QUIVER_SECRET_<NAME>_<KEY>` environment variables.
    Env,
}

impl FromStr for SecretSource {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            Some(("kube", ns)) if !ns.is_empty() => Ok(Self::Kube(ns.to_owned())),
            Some(("dir", p)) if !p.is_empty() => Ok(Self::Dir(PathBuf::from(p))),
            None if s == "env" => Ok(Self::Env),
            _ => Err(format!("`{s}`: expected kube:NAMESPACE, dir:PATH or env")),
        }
    }
}

/// A `NAME.KEY` flag value naming one secret value (e.g. `--auth-tokens-secret`).
pub fn parse_ref(s: &str) -> Result<SecretRef, String> {
    match s.split_once('.') {
        Some((name, key)) if !name.is_empty() && !key.is_empty() => Ok(SecretRef {
            name: name.to_owned(),
            key: key.to_owned(),
        }),
        _ => Err(format!("`{s}`: expected SECRET.KEY")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(name: &str, key: &str) -> SecretRef {
        SecretRef {
            name: name.into(),
            key: key.into(),
        }
    }

    #[test]
    fn sources_parse() {
        assert_eq!("kube:ns".parse(), Ok(SecretSource::Kube("ns".into())));
        assert_eq!("dir:/s".parse(), Ok(SecretSource::Dir("/s".into())));
        assert_eq!("env".parse(), Ok(SecretSource::Env));
        for bad in ["kube:", "dir:", "file:/x", "", "envx"] {
            assert!(bad.parse::<SecretSource>().is_err(), "{bad}");
        }
        assert_eq!(parse_ref("api.token"), Ok(r("api", "token")));
        assert!(parse_ref("api").is_err());
        assert!(parse_ref(".k").is_err());
    }
}
