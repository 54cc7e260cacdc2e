//! Hot reload: config sources, and the [`Reloader`] that turns new config text into a new
//! registry generation. An invalid config is logged, counted and reported on `/status`;
//! the previous registry keeps serving.

#[cfg(feature = "kube")]
mod configmap;
pub(crate) mod fetch;
mod file;
mod reloader;

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

#[cfg(feature = "kube")]
pub use configmap::watch_configmap;
pub use file::{read_path, watch_path};
pub use reloader::{Reloaded, Reloader};

/// Where the tool config comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A YAML file, or a directory of `*.yaml`/`*.yml` files (e.g. a mounted ConfigMap).
    File(PathBuf),
    /// A ConfigMap watched through the Kubernetes API; its `*.yaml`/`*.yml` keys are merged.
    ConfigMap {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
}

impl FromStr for Source {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(p) = s.strip_prefix("file:") {
            if p.is_empty() {
                return Err("file: needs a path".into());
            }
            return Ok(Self::File(PathBuf::from(p)));
        }
        if let Some(r) = s.strip_prefix("configmap:") {
            return match r.split_once('/') {
                Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                    Ok(Self::ConfigMap {
                        namespace: ns.to_owned(),
                        name: name.to_owned(),
                    })
                }
                _ => Err(format!("`{s}`: expected configmap:NAMESPACE/NAME")),
            };
        }
        Err(format!("`{s}`: expected file:PATH or configmap:NAMESPACE/NAME"))
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(p) => write!(f, "file:{}", p.display()),
            Self::ConfigMap { namespace, name } => write!(f, "configmap:{namespace}/{name}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sources() {
        assert_eq!(
            "file:/etc/q.yaml".parse::<Source>().unwrap(),
            Source::File("/etc/q.yaml".into())
        );
        assert_eq!(
            "configmap:ns/tools".parse::<Source>().unwrap(),
            Source::ConfigMap {
                namespace: "ns".into(),
                name: "tools".into()
            }
        );
        assert!("configmap:ns".parse::<Source>().is_err());
        assert!("http://x".parse::<Source>().is_err());
    }
}
