//! The state-key Secret of an McpServer (`NAME-state-key`): 32 random bytes, hex-encoded,
//! that every replica reads as `QUIVER_STATE_KEY` to sign and check 2026-07-28
//! `requestState`. Created once, never patched (the operator keeps no copy of the key and
//! never reads or logs its value: only the Secret's metadata). Deleting it rotates the key:
//! the watch of owned Secrets brings a reconcile that creates a new one, whose uid in the pod
//! template rolls the pods.

use k8s_openapi::api::core::v1::Secret;
use kube::Error as KubeError;
use kube::api::{Api, PostParams};

use super::{Conflict, Context, Error, controlled_by};
use crate::build::{self, STATE_KEY_BYTES};
use crate::crd::McpServer;

const KIND: &str = "Secret";

/// Where the state key comes from.
pub enum StateKey {
    /// The McpServer's own Secret, by name and uid.
    Mounted {
        /// Secret name.
        name: String,
        /// Its uid (a pod-template annotation: a new Secret rolls the pods).
        uid: String,
    },
    /// Another object holds the name: not mounted (each pod draws its own key).
    Taken(Conflict),
}

/// Reads (metadata only) or creates the state-key Secret of `mcp`.
///
/// # Errors
/// [`Error::Owner`] when reading it fails, [`Error::Apply`] when creating it fails.
pub async fn ensure(
    ctx: &Context,
    ns: &str,
    mcp: &McpServer,
    name: &str,
    uid: &str,
) -> Result<StateKey, Error> {
    let secret = build::state_key_secret_name(name);
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let owner_err = |source| Error::Owner {
        kind: KIND,
        name: secret.clone(),
        source,
    };
    // The watch's store first (as for the other children): a Secret it holds costs no GET.
    let stored = ctx
        .owned
        .scope(ns)
        .and_then(|s| s.secrets.get(ns, &secret))
        .map(|m| m.metadata.clone());
    let found = match stored {
        Some(m) => Some(m),
        None => api
            .get_metadata_opt(&secret)
            .await
            .map_err(owner_err)?
            .map(|m| m.metadata),
    };
    let meta = match found {
        Some(m) => m,
        None => {
            let mut random = [0u8; STATE_KEY_BYTES];
            getrandom::getrandom(&mut random).map_err(|e| Error::Apply {
                kind: KIND,
                name: secret.clone(),
                source: KubeError::Service(Box::new(std::io::Error::other(e.to_string()))),
            })?;
            let object = build::state_key_secret(mcp, &random).map_err(|_| Error::Unnamed)?;
            random.fill(0);
            match api.create(&PostParams::default(), &object).await {
                // Keep the metadata only: the created object carries the key.
                Ok(created) => created.metadata,
                // Created meanwhile (by an earlier reconcile whose answer was lost, or another).
                Err(KubeError::Api(e)) if e.code == 409 => {
                    match api.get_metadata_opt(&secret).await.map_err(owner_err)? {
                        Some(m) => m.metadata,
                        None => {
                            return Err(Error::Apply {
                                kind: KIND,
                                name: secret.clone(),
                                source: KubeError::Api(e),
                            });
                        }
                    }
                }
                Err(source) => {
                    return Err(Error::Apply {
                        kind: KIND,
                        name: secret.clone(),
                        source,
                    });
                }
            }
        }
    };
    if !controlled_by(&meta, uid) {
        return Ok(StateKey::Taken(Conflict {
            kind: KIND,
            name: secret,
        }));
    }
    Ok(StateKey::Mounted {
        name: secret,
        uid: meta.uid.unwrap_or_default(),
    })
}
