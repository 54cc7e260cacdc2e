//! `env`: `QUIVER_SECRET_<NAME>_<KEY>` variables. The variable names need the keys, which
//! only the ToolSet knows, so the store reads them again whenever the references change.

use std::collections::BTreeMap;

use crate::spec::context::SecretRef;

/// One secret's keys and raw values (the store's `Keys`).
type Keys = Vec<(String, Vec<u8>)>;

/// The variable of `QUIVER_SECRET_<NAME>_<KEY>`'s scheme for one reference.
pub fn env_var(r: &SecretRef) -> String {
    let up = |s: &str| s.to_ascii_uppercase().replace(['-', ':'], "_");
    format!("QUIVER_SECRET_{}_{}", up(&r.name), up(&r.key))
}

/// The values of `refs` set in the environment, by secret name (the keys of one secret
/// together, names in order).
pub(super) fn read(refs: &[SecretRef]) -> Vec<(String, Keys)> {
    let mut by_name: BTreeMap<String, Keys> = BTreeMap::new();
    for r in refs {
        if let Some(v) = std::env::var_os(env_var(r)) {
            by_name
                .entry(r.name.clone())
                .or_default()
                .push((r.key.clone(), v.into_encoded_bytes()));
        }
    }
    by_name.into_iter().collect()
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
    fn env_names_follow_the_scheme() {
        assert_eq!(env_var(&r("my-api", "token")), "QUIVER_SECRET_MY_API_TOKEN");
    }
}
