//! Reconcile errors: one variant per step of a reconcile, each naming the kind (and object)
//! whose API call failed, so a log line, the metric labels and the span say where.

use std::fmt;

/// A step of a reconcile, as the `stage` field of logs and the `stage` label of
/// `quiver_operator_reconcile_stage_errors_total` name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Reading what the McpServer references (`toolsFrom` ConfigMaps, its ServiceAccount).
    Fetch,
    /// Rendering the ToolSet and building the children (pure; fails only on an object
    /// without namespace, name or uid).
    Render,
    /// Reading who holds a child's name, before it is applied.
    Owner,
    /// Applying a child (or refusing to, when another owner holds its name).
    Apply,
    /// Removing a child that is no longer wanted.
    Delete,
    /// Writing the McpServer's status.
    Status,
    /// Asking the ready pods which config they serve.
    Probe,
}

impl Stage {
    /// Every stage, in reconcile order.
    pub const ALL: [Self; 7] = [
        Self::Fetch,
        Self::Render,
        Self::Owner,
        Self::Apply,
        Self::Delete,
        Self::Status,
        Self::Probe,
    ];

    /// Bounded label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fetch => "fetch",
            Self::Render => "render",
            Self::Owner => "owner",
            Self::Apply => "apply",
            Self::Delete => "delete",
            Self::Status => "status",
            Self::Probe => "probe",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Reconcile errors. Invalid specs are not errors: they become a condition and an event.
/// Every variant but [`Error::Unnamed`] is transient: retried with per-object backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading an object the McpServer references failed.
    #[error("get {kind} {name}: {source}")]
    Fetch {
        /// Kind of the referenced object (`ConfigMap`, `ServiceAccount`).
        kind: &'static str,
        /// Its name.
        name: String,
        /// What the API answered.
        source: kube::Error,
    },
    /// Reading who holds a child's name failed.
    #[error("get {kind} {name}: {source}")]
    Owner {
        /// Kind of the child.
        kind: &'static str,
        /// Name of the child.
        name: String,
        /// What the API answered.
        source: kube::Error,
    },
    /// Applying a child failed.
    #[error("apply {kind} {name}: {source}")]
    Apply {
        /// Kind of the child.
        kind: &'static str,
        /// Name of the child.
        name: String,
        /// What the API answered.
        source: kube::Error,
    },
    /// Removing a child that is no longer wanted failed (`verb`: the `get` before it, or the
    /// `delete`).
    #[error("{verb} {kind} {name}: {source}")]
    Delete {
        /// `get` or `delete`.
        verb: &'static str,
        /// Kind of the child.
        kind: &'static str,
        /// Name of the child.
        name: String,
        /// What the API answered.
        source: kube::Error,
    },
    /// Writing the McpServer's status failed.
    #[error("patch McpServer status: {0}")]
    Status(#[source] kube::Error),
    /// Listing the McpServer's pods, to ask them which config they serve, failed.
    #[error("list Pods to probe: {0}")]
    Probe(#[source] kube::Error),
    /// An object of a child's kind and name exists and this McpServer is not its controller:
    /// it is left untouched, the McpServer reports it (condition and event) and is looked at
    /// again with backoff.
    #[error("{kind} {namespace}/{name} exists and is not owned by this McpServer; refusing to modify it")]
    NotOwned {
        /// Kind of the object.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// The object has no namespace, name or uid.
    #[error("McpServer without namespace, name or uid")]
    Unnamed,
}

impl From<crate::build::Unowned> for Error {
    fn from(_: crate::build::Unowned) -> Self {
        Self::Unnamed
    }
}

impl Error {
    /// Bounded label value: what the API answered.
    pub fn category(&self) -> &'static str {
        match self.source() {
            Some(kube::Error::Api(s)) if s.code == 409 => "conflict",
            Some(kube::Error::Api(s)) if s.code == 403 => "forbidden",
            Some(kube::Error::Api(s)) if s.code == 422 => "rejected",
            Some(kube::Error::Api(_)) => "api",
            Some(_) => "transport",
            None if matches!(self, Self::NotOwned { .. }) => "not_owned",
            None => "unnamed",
        }
    }

    /// The step of the reconcile that failed.
    pub fn stage(&self) -> Stage {
        match self {
            Self::Fetch { .. } => Stage::Fetch,
            Self::Owner { .. } => Stage::Owner,
            Self::Apply { .. } | Self::NotOwned { .. } => Stage::Apply,
            Self::Delete { .. } => Stage::Delete,
            Self::Status(_) => Stage::Status,
            Self::Probe(_) => Stage::Probe,
            Self::Unnamed => Stage::Render,
        }
    }

    /// Bounded label value: the kind of the object whose call failed.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Fetch { kind, .. }
            | Self::Owner { kind, .. }
            | Self::Apply { kind, .. }
            | Self::Delete { kind, .. }
            | Self::NotOwned { kind, .. } => kind,
            Self::Status(_) | Self::Unnamed => "McpServer",
            Self::Probe(_) => "Pod",
        }
    }

    /// What the API answered, when an API call failed.
    fn source(&self) -> Option<&kube::Error> {
        match self {
            Self::Fetch { source, .. }
            | Self::Owner { source, .. }
            | Self::Apply { source, .. }
            | Self::Delete { source, .. }
            | Self::Status(source)
            | Self::Probe(source) => Some(source),
            Self::NotOwned { .. } | Self::Unnamed => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("no", "Reason")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn every_error_names_its_stage_and_kind_with_bounded_labels() {
        let cases = [
            (
                Error::Fetch {
                    kind: "ConfigMap",
                    name: "a".into(),
                    source: api(403),
                },
                "fetch",
                "ConfigMap",
                "forbidden",
            ),
            (
                Error::Owner {
                    kind: "Role",
                    name: "r".into(),
                    source: api(500),
                },
                "owner",
                "Role",
                "api",
            ),
            (
                Error::Apply {
                    kind: "Deployment",
                    name: "d".into(),
                    source: api(422),
                },
                "apply",
                "Deployment",
                "rejected",
            ),
            (
                Error::Delete {
                    verb: "delete",
                    kind: "Ingress",
                    name: "i".into(),
                    source: api(409),
                },
                "delete",
                "Ingress",
                "conflict",
            ),
            (Error::Status(api(404)), "status", "McpServer", "api"),
            (Error::Probe(api(403)), "probe", "Pod", "forbidden"),
            (
                Error::NotOwned {
                    kind: "Service",
                    namespace: "n".into(),
                    name: "s".into(),
                },
                "apply",
                "Service",
                "not_owned",
            ),
            (Error::Unnamed, "render", "McpServer", "unnamed"),
        ];
        for (err, stage, kind, category) in cases {
            assert_eq!(
                (err.stage().as_str(), err.kind(), err.category()),
                (stage, kind, category),
                "{err}"
            );
            assert!(Stage::ALL.contains(&err.stage()));
        }
        let e = Error::Delete {
            verb: "get",
            kind: "HTTPRoute",
            name: "x".into(),
            source: api(500),
        };
        assert!(e.to_string().starts_with("get HTTPRoute x: "), "{e}");
    }
}
