//! Tools an upstream runs only as tasks of its own: the call is made as a task (2025-11-25:
//! `params.task`; 2026-07-28: the `io.modelcontextprotocol/tasks` extension declared), the
//! task followed to its end (`tasks/get`, paced as the upstream asks within bounds), its
//! questions relayed to the client of the call (2025-11-25: on the `tasks/result` stream;
//! 2026-07-28: `inputRequests`, answered with `tasks/update`), its result or error taken as
//! the call's, and the task cancelled at the upstream when the call ends first (the
//! client cancelled its own task, went away, or the wait ran out).
//!
//! The call runs inside whatever this server made of it (a plain call, or a task of this
//! server's own), so the client's task maps onto the upstream's: working while it works,
//! `input_required` while its question waits, its result, its cancellation.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use serde_json::{Value, json};

use super::relay::InputRound;
use super::{CallError, Conn, Link, LogSink};

/// How long an upstream's task is asked to be kept, and waited for at most.
pub const TASK_TTL: Duration = Duration::from_secs(3600);
/// Tasks of one upstream followed at once, at most; more calls fail at once with `busy`.
pub const MAX_FOLLOWED: usize = 256;
/// The tasks extension of 2026-07-28.
pub const EXTENSION: &str = "io.modelcontextprotocol/tasks";
/// Bounds on the pause between two `tasks/get` (the upstream's poll interval within them).
const POLL_MIN: Duration = Duration::from_millis(50);
const POLL_MAX: Duration = Duration::from_secs(60);
const POLL_DEFAULT: Duration = Duration::from_millis(500);
/// Longest task id taken.
const MAX_TASK_ID: usize = 256;
/// Failed `tasks/get` in a row (the upstream slow, busy, away a moment) before the task is
/// given up; and `tasks/result` that ran out of time in a row while the task waits for
/// input (a question that may never come again) before it is.
const MAX_MISSES: u32 = 5;
const MAX_INPUT_WAITS: u32 = 3;

/// The `params` of a `tools/call` to an upstream.
#[derive(serde::Serialize)]
pub(super) struct CallParams<'a> {
    pub name: &'a str,
    pub arguments: &'a Value,
    #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
    pub meta: Option<CallMeta>,
    /// 2025-11-25: run as a task, kept this long.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskParam>,
}

/// `_meta` of a `tools/call` to an upstream.
#[derive(serde::Serialize, Default, Clone)]
pub(super) struct CallMeta {
    #[serde(rename = "progressToken", skip_serializing_if = "Option::is_none")]
    pub progress_token: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

/// `params.task` of 2025-11-25.
#[derive(serde::Serialize, Clone, Copy)]
pub(super) struct TaskParam {
    /// Milliseconds.
    ttl: u64,
}

/// Whether a failed request about a task may pass (the upstream slow, busy, away a moment,
/// or rate-limiting): the least pause before asking again; `None`: it will not pass.
fn passing(e: &CallError) -> Option<Duration> {
    match e {
        CallError::Timeout(_) | CallError::Busy | CallError::Down(_) => Some(Duration::ZERO),
        CallError::Rpc(code, _) if *code == i64::from(crate::protocol::RATE_LIMITED) => {
            Some(Duration::from_secs(1))
        }
        _ => None,
    }
}

/// A task the upstream made of a call.
#[derive(Debug, PartialEq)]
struct Created {
    id: String,
    poll: Duration,
}

/// What answered a call made as a task: the task, or (an upstream that ran it at once) the
/// result itself.
fn created(v: Value, modern: bool) -> Result<Result<Created, Value>, CallError> {
    let task = if modern {
        if v.get("resultType").and_then(Value::as_str) != Some("task") {
            return Ok(Err(v));
        }
        &v
    } else {
        match v.get("task") {
            Some(t) => t,
            None => return Ok(Err(v)),
        }
    };
    let id = match task.get("taskId").and_then(Value::as_str) {
        Some(id) if !id.is_empty() && id.len() <= MAX_TASK_ID => id.to_owned(),
        _ => {
            return Err(CallError::Protocol(
                "a task without a taskId of at most 256 bytes".into(),
            ));
        }
    };
    Ok(Ok(Created {
        id,
        poll: poll_interval(task, modern).unwrap_or(POLL_DEFAULT),
    }))
}

/// The pause before the next `tasks/get` task `t` asks for (2025-11-25 `pollInterval`,
/// 2026-07-28 `pollIntervalMs`), within bounds; `None` when it names none.
fn poll_interval(t: &Value, modern: bool) -> Option<Duration> {
    let field = if modern { "pollIntervalMs" } else { "pollInterval" };
    t.get(field)
        .and_then(Value::as_u64)
        .map(|ms| Duration::from_millis(ms).clamp(POLL_MIN, POLL_MAX))
}

/// How following a task went: it ended at the upstream (its result, or the error it ended
/// with), or following it broke off (the task may still run there).
type Followed = Result<Result<Value, CallError>, CallError>;

/// Cancels the upstream's task when the call ends before it does, and counts how the task
/// ended (`cancelled` until told otherwise: the call was dropped).
struct Cancel<'a> {
    conn: Conn,
    metrics: &'a crate::metrics::UpstreamMetrics,
    id: String,
    modern: bool,
    auth: Option<HeaderValue>,
    armed: bool,
    outcome: &'static str,
}

impl Cancel<'_> {
    /// How following the task went: it is cancelled unless it ended at the upstream.
    fn ended(&mut self, f: &Followed) {
        self.armed = f.is_err();
        self.outcome = match f {
            Ok(Ok(v)) if v.get("isError") == Some(&Value::Bool(true)) => "failed",
            Ok(Ok(_)) => "completed",
            Ok(Err(_)) => "failed",
            Err(CallError::Asked) => "cancelled",
            Err(_) => "lost",
        };
    }
}

impl Drop for Cancel<'_> {
    fn drop(&mut self) {
        self.metrics.task_ended(self.outcome);
        if self.armed {
            cancel_later(
                self.conn.clone(),
                std::mem::take(&mut self.id),
                self.modern,
                self.auth.take(),
            );
        }
    }
}

/// Cancels task `id` at the upstream, in the background. Best effort: the upstream forgets
/// the task at its ttl anyway.
fn cancel_later(conn: Conn, id: String, modern: bool, auth: Option<HeaderValue>) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        let log = LogSink {
            tasks: modern,
            ..LogSink::NONE
        };
        let _ = conn
            .request("tasks/cancel", &json!({"taskId": id}), log, auth.as_ref())
            .await;
    });
}

/// The answer to a call being made a task in the background. Dropped before it arrived
/// (the call ended), the task it made, if any, is cancelled.
struct Creating {
    rx: tokio::sync::oneshot::Receiver<Result<Value, CallError>>,
    conn: Conn,
    modern: bool,
    auth: Option<HeaderValue>,
}

impl Drop for Creating {
    fn drop(&mut self) {
        self.rx.close();
        if let Ok(Ok(v)) = self.rx.try_recv()
            && let Ok(Ok(t)) = created(v, self.modern)
        {
            cancel_later(self.conn.clone(), t.id, self.modern, self.auth.take());
        }
    }
}

impl Link {
    /// `tools/call` of the upstream's tool: as a task of its own where the tool runs only
    /// as one (`as_task`: it lists `execution.taskSupport: required`; or a 2026-07-28
    /// upstream refuses the plain call naming the tasks extension), followed to its result.
    pub(super) async fn tools_call(
        &self,
        params: &CallParams<'_>,
        as_task: bool,
        log: LogSink<'_>,
        auth: Option<&HeaderValue>,
    ) -> Result<Value, CallError> {
        if !as_task {
            match self.request_as("tools/call", params, log, auth).await {
                Err(CallError::NeedsTask(_)) => {}
                r => return r,
            }
        }
        let Ok(_place) = self.shared.followed.try_acquire() else {
            return Err(CallError::Busy);
        };
        // A stdio upstream's task lives in the process that made it: every request about
        // it goes there.
        let conn = match &self.conn {
            Conn::Stdio(pool) => Conn::Pinned(Arc::clone(pool), pool.pin().await?),
            c => c.clone(),
        };
        let modern = conn.speaks_2026(auth).await?;
        let task = match self.create(&conn, params, modern, log.caps, auth).await? {
            Ok(t) => t,
            Err(answered) => return Ok(answered),
        };
        let mut cancel = Cancel {
            conn: conn.clone(),
            metrics: &self.shared.metrics,
            id: task.id.clone(),
            modern,
            auth: auth.cloned(),
            armed: true,
            outcome: "cancelled",
        };
        let follow = async {
            if modern {
                self.follow_2026(&conn, &task, LogSink { tasks: true, ..log }, auth)
                    .await
            } else {
                self.follow(&conn, &task, log, auth).await
            }
        };
        let f = tokio::time::timeout(TASK_TTL, follow)
            .await
            .unwrap_or(Err(CallError::Timeout(TASK_TTL)));
        cancel.ended(&f);
        f.and_then(|r| r)
    }

    /// Makes the call a task at the upstream: in the background, so that a call that ends
    /// while the task is being made (its client cancelled it) still has the task cancelled
    /// once its id is known. The client capabilities `caps` are declared (2026-07-28), for
    /// the task's questions.
    async fn create(
        &self,
        conn: &Conn,
        params: &CallParams<'_>,
        modern: bool,
        caps: Option<crate::session::ClientCaps>,
        auth: Option<&HeaderValue>,
    ) -> Result<Result<Created, Value>, CallError> {
        let task = (!modern).then(|| TaskParam {
            ttl: u64::try_from(TASK_TTL.as_millis()).unwrap_or(u64::MAX),
        });
        let body = serde_json::to_value(CallParams {
            name: params.name,
            arguments: params.arguments,
            meta: params.meta.clone(),
            task,
        })
        .unwrap_or_default();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut creating = Creating {
            rx,
            conn: conn.clone(),
            modern,
            auth: auth.cloned(),
        };
        let (conn, auth) = (conn.clone(), auth.cloned());
        tokio::spawn(async move {
            let log = LogSink {
                caps: Some(caps.unwrap_or(super::relay::EVERY_RELAYED)),
                tasks: modern,
                ..LogSink::NONE
            };
            let r = conn.request("tools/call", &body, log, auth.as_ref()).await;
            if let Err(Ok(v)) = tx.send(r)
                && let Ok(Ok(t)) = created(v, modern)
            {
                cancel_later(conn, t.id, modern, auth);
            }
        });
        let answer = (&mut creating.rx)
            .await
            .unwrap_or_else(|_| Err(CallError::Down("the call ended".into())))?;
        created(answer, modern)
    }

    /// `tasks/get` of task `id`, asked again (after `pause`) while the upstream is slow,
    /// busy or away a moment, [`MAX_MISSES`] times at most.
    async fn get_task(
        conn: &Conn,
        id: &Value,
        log: LogSink<'_>,
        auth: Option<&HeaderValue>,
        pause: Duration,
    ) -> Result<Value, CallError> {
        let mut misses = 0;
        loop {
            let r = conn.request("tasks/get", id, log, auth).await;
            match r.as_ref().err().and_then(passing) {
                Some(floor) if misses + 1 < MAX_MISSES => {
                    misses += 1;
                    tokio::time::sleep(pause.saturating_mul(misses).max(floor)).await;
                }
                _ => return r,
            }
        }
    }

    /// Follows a 2025-11-25 task: `tasks/get` until it needs input or ends, then
    /// `tasks/result`, on whose stream its questions come (relayed by `log`), and which
    /// answers its result or error (or, taking longer than a request may, has the polling
    /// go on).
    async fn follow(
        &self,
        conn: &Conn,
        task: &Created,
        log: LogSink<'_>,
        auth: Option<&HeaderValue>,
    ) -> Followed {
        let id = json!({"taskId": task.id});
        let mut pause = task.poll;
        let mut waits = 0;
        loop {
            let t = Self::get_task(conn, &id, LogSink::NONE, auth, pause).await?;
            match t.get("status").and_then(Value::as_str) {
                Some("working") => waits = 0,
                Some(status @ ("input_required" | "completed" | "failed" | "cancelled")) => {
                    match conn.request("tasks/result", &id, log, auth).await {
                        Err(CallError::Timeout(_))
                            if status == "input_required" && waits + 1 < MAX_INPUT_WAITS =>
                        {
                            waits += 1;
                        }
                        Ok(v) => return Ok(Ok(without_related_task(v))),
                        Err(e @ (CallError::Rpc(..) | CallError::NeedsTask(_))) => return Ok(Err(e)),
                        Err(e) => return Err(e),
                    }
                }
                _ => return Err(CallError::Protocol("a task of unknown status".into())),
            }
            pause = poll_interval(&t, false).unwrap_or(pause);
            tokio::time::sleep(pause).await;
        }
    }

    /// Follows a 2026-07-28 task: `tasks/get` until it ends, its questions (`inputRequests`)
    /// relayed to the call's client once each and answered with `tasks/update`; its result
    /// or error comes with the `tasks/get` that says it ended.
    async fn follow_2026(
        &self,
        conn: &Conn,
        task: &Created,
        log: LogSink<'_>,
        auth: Option<&HeaderValue>,
    ) -> Followed {
        let id = json!({"taskId": task.id});
        let quiet = LogSink { ask: None, ..log };
        let mut answered = BTreeSet::new();
        let mut pause = task.poll;
        loop {
            let mut t = Self::get_task(conn, &id, quiet, auth, pause).await?;
            match t.get("status").and_then(Value::as_str) {
                Some("working") => {}
                Some("input_required") => {
                    if let Some(answers) = self.answer(&mut t, &mut answered, log).await? {
                        let update = json!({"taskId": task.id, "inputResponses": answers});
                        conn.request("tasks/update", &update, quiet, auth).await?;
                        continue;
                    }
                }
                Some("completed") => {
                    return match t.get_mut("result").map(Value::take) {
                        Some(r @ Value::Object(_)) => Ok(Ok(r)),
                        _ => Err(CallError::Protocol("a completed task without a result".into())),
                    };
                }
                Some("failed") => {
                    let e = t.get("error");
                    let code = e
                        .and_then(|e| e.get("code"))
                        .and_then(Value::as_i64)
                        .unwrap_or(-32603);
                    let message = e
                        .and_then(|e| e.get("message"))
                        .and_then(Value::as_str)
                        .unwrap_or("the task failed");
                    return Ok(Err(CallError::Rpc(code, message.chars().take(1024).collect())));
                }
                Some("cancelled") => {
                    return Ok(Err(CallError::Down("the upstream cancelled the task".into())));
                }
                _ => return Err(CallError::Protocol("a task of unknown status".into())),
            }
            pause = poll_interval(&t, true).unwrap_or(pause);
            tokio::time::sleep(pause).await;
        }
    }

    /// The client's answers to the questions of task `t` not answered yet (`None`: every
    /// one is, and the upstream has not taken them in yet).
    async fn answer(
        &self,
        t: &mut Value,
        answered: &mut BTreeSet<String>,
        log: LogSink<'_>,
    ) -> Result<Option<serde_json::Map<String, Value>>, CallError> {
        let Some(ask) = log.ask else {
            return Err(CallError::Protocol(
                "the task asks the client for input, which is not relayed here".into(),
            ));
        };
        let mut round = InputRound::asking(t)?;
        round.requests.retain(|(key, ..)| !answered.contains(key));
        let answers = super::relay::ask_each(ask, round.requests).await?;
        answered.extend(answers.keys().cloned());
        Ok((!answers.is_empty()).then_some(answers))
    }
}

/// A `tasks/result` answer as the call's result: without the related-task `_meta` the
/// upstream adds (its task is none of the client's business).
fn without_related_task(mut v: Value) -> Value {
    if let Some(m) = v.get_mut("_meta").and_then(Value::as_object_mut) {
        m.remove("io.modelcontextprotocol/related-task");
        if m.is_empty() {
            v.as_object_mut().map(|o| o.remove("_meta"));
        }
    }
    v
}

impl Conn {
    /// Whether requests to it are made in protocol 2026-07-28 (connecting first if needed).
    async fn speaks_2026(&self, auth: Option<&HeaderValue>) -> Result<bool, CallError> {
        match self {
            Self::Stdio(_) | Self::Pinned(..) => Ok(false),
            Self::Http(r) => r.speaks_2026(auth).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_is_told_from_a_result_and_checked() {
        let legacy = json!({"task": {"taskId": "t1", "status": "working", "pollInterval": 1}});
        assert_eq!(
            created(legacy, false).unwrap().unwrap(),
            Created {
                id: "t1".into(),
                poll: POLL_MIN
            }
        );
        let modern = json!({"resultType": "task", "taskId": "t2", "pollIntervalMs": 3_600_000});
        assert_eq!(created(modern, true).unwrap().unwrap().poll, POLL_MAX);
        // Each revision's own field.
        let wrong = json!({"resultType": "task", "taskId": "t3", "pollInterval": 1000});
        assert_eq!(created(wrong, true).unwrap().unwrap().poll, POLL_DEFAULT);
        // Run at once: the result itself.
        let done = json!({"content": [], "resultType": "complete"});
        assert_eq!(created(done.clone(), true).unwrap().unwrap_err(), done);
        assert!(created(json!({"content": []}), false).unwrap().is_err());
        for bad in [
            json!({"task": {"status": "working"}}),
            json!({"task": {"taskId": ""}}),
            json!({"task": {"taskId": 7}}),
            json!({"task": {"taskId": "x".repeat(257)}}),
        ] {
            assert!(matches!(created(bad, false), Err(CallError::Protocol(_))));
        }
        assert_eq!(poll_interval(&json!({}), false), None);
        assert_eq!(poll_interval(&json!({"pollInterval": -1}), false), None);
        assert_eq!(
            poll_interval(&json!({"pollIntervalMs": 2000}), true),
            Some(Duration::from_secs(2))
        );
    }

    #[test]
    fn the_upstreams_task_is_not_named_in_the_result() {
        let v = json!({"content": [], "_meta": {"io.modelcontextprotocol/related-task": {"taskId": "t"}}});
        assert_eq!(without_related_task(v), json!({"content": []}));
        let v = json!({"content": [], "_meta": {"io.modelcontextprotocol/related-task": {}, "k": 1}});
        assert_eq!(without_related_task(v), json!({"content": [], "_meta": {"k": 1}}));
    }
}
