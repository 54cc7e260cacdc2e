//! Hot reload: config sources, and the [`Reloader`] that turns new config text into a new
//! registry generation. An invalid config is logged, counted and reported on `/status`;
//! the previous registry keeps serving.

#[cfg(feature = "kube")]
mod configmap;
pub(crate) mod fetch;
mod file;
mod reloader;

#[cfg(feature = "kube")]
pub use configmap::watch_configmap;
pub use file::{read_path, watch_path};
pub use reloader::{Reloaded, Reloader};

pub use quiver_flags::Source;
