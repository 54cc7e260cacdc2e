//! What a task is, whichever store keeps it: its status, the bounds of a store, whose
//! bounds a new task counts against, why a store refuses, and how a task reads on each wire
//! ([`TaskView`]). A task's id is 128 random bits ([`mint`]); a lookup by an id of another
//! caller answers exactly as a lookup by an id that was never issued.

use std::time::{Duration, SystemTime};

use serde_json::{Map, Value, json};

use crate::peer::Need;

/// The longest task id looked up; longer ones are unknown without hashing them.
pub(super) const MAX_TASK_ID: usize = 64;

/// Where a task stands.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::dispatch) enum Status {
    /// Running.
    Working,
    /// Waiting for the client's answers to these questions (`inputRequests`: key →
    /// `{method, params}`), which `tasks/update` brings.
    InputRequired(Map<String, Value>),
    /// Done: the tool's result (a tool error is a result with `isError`).
    Completed(Value),
    /// A protocol-level error: its code and message.
    Failed(i64, String),
    /// Cancelled by its caller.
    Cancelled,
}

impl Status {
    fn name(&self) -> &'static str {
        match self {
            Status::Working => "working",
            Status::InputRequired(_) => "input_required",
            Status::Completed(_) => "completed",
            Status::Failed(..) => "failed",
            Status::Cancelled => "cancelled",
        }
    }

    pub(super) fn terminal(&self) -> bool {
        !matches!(self, Status::Working | Status::InputRequired(_))
    }
}

/// The bounds of a store.
#[derive(Debug, Clone, Copy)]
pub struct TaskBounds {
    /// Tasks one caller may hold (running or finished, until their TTL ends).
    pub per_caller: usize,
    /// Tasks all callers together may hold.
    pub total: usize,
    /// Tasks all callers without credentials together may hold (part of `total`, so that
    /// they never take every place).
    pub anonymous: usize,
    /// How long a task is kept after it was created.
    pub ttl: Duration,
    /// How often a client is told to poll.
    pub poll_interval: Duration,
    /// The largest result one task keeps (its JSON size); a larger one fails the task. Also
    /// the most bytes of answers a task waiting for input keeps.
    pub max_result_bytes: usize,
    /// The results of all tasks together, with the answers of tasks waiting for input; a
    /// result that would go over fails its task, an answer is refused.
    pub total_result_bytes: usize,
}

impl Default for TaskBounds {
    fn default() -> Self {
        TaskBounds {
            per_caller: 64,
            total: 4096,
            anonymous: 1024,
            ttl: Duration::from_secs(600),
            poll_interval: Duration::from_millis(500),
            max_result_bytes: 1 << 20,
            total_result_bytes: 64 << 20,
        }
    }
}

/// Whose bounds a new task counts against: its caller's own (`per_caller`) and, for a
/// caller without credentials, the pool all such callers share (`anonymous`). Who may see
/// the task is its owner, a separate matter.
#[derive(Debug, Clone)]
pub(in crate::dispatch) struct Quota<'a> {
    /// The caller as bounds count it: an authenticated caller's subject; one without
    /// credentials by its address, or without one by its session.
    pub key: std::borrow::Cow<'a, str>,
    /// The caller has no credentials.
    pub anonymous: bool,
}

impl<'a> Quota<'a> {
    /// The bounds of the authenticated caller `subject`.
    pub(super) fn caller(subject: &'a str) -> Self {
        Quota {
            key: std::borrow::Cow::Borrowed(subject),
            anonymous: false,
        }
    }
}

/// Why a task was not created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// The caller holds its maximum of tasks.
    PerCaller(usize),
    /// The server holds its maximum of tasks.
    Total(usize),
    /// Callers without credentials together hold their maximum of tasks.
    Anonymous(usize),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::PerCaller(n) => write!(
                f,
                "too many tasks: a caller may hold {n}; wait for some to finish and expire, or cancel them"
            ),
            Refused::Total(n) => write!(f, "too many tasks on this server (at most {n}); try again later"),
            Refused::Anonymous(n) => write!(
                f,
                "too many tasks of callers without credentials on this server (at most {n} together); try again later"
            ),
        }
    }
}

/// Why `tasks/update` was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum UpdateError {
    /// An unknown, expired or foreign task id.
    Unknown,
    /// An answer to a pending question that is not a result of its request (or answers too
    /// large to keep); nothing was changed.
    Invalid(String),
    /// The server holds as many bytes of task results and answers as it may; nothing was
    /// changed.
    Full(String),
    /// The shared task store did not answer; nothing was changed.
    Store(String),
}

/// What a store knows of one task, as a client sees it.
#[derive(Debug, Clone)]
pub(in crate::dispatch) struct TaskView {
    pub id: String,
    pub status: Status,
    pub created: SystemTime,
    pub updated: SystemTime,
    pub ttl: Duration,
    pub poll_interval: Duration,
}

impl TaskView {
    /// The fields every task shape carries (`taskId`, `status`, times, `ttlMs`, `pollIntervalMs`).
    fn base(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("taskId".into(), json!(self.id));
        m.insert("status".into(), json!(self.status.name()));
        m.insert("createdAt".into(), json!(crate::net::time::rfc3339(self.created)));
        m.insert(
            "lastUpdatedAt".into(),
            json!(crate::net::time::rfc3339(self.updated)),
        );
        m.insert("ttlMs".into(), json!(millis(self.ttl)));
        m.insert("pollIntervalMs".into(), json!(millis(self.poll_interval)));
        m
    }

    /// The `CreateTaskResult` of a `tools/call` answered by this task.
    pub(in crate::dispatch) fn created(&self) -> Value {
        let mut m = self.base();
        m.insert("resultType".into(), json!("task"));
        Value::Object(m)
    }

    /// The `tasks/get` answer (`resultType` is the caller's to add): the task, with its
    /// result or error once it has one.
    pub(super) fn detailed(&self) -> Value {
        let mut m = self.base();
        match &self.status {
            Status::Completed(r) => {
                m.insert("result".into(), r.clone());
            }
            Status::Failed(code, message) => {
                m.insert("error".into(), json!({"code": code, "message": message}));
            }
            Status::InputRequired(asked) => {
                m.insert("inputRequests".into(), Value::Object(asked.clone()));
            }
            Status::Working | Status::Cancelled => {}
        }
        Value::Object(m)
    }

    /// Whether it reached a terminal status.
    pub(super) fn ended(&self) -> bool {
        self.status.terminal()
    }

    /// The `Task` of the 2025-11-25 core wire (`tasks/get`, `tasks/list`, `tasks/cancel`,
    /// and under `task` in a `CreateTaskResult`): `ttl` and `pollInterval` in ms, and a tool
    /// error (`isError`) is `failed` there, with a `statusMessage`.
    pub(super) fn core(&self) -> Value {
        let tool_error =
            matches!(&self.status, Status::Completed(r) if r.get("isError") == Some(&Value::Bool(true)));
        let mut m = Map::new();
        m.insert("taskId".into(), json!(self.id));
        m.insert(
            "status".into(),
            json!(if tool_error { "failed" } else { self.status.name() }),
        );
        let message = match &self.status {
            _ if tool_error => Some("the tool returned an error; tasks/result has it"),
            Status::Failed(_, message) => Some(message.as_str()),
            Status::Cancelled => Some("cancelled by its caller"),
            _ => None,
        };
        if let Some(message) = message {
            m.insert("statusMessage".into(), json!(message));
        }
        m.insert("createdAt".into(), json!(crate::net::time::rfc3339(self.created)));
        m.insert(
            "lastUpdatedAt".into(),
            json!(crate::net::time::rfc3339(self.updated)),
        );
        m.insert("ttl".into(), json!(millis(self.ttl)));
        m.insert("pollInterval".into(), json!(millis(self.poll_interval)));
        Value::Object(m)
    }
}

/// The pending keys `responses` answers, after checking each answer is a result of its
/// request (only pending keys are looked at: unknown keys cost nothing however many), and the
/// size of the answers the task would then hold (`held`: those it holds now).
pub(super) fn checked(
    pending: &Map<String, Value>,
    responses: &Map<String, Value>,
    held: usize,
) -> Result<(Vec<String>, usize), UpdateError> {
    let mut answered = Vec::new();
    let mut size = held;
    for (k, asked) in pending {
        let Some(answer) = responses.get(k) else {
            continue;
        };
        let need = asked
            .get("method")
            .and_then(Value::as_str)
            .and_then(Need::from_method);
        if let Some(why) = need.and_then(|n| n.malformed(answer)) {
            return Err(UpdateError::Invalid(format!(
                "Invalid params: inputResponses.{k} {why}"
            )));
        }
        size = size.saturating_add(crate::template::approx_size(answer));
        answered.push(k.clone());
    }
    Ok((answered, size))
}

/// Integer milliseconds of a duration, at least 1.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The end of a task within `bounds`, with the bytes its result holds: a result larger
/// than one task may keep, or than the results `held` already leave room for, fails it.
pub(super) fn within_bounds(status: Status, held: usize, b: &TaskBounds) -> (Status, usize) {
    let size = match &status {
        Status::Completed(r) => crate::template::approx_size(r),
        _ => return (status, 0),
    };
    let failed = |m: String| (Status::Failed(i64::from(crate::protocol::INTERNAL_ERROR), m), 0);
    if size > b.max_result_bytes {
        failed(format!(
            "the result is about {size} bytes; a task keeps at most {}",
            b.max_result_bytes
        ))
    } else if held.saturating_add(size) > b.total_result_bytes {
        failed(format!(
            "the server holds {held} bytes of task results already (at most {}); try again later",
            b.total_result_bytes
        ))
    } else {
        (status, size)
    }
}

/// A fresh task id: 128 random bits, hex.
pub(super) fn mint() -> String {
    let mut b = [0u8; 16];
    if getrandom::getrandom(&mut b).is_err() {
        // Unreachable on Linux; the process-random hasher still gives an unpredictable id.
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(SystemTime::UNIX_EPOCH.elapsed().unwrap_or_default().as_nanos());
        b[..8].copy_from_slice(&h.finish().to_le_bytes());
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}
