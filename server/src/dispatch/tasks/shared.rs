//! Tasks shared by every replica, in Redis (`--tasks-redis`): a task created through one
//! replica is read, cancelled or answered through any other, and its result outlives the
//! replica that ran it.
//!
//! Each task is one Redis hash, `<prefix>task:<id>`, that expires with the task's TTL:
//! `o` its owner, `s` its status, `c`/`u` created/updated (ms since the epoch, on Redis's
//! clock), `t`/`p` its TTL and poll interval (ms), `r` its result (JSON) or `ec`/`em` its
//! error. Sorted sets of ids scored by expiry bound the tasks: `<prefix>tasks` in total,
//! `<prefix>owner:<owner>` per caller with credentials (and pages its `tasks/list`), and for
//! callers without credentials `<prefix>anon:<digest of the address>` each and
//! `<prefix>anonymous` together. Every change is one Lua
//! script, atomic in Redis: a finished task never changes again, and a task cancelled through
//! another replica stays cancelled whatever its work does afterwards.
//!
//! The work of a task runs on the replica that created it. That replica keeps the task's
//! cancellation token and the bytes of the results it wrote (so each replica bounds what it
//! stores), and looks at its running tasks in Redis every poll interval to stop the work of
//! any cancelled (or expired) through another replica.

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rustc_hash::FxHashMap;
use serde_json::{Map, Value};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::task::{MAX_TASK_ID, Quota, Refused, Status, TaskBounds, TaskView, UpdateError};
use crate::net::resp::{Client, Endpoint, Reply};

/// How often the end of a task is tried before it is given up (about 1.5 s of back-off).
const FINISH_TRIES: u32 = 5;

/// Largest reply read from Redis: a task's hash, its result included.
const MAX_REPLY: usize = 2 << 20;

/// Creates a task if its caller and the server are within their bounds.
/// KEYS: the task, all tasks, the owner's tasks, the sequence, the tasks counted against the
/// caller's bound, the tasks of callers without credentials. ARGV: owner, ttl, per-caller,
/// total, poll, id, the bound of callers without credentials (0: the caller has credentials).
/// Answers the creation time, or -1 (per caller), -2 (total), -3 (id taken), -4 (callers
/// without credentials together).
/// The owner's set and the caller's are scored by expiry × 1024 + a sequence number, so that
/// each score is unique (a cursor of `tasks/list`); for a caller with credentials they are
/// one set. A task without an owner (reachable by its id alone) is in no owner's set.
const CREATE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
local anon = tonumber(ARGV[7])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now * 1024)
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now * 1024)
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[4]) then return -2 end
if anon > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now)
  if redis.call('ZCARD', KEYS[6]) >= anon then return -4 end
end
if redis.call('ZCARD', KEYS[5]) >= tonumber(ARGV[3]) then return -1 end
if redis.call('EXISTS', KEYS[1]) == 1 then return -3 end
local n = string.format('%d', now)
redis.call('HSET', KEYS[1], 'o', ARGV[1], 's', 'working', 'c', n, 'u', n, 't', ARGV[2], 'p', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ttl)
local seq = redis.call('INCR', KEYS[4]) % 1024
local score = string.format('%d', (now + ttl) * 1024 + seq)
redis.call('ZADD', KEYS[2], now + ttl, ARGV[6])
if ARGV[1] ~= '' then redis.call('ZADD', KEYS[3], score, ARGV[6]) end
redis.call('ZADD', KEYS[5], score, ARGV[6])
if anon > 0 then redis.call('ZADD', KEYS[6], now + ttl, ARGV[6]) end
for _, i in ipairs({2, 3, 5, 6}) do
  if redis.call('PTTL', KEYS[i]) < ttl then redis.call('PEXPIRE', KEYS[i], ttl) end
end
return now
";

/// Records the end of a task that has not ended. KEYS: the task. ARGV: the status, then
/// field/value pairs. Answers 1 if recorded.
const FINISH: &str = r"
local s = redis.call('HGET', KEYS[1], 's')
if not s or s == 'completed' or s == 'failed' or s == 'cancelled' then return 0 end
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
redis.call('HSET', KEYS[1], 's', ARGV[1], 'u', now, unpack(ARGV, 2))
return 1
";

/// Cancels a task of its owner. KEYS: the task. ARGV: the owner. Answers 1 if the task is
/// the owner's (cancelled now or already ended), 0 otherwise.
const CANCEL: &str = r"
local o = redis.call('HGET', KEYS[1], 'o')
if not o or o ~= ARGV[1] then return 0 end
local s = redis.call('HGET', KEYS[1], 's')
if s == 'completed' or s == 'failed' or s == 'cancelled' then return 1 end
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
redis.call('HSET', KEYS[1], 's', 'cancelled', 'u', now)
return 1
";

/// Parks a working task until the client answers its questions. KEYS: the task. ARGV: key
/// and request (JSON) pairs. Answers 1 if parked, 0 if the task no longer works.
const PARK: &str = r"
if redis.call('HGET', KEYS[1], 's') ~= 'working' then return 0 end
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
redis.call('HSET', KEYS[1], 's', 'input_required', 'u', now)
for i = 1, #ARGV, 2 do redis.call('HSET', KEYS[1], 'i:' .. ARGV[i], ARGV[i + 1]) end
return 1
";

/// Records answers to pending questions. KEYS: the task. ARGV: the owner, then key and
/// answer pairs. Answers -1 (not the owner's), 0 (not waiting), 1 (answers taken, more
/// pending), 2 (the last one answered: working again).
const ANSWER: &str = r"
local o = redis.call('HGET', KEYS[1], 'o')
if not o or o ~= ARGV[1] then return -1 end
if redis.call('HGET', KEYS[1], 's') ~= 'input_required' then return 0 end
for i = 2, #ARGV, 2 do
  if redis.call('HDEL', KEYS[1], 'i:' .. ARGV[i]) == 1 then
    redis.call('HSET', KEYS[1], 'a:' .. ARGV[i], ARGV[i + 1])
  end
end
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'u', string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)))
for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(f, 1, 2) == 'i:' then return 1 end
end
redis.call('HSET', KEYS[1], 's', 'working')
return 2
";

/// Takes the answers of a task that is working again. KEYS: the task. Answers key and
/// answer pairs, removed from the task; nil while it still waits (or is gone or ended).
const TAKE: &str = r"
if redis.call('HGET', KEYS[1], 's') ~= 'working' then return false end
local out = {}
for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(f, 1, 2) == 'a:' then
    table.insert(out, string.sub(f, 3))
    table.insert(out, redis.call('HGET', KEYS[1], f))
    redis.call('HDEL', KEYS[1], f)
  end
end
return out
";

/// The status of each task of KEYS (nil for one that is gone).
const STATUSES: &str = r"
local out = {}
for i, k in ipairs(KEYS) do out[i] = redis.call('HGET', k, 's') end
return out
";

/// What shared tasks need of a Redis ACL user (`ACL SETUSER`), on the keys that start with
/// their prefix (`~PREFIX*`): the scripts run by `EVAL`, the reads `HGETALL` and
/// `ZRANGEBYSCORE`, and what the scripts call.
pub const ACL_COMMANDS: &str = "+eval +hgetall +zrangebyscore +time +exists +incr +pexpire +pttl \
                                +hget +hset +hdel +hkeys +zadd +zcard +zremrangebyscore";

/// Where the shared tasks live.
#[derive(Debug, Clone)]
pub struct SharedOptions {
    /// Which Redis (address, ACL user and password, TLS).
    pub endpoint: Endpoint,
    /// Part of every key: whose tasks these are (several servers may share one Redis).
    pub prefix: String,
    /// Longest exchange with Redis (connecting, the TLS handshake and `AUTH` included).
    pub timeout: Duration,
}

/// Why the shared store could not answer.
#[derive(Debug)]
pub(super) struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the task store is unavailable ({}); try again", self.0)
    }
}

/// Why a task was not created.
#[derive(Debug)]
pub(super) enum NotCreated {
    Refused(Refused),
    Unavailable(Unavailable),
}

/// A task this replica runs.
#[derive(Debug)]
struct Running {
    token: CancellationToken,
    expires: Instant,
    /// The JSON size of the result it stored (0 until then).
    size: usize,
    /// Its end is recorded.
    done: bool,
    /// While it waits for input: what resumes its run, and the answers the run had already.
    parked: Option<Parked>,
}

/// What resumes a parked run, and the answers it had already.
type Parked = (oneshot::Sender<Map<String, Value>>, Map<String, Value>);

/// The tasks shared by replicas, in Redis.
#[derive(Debug)]
pub(super) struct SharedTasks {
    redis: Client,
    prefix: String,
    bounds: TaskBounds,
    local: Mutex<FxHashMap<Box<str>, Running>>,
}

/// The key of the set bounding one caller without credentials: a digest of its address (or
/// session), so that Redis holds no client address.
fn anonymous_key(prefix: &str, caller: &str) -> Vec<u8> {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(caller.as_bytes());
    let mut key = Vec::with_capacity(prefix.len() + 5 + 32);
    key.extend_from_slice(prefix.as_bytes());
    key.extend_from_slice(b"anon:");
    for b in &d[..16] {
        key.extend_from_slice(format!("{b:02x}").as_bytes());
    }
    key
}

fn unavailable(e: &std::io::Error) -> Unavailable {
    Unavailable(e.to_string())
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl SharedTasks {
    pub(super) fn new(opts: SharedOptions, bounds: TaskBounds) -> Self {
        SharedTasks {
            redis: Client::new(crate::net::resp::Options {
                endpoint: opts.endpoint,
                timeout: opts.timeout,
                max_connections: 16,
                max_reply: MAX_REPLY.max(bounds.max_result_bytes + 4096),
            }),
            prefix: opts.prefix,
            bounds,
            local: Mutex::new(FxHashMap::default()),
        }
    }

    fn key(&self, id: &str) -> Vec<u8> {
        [self.prefix.as_bytes(), b"task:", id.as_bytes()].concat()
    }

    fn owners(&self, owner: &str) -> Vec<u8> {
        [self.prefix.as_bytes(), b"owner:", owner.as_bytes()].concat()
    }

    async fn eval(&self, script: &str, keys: &[&[u8]], args: &[&[u8]]) -> Result<Reply, Unavailable> {
        match self.redis.eval(script, keys, args).await {
            Ok(Reply::Error(e)) => Err(Unavailable(format!("redis: {e}"))),
            Ok(r) => Ok(r),
            Err(e) => Err(unavailable(&e)),
        }
    }

    /// Creates a working task of `owner` within the bounds of `quota`, cancelled through
    /// `token`, kept for `ttl` (at most the store's).
    pub(super) async fn create(
        &self,
        owner: &str,
        quota: &Quota<'_>,
        token: CancellationToken,
        ttl: Duration,
    ) -> Result<TaskView, NotCreated> {
        let b = &self.bounds;
        let ttl = ttl.min(b.ttl);
        let (ttl_ms, poll) = (ms(ttl).to_string(), ms(b.poll_interval).to_string());
        let (per, total) = (b.per_caller.to_string(), b.total.to_string());
        let anonymous = if quota.anonymous { b.anonymous.max(1) } else { 0 }.to_string();
        let owners = self.owners(owner);
        // A caller with credentials is bounded by its owner's set; one without by its own
        // (its sessions, each an owner, are one caller).
        let counted = if quota.anonymous {
            anonymous_key(&self.prefix, &quota.key)
        } else {
            self.owners(&quota.key)
        };
        let pool = [self.prefix.as_bytes(), b"anonymous"].concat();
        let all = [self.prefix.as_bytes(), b"tasks"].concat();
        let seq = [self.prefix.as_bytes(), b"seq"].concat();
        // A collision of 128 random bits is not expected; one retry covers a broken generator.
        for _ in 0..2 {
            let id = super::task::mint();
            let key = self.key(&id);
            let args: [&[u8]; 7] = [
                owner.as_bytes(),
                ttl_ms.as_bytes(),
                per.as_bytes(),
                total.as_bytes(),
                poll.as_bytes(),
                id.as_bytes(),
                anonymous.as_bytes(),
            ];
            let keys: [&[u8]; 6] = [&key, &all, &owners, &seq, &counted, &pool];
            let at = match self.eval(CREATE, &keys, &args).await {
                Ok(Reply::Int(-1)) => return Err(NotCreated::Refused(Refused::PerCaller(b.per_caller))),
                Ok(Reply::Int(-2)) => return Err(NotCreated::Refused(Refused::Total(b.total))),
                Ok(Reply::Int(-4)) => return Err(NotCreated::Refused(Refused::Anonymous(b.anonymous))),
                Ok(Reply::Int(-3)) => continue,
                Ok(Reply::Int(at)) => epoch_ms(at),
                Ok(other) => return Err(NotCreated::Unavailable(Unavailable(format!("redis: {other:?}")))),
                Err(e) => return Err(NotCreated::Unavailable(e)),
            };
            if let Ok(mut local) = self.local.lock() {
                let now = Instant::now();
                local.retain(|_, r| r.expires > now);
                local.insert(
                    id.clone().into(),
                    Running {
                        token,
                        expires: now + ttl,
                        size: 0,
                        done: false,
                        parked: None,
                    },
                );
            }
            return Ok(TaskView {
                id,
                status: Status::Working,
                created: at,
                updated: at,
                ttl,
                poll_interval: b.poll_interval,
            });
        }
        Err(NotCreated::Unavailable(Unavailable("no free task id".into())))
    }

    /// The fields of the task `id` (empty when there is none).
    async fn fields(&self, id: &str) -> Result<FxHashMap<Vec<u8>, Vec<u8>>, Unavailable> {
        let key = self.key(id);
        let items = match self
            .redis
            .call(&[b"HGETALL", &key])
            .await
            .map_err(|e| unavailable(&e))?
        {
            Reply::Array(items) => items,
            other => return Err(Unavailable(format!("redis: {other:?}"))),
        };
        let mut it = items.into_iter();
        let mut fields = FxHashMap::default();
        while let (Some(Reply::Bulk(k)), Some(Reply::Bulk(v))) = (it.next(), it.next()) {
            fields.insert(k, v);
        }
        Ok(fields)
    }

    /// The task `id` of `owner`: `None` for an unknown, expired or foreign id.
    pub(super) async fn get(&self, owner: &str, id: &str) -> Result<Option<TaskView>, Unavailable> {
        if !issued_shape(id) {
            return Ok(None);
        }
        let f = self.fields(id).await?;
        if f.get(b"o".as_slice()).map(Vec::as_slice) != Some(owner.as_bytes()) {
            return Ok(None);
        }
        Ok(view(id, &f))
    }

    /// A page of `owner`'s tasks in the order they expire, after the cursor `after` (one
    /// this store gave), at most `limit` (≤ 500), with the cursor of the next page when there
    /// is one.
    pub(super) async fn list(
        &self,
        owner: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Result<(Vec<TaskView>, Option<u64>), Unavailable> {
        let limit = limit.clamp(1, 500);
        let from = after.map_or_else(|| "-inf".to_owned(), |a| format!("({a}"));
        let count = (limit + 1).to_string();
        let key = self.owners(owner);
        let args: [&[u8]; 8] = [
            b"ZRANGEBYSCORE",
            &key,
            from.as_bytes(),
            b"+inf",
            b"WITHSCORES",
            b"LIMIT",
            b"0",
            count.as_bytes(),
        ];
        let items = match self.redis.call(&args).await.map_err(|e| unavailable(&e))? {
            Reply::Array(items) => items,
            other => return Err(Unavailable(format!("redis: {other:?}"))),
        };
        let mut pairs = Vec::with_capacity(items.len() / 2);
        let mut it = items.into_iter();
        while let (Some(Reply::Bulk(id)), Some(Reply::Bulk(score))) = (it.next(), it.next()) {
            let score = std::str::from_utf8(&score)
                .ok()
                .and_then(|s| s.parse::<f64>().ok())
                .map_or(0, |s| s as u64);
            pairs.push((String::from_utf8_lossy(&id).into_owned(), score));
        }
        // One more than the page was asked for: there is a next page.
        let more = pairs.len() > limit;
        pairs.truncate(limit);
        let next = pairs.last().map(|(_, score)| *score).filter(|_| more);
        let mut page = Vec::with_capacity(pairs.len());
        for (id, _) in &pairs {
            if let Some(v) = self.get(owner, id).await? {
                page.push(v);
            }
        }
        Ok((page, next))
    }

    /// Waits until the task `id` of `owner` has ended (or is gone), looking every poll
    /// interval: `false` at once for an unknown, expired or foreign id.
    pub(super) async fn wait_end(&self, owner: &str, id: &str) -> Result<bool, Unavailable> {
        let every = self.bounds.poll_interval.max(Duration::from_millis(100));
        let mut known = false;
        loop {
            match self.get(owner, id).await? {
                None => return Ok(known),
                Some(v) if v.status.terminal() => return Ok(true),
                Some(_) => known = true,
            }
            tokio::time::sleep(every).await;
        }
    }

    /// Records the end of a task this replica ran (no effect on a task already ended, e.g.
    /// cancelled). A result over the bounds fails the task instead. `false` if Redis could
    /// not be told (logged).
    pub(super) async fn finish(&self, id: &str, status: Status) -> bool {
        let (status, size) = {
            let Ok(mut local) = self.local.lock() else {
                return false;
            };
            let held: usize = local.values().map(|r| r.size).sum();
            let (status, size) = super::task::within_bounds(status, held, &self.bounds);
            if let Some(r) = local.get_mut(id) {
                r.size = size;
                r.done = true;
            }
            (status, size)
        };
        let code;
        let body;
        let args: Vec<&[u8]> = match &status {
            Status::Completed(r) => {
                body = serde_json::to_vec(r).unwrap_or_default();
                vec![b"completed", b"r", &body]
            }
            Status::Failed(c, m) => {
                code = c.to_string();
                vec![b"failed", b"ec", code.as_bytes(), b"em", m.as_bytes()]
            }
            Status::Cancelled => vec![b"cancelled"],
            Status::Working | Status::InputRequired(_) => return true,
        };
        let key = self.key(id);
        // A Redis that restarts or fails over for a moment must not lose a finished task's
        // result: a few tries, backing off, before giving up (logged).
        let mut wait = Duration::from_millis(100);
        for attempt in 1..=FINISH_TRIES {
            match self.eval(FINISH, &[&key], &args).await {
                Ok(_) => return true,
                Err(e) if attempt == FINISH_TRIES => {
                    tracing::warn!(task = %id, bytes = size, error = %e, "a task's end could not be recorded");
                }
                Err(_) => {
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
            }
        }
        false
    }

    /// Cancels the task `id` of `owner`: `false` for an unknown, expired or foreign id. Its
    /// work stops at once when this replica runs it, else when its replica next looks.
    pub(super) async fn cancel(&self, owner: &str, id: &str) -> Result<bool, Unavailable> {
        if !issued_shape(id) {
            return Ok(false);
        }
        let key = self.key(id);
        let ok = matches!(
            self.eval(CANCEL, &[&key], &[owner.as_bytes()]).await?,
            Reply::Int(1)
        );
        if ok
            && let Ok(local) = self.local.lock()
            && let Some(r) = local.get(id)
        {
            r.token.cancel();
        }
        Ok(ok)
    }

    /// Stops the work of this replica's tasks that were cancelled through another replica or
    /// are gone from Redis (expired, flushed); forgets the tasks whose TTL ended.
    pub(super) async fn reconcile(&self) {
        let ids: Vec<Box<str>> = match self.local.lock() {
            Ok(mut local) => {
                let now = Instant::now();
                local.retain(|_, r| {
                    let keep = r.expires > now;
                    if !keep {
                        r.token.cancel();
                    }
                    keep
                });
                local
                    .iter()
                    .filter(|(_, r)| !r.done && !r.token.is_cancelled())
                    .map(|(id, _)| id.clone())
                    .collect()
            }
            Err(_) => return,
        };
        for chunk in ids.chunks(crate::net::resp::MAX_ELEMENTS) {
            let keys: Vec<Vec<u8>> = chunk.iter().map(|id| self.key(id)).collect();
            let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            let Ok(Reply::Array(statuses)) = self.eval(STATUSES, &refs, &[]).await else {
                // Redis down: the work goes on; its end is recorded if Redis comes back.
                return;
            };
            let mut resumed = Vec::new();
            {
                let Ok(mut local) = self.local.lock() else {
                    return;
                };
                for (id, s) in chunk.iter().zip(statuses) {
                    let Some(r) = local.get_mut(id) else {
                        continue;
                    };
                    match s {
                        Reply::Bulk(s) if s == b"working" && r.parked.is_some() => resumed.push(id.clone()),
                        Reply::Bulk(s) if s != b"cancelled" => {}
                        // Cancelled through another replica, or gone from Redis.
                        _ => {
                            r.parked = None;
                            r.token.cancel();
                        }
                    }
                }
            }
            for id in resumed {
                self.resume(&id).await;
            }
        }
    }

    /// Parks the working task `id` (run here) until the client answers `asked`; the receiver
    /// yields `used` and every answer once the last is in, through whichever replica they
    /// came. `None` when the task no longer works (cancelled, expired) or Redis failed.
    pub(super) async fn park(
        &self,
        id: &str,
        asked: Map<String, Value>,
        used: Map<String, Value>,
    ) -> Option<oneshot::Receiver<Map<String, Value>>> {
        let pairs: Vec<(String, Vec<u8>)> = asked
            .into_iter()
            .map(|(k, v)| (k, serde_json::to_vec(&v).unwrap_or_default()))
            .collect();
        let args: Vec<&[u8]> = pairs
            .iter()
            .flat_map(|(k, v)| [k.as_bytes(), v.as_slice()])
            .collect();
        let key = self.key(id);
        let (tx, rx) = oneshot::channel();
        // Registered before Redis shows the questions, so an answer cannot come first.
        self.local.lock().ok()?.get_mut(id)?.parked = Some((tx, used));
        match self.eval(PARK, &[&key], &args).await {
            Ok(Reply::Int(1)) => Some(rx),
            other => {
                if let Err(e) = other {
                    tracing::warn!(task = %id, error = %e, "a task's questions could not be recorded");
                }
                if let Ok(mut local) = self.local.lock()
                    && let Some(r) = local.get_mut(id)
                {
                    r.parked = None;
                }
                None
            }
        }
    }

    /// Records answers to the questions of the task `id` of `owner`, at once, whichever
    /// replica runs it: answers to keys it does not wait for are ignored, a malformed answer
    /// to one it waits for is refused with nothing changed. The last answer resumes the run
    /// (at once when it runs here, else within the poll interval of its replica).
    pub(super) async fn update(
        &self,
        owner: &str,
        id: &str,
        responses: Map<String, Value>,
    ) -> Result<(), UpdateError> {
        if !issued_shape(id) {
            return Err(UpdateError::Unknown);
        }
        let store = |e: Unavailable| UpdateError::Store(e.to_string());
        let f = self.fields(id).await.map_err(store)?;
        if f.get(b"o".as_slice()).map(Vec::as_slice) != Some(owner.as_bytes()) {
            return Err(UpdateError::Unknown);
        }
        let Some(Status::InputRequired(pending)) = view(id, &f).map(|v| v.status) else {
            return Ok(());
        };
        let held = f
            .iter()
            .filter(|(k, _)| k.starts_with(b"a:"))
            .map(|(_, v)| v.len())
            .sum();
        let (answered, size) = super::task::checked(&pending, &responses, held)?;
        if size > self.bounds.max_result_bytes {
            return Err(UpdateError::Invalid(format!(
                "Invalid params: the answers are about {size} bytes; a task keeps at most {}",
                self.bounds.max_result_bytes
            )));
        }
        if answered.is_empty() {
            return Ok(());
        }
        let pairs: Vec<(String, Vec<u8>)> = answered
            .into_iter()
            .filter_map(|k| {
                let v = serde_json::to_vec(responses.get(&k)?).ok()?;
                Some((k, v))
            })
            .collect();
        let mut args: Vec<&[u8]> = vec![owner.as_bytes()];
        args.extend(pairs.iter().flat_map(|(k, v)| [k.as_bytes(), v.as_slice()]));
        let key = self.key(id);
        match self.eval(ANSWER, &[&key], &args).await.map_err(store)? {
            Reply::Int(-1) => Err(UpdateError::Unknown),
            Reply::Int(2) => {
                self.resume(id).await;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Resumes the run of the parked task `id`, if it runs here and Redis shows it working
    /// again, with the answers Redis holds (taken from it).
    async fn resume(&self, id: &str) {
        let parked = match self.local.lock() {
            Ok(local) => local.get(id).is_some_and(|r| r.parked.is_some()),
            Err(_) => false,
        };
        if !parked {
            return;
        }
        let key = self.key(id);
        let Ok(Reply::Array(items)) = self.eval(TAKE, &[&key], &[]).await else {
            return;
        };
        let Some((tx, mut answers)) = self
            .local
            .lock()
            .ok()
            .and_then(|mut l| l.get_mut(id)?.parked.take())
        else {
            return;
        };
        let mut it = items.into_iter();
        while let (Some(Reply::Bulk(k)), Some(Reply::Bulk(v))) = (it.next(), it.next()) {
            if let (Ok(k), Ok(v)) = (String::from_utf8(k), serde_json::from_slice(&v)) {
                answers.insert(k, v);
            }
        }
        let _ = tx.send(answers);
    }

    /// Stops the work of every task this replica still runs and records each as failed with
    /// `message`; answers how many.
    pub(super) async fn abandon(&self, message: &str) -> usize {
        let ids: Vec<Box<str>> = match self.local.lock() {
            Ok(local) => local
                .iter()
                .filter(|(_, r)| !r.done)
                .map(|(id, r)| {
                    r.token.cancel();
                    id.clone()
                })
                .collect(),
            Err(_) => return 0,
        };
        let code = i64::from(crate::protocol::INTERNAL_ERROR);
        for id in &ids {
            self.finish(id, Status::Failed(code, message.to_owned())).await;
        }
        ids.len()
    }

    /// Runs [`Self::reconcile`] every poll interval until `stop`.
    pub(super) async fn follow(&self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.bounds.poll_interval.max(Duration::from_millis(100)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => self.reconcile().await,
            }
        }
    }
}

/// Whether `id` has the shape of an id this store issues (32 hex digits, see
/// [`super::task::mint`]); any other is unknown without asking Redis.
fn issued_shape(id: &str) -> bool {
    id.len() == 32 && id.len() <= MAX_TASK_ID && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The task `id` as its hash `f` holds it; `None` for a hash that is not a task's.
fn view(id: &str, f: &FxHashMap<Vec<u8>, Vec<u8>>) -> Option<TaskView> {
    let text = |k: &str| f.get(k.as_bytes()).map(|v| String::from_utf8_lossy(v));
    let num = |k: &str| text(k).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
    let internal = i64::from(crate::protocol::INTERNAL_ERROR);
    let status = match text("s")?.as_ref() {
        "working" => Status::Working,
        "input_required" => Status::InputRequired(
            f.iter()
                .filter_map(|(k, v)| {
                    let k = std::str::from_utf8(k.strip_prefix(b"i:")?).ok()?;
                    Some((k.to_owned(), serde_json::from_slice(v).ok()?))
                })
                .collect(),
        ),
        "completed" => match f.get(b"r".as_slice()).map(|r| serde_json::from_slice::<Value>(r)) {
            Some(Ok(v)) => Status::Completed(v),
            _ => Status::Failed(internal, "the task's stored result could not be read".into()),
        },
        "failed" => Status::Failed(
            text("ec").and_then(|c| c.parse().ok()).unwrap_or(internal),
            text("em").unwrap_or_default().into_owned(),
        ),
        "cancelled" => Status::Cancelled,
        _ => return None,
    };
    Some(TaskView {
        id: id.to_owned(),
        status,
        created: epoch_ms(num("c")),
        updated: epoch_ms(num("u")),
        ttl: Duration::from_millis(num("t").unsigned_abs()),
        poll_interval: Duration::from_millis(num("p").unsigned_abs()),
    })
}

/// The instant `ms` milliseconds after the epoch.
fn epoch_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.unsigned_abs())
}

#[cfg(test)]
mod tests {
    //! Against a real redis-server (`QUIVER_REDIS_SERVER`, else scripts/redis.sh).
    use super::*;
    use serde_json::json;

    struct Redis {
        child: std::process::Child,
        port: u16,
        _dir: tempfile::TempDir,
    }

    impl Drop for Redis {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    async fn redis() -> Redis {
        let bin = std::env::var("QUIVER_REDIS_SERVER").unwrap_or_else(|_| {
            let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/redis.sh");
            let out = std::process::Command::new(root)
                .output()
                .expect("scripts/redis.sh");
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .last()
                .unwrap_or_default()
                .to_owned()
        });
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let child = std::process::Command::new(bin)
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .current_dir(dir.path())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server");
        let r = Redis {
            child,
            port,
            _dir: dir,
        };
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("redis-server did not start");
    }

    fn replica(r: &Redis, bounds: TaskBounds) -> SharedTasks {
        SharedTasks::new(
            SharedOptions {
                endpoint: Endpoint::plain(format!("127.0.0.1:{}", r.port)),
                prefix: "test/ns/name/".into(),
                timeout: Duration::from_secs(2),
            },
            bounds,
        )
    }

    #[tokio::test]
    async fn a_task_created_on_one_replica_is_read_cancelled_and_finished_through_another() {
        let r = redis().await;
        let bounds = TaskBounds {
            poll_interval: Duration::from_millis(100),
            ..TaskBounds::default()
        };
        let (a, b) = (replica(&r, bounds), replica(&r, bounds));
        let token = CancellationToken::new();
        let t = a
            .create("alice", &Quota::caller("alice"), token.clone(), Duration::MAX)
            .await
            .unwrap();
        let seen = b
            .get("alice", &t.id)
            .await
            .unwrap()
            .expect("visible on b at once");
        assert_eq!(seen.status, Status::Working);
        assert_eq!(seen.created, t.created);
        assert_eq!(seen.ttl, bounds.ttl);
        // A foreign caller sees nothing and cancels nothing.
        assert!(b.get("mallory", &t.id).await.unwrap().is_none());
        assert!(!b.cancel("mallory", &t.id).await.unwrap());
        // Finished on a, with its result, read on b.
        let result = json!({"content": [{"type": "text", "text": "done"}], "isError": false, "n": []});
        assert!(a.finish(&t.id, Status::Completed(result.clone())).await);
        let got = b.get("alice", &t.id).await.unwrap().unwrap();
        assert_eq!(got.status, Status::Completed(result));
        // Ended: a later cancel is no error and changes nothing.
        assert!(b.cancel("alice", &t.id).await.unwrap());
        assert!(matches!(
            b.get("alice", &t.id).await.unwrap().unwrap().status,
            Status::Completed(_)
        ));

        // Cancelled through b: the work on a stops when a next reconciles, and its late end
        // does not undo the cancel.
        let token = CancellationToken::new();
        let t = a
            .create("alice", &Quota::caller("alice"), token.clone(), Duration::MAX)
            .await
            .unwrap();
        assert!(b.cancel("alice", &t.id).await.unwrap());
        assert!(!token.is_cancelled());
        a.reconcile().await;
        assert!(token.is_cancelled());
        a.finish(&t.id, Status::Completed(json!({}))).await;
        assert_eq!(
            b.get("alice", &t.id).await.unwrap().unwrap().status,
            Status::Cancelled
        );

        // A failure keeps its code and message.
        let t = a
            .create(
                "alice",
                &Quota::caller("alice"),
                CancellationToken::new(),
                Duration::MAX,
            )
            .await
            .unwrap();
        a.finish(
            &t.id,
            Status::Failed(-32603, "stopped: the server shut down".into()),
        )
        .await;
        assert_eq!(
            b.get("alice", &t.id).await.unwrap().unwrap().status,
            Status::Failed(-32603, "stopped: the server shut down".into())
        );
    }

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[tokio::test]
    async fn a_task_parked_on_one_replica_is_answered_through_another_and_resumes_where_it_runs() {
        let r = redis().await;
        let (a, b) = (
            replica(&r, TaskBounds::default()),
            replica(&r, TaskBounds::default()),
        );
        let t = a
            .create(
                "alice",
                &Quota::caller("alice"),
                CancellationToken::new(),
                Duration::MAX,
            )
            .await
            .unwrap();
        let form = |m: &str| json!({"method": "elicitation/create", "params": {"mode": "form", "message": m, "requestedSchema": {"type": "object"}}});
        let asked = obj(json!({"name": form("name?"), "confirm": form("sure?")}));
        let used = obj(json!({"earlier": {"action": "accept", "content": {"x": 1}}}));
        let mut rx = a.park(&t.id, asked, used).await.expect("parked");
        let seen = b.get("alice", &t.id).await.unwrap().unwrap();
        let Status::InputRequired(pending) = &seen.status else {
            panic!("{seen:?}")
        };
        assert_eq!(pending.len(), 2);
        assert_eq!(pending["name"]["method"], "elicitation/create");
        assert_eq!(seen.detailed()["status"], "input_required");

        // Another caller, a malformed answer to a pending key: refused, nothing changed.
        assert_eq!(
            b.update(
                "mallory",
                &t.id,
                obj(json!({"name": {"action": "accept", "content": {}}}))
            )
            .await,
            Err(UpdateError::Unknown)
        );
        let bad = b.update("alice", &t.id, obj(json!({"name": {"nope": 1}}))).await;
        assert!(matches!(bad, Err(UpdateError::Invalid(_))), "{bad:?}");
        // A partial answer (with an unknown key, ignored) is taken at once, through b.
        let name = json!({"action": "accept", "content": {"name": "Alice"}});
        b.update(
            "alice",
            &t.id,
            obj(json!({"name": name, "unknown-key": {"ignored": true}})),
        )
        .await
        .unwrap();
        let Status::InputRequired(pending) = b.get("alice", &t.id).await.unwrap().unwrap().status else {
            panic!("still waiting")
        };
        assert_eq!(pending.keys().collect::<Vec<_>>(), ["confirm"]);
        a.reconcile().await;
        assert!(rx.try_recv().is_err(), "resumed before the last answer");
        // The last one: working again; a resumes with every answer when it next looks.
        let confirm = json!({"action": "accept", "content": {"confirm": true}});
        b.update("alice", &t.id, obj(json!({"confirm": confirm})))
            .await
            .unwrap();
        assert_eq!(
            b.get("alice", &t.id).await.unwrap().unwrap().status,
            Status::Working
        );
        a.reconcile().await;
        let all = rx.try_recv().expect("resumed");
        assert_eq!(all["name"], name);
        assert_eq!(all["confirm"], confirm);
        assert_eq!(all["earlier"]["content"]["x"], 1);

        // Answered through the replica that runs it: resumed at once. A cancel through the
        // other replica while parked ends the wait.
        let mut rx = a
            .park(&t.id, obj(json!({"again": form("again?")})), Map::new())
            .await
            .unwrap();
        a.update("alice", &t.id, obj(json!({"again": {"action": "decline"}})))
            .await
            .unwrap();
        assert_eq!(rx.try_recv().unwrap()["again"]["action"], "decline");
        let rx = a
            .park(&t.id, obj(json!({"last": form("last?")})), Map::new())
            .await
            .unwrap();
        assert!(b.cancel("alice", &t.id).await.unwrap());
        a.reconcile().await;
        assert!(rx.await.is_err(), "a cancelled task's wait ends without answers");
        assert!(
            a.park(&t.id, obj(json!({"x": form("x")})), Map::new())
                .await
                .is_none()
        );
    }

    #[tokio::test]
    async fn pages_of_a_callers_own_tasks_span_replicas_and_a_wait_ends_with_the_task() {
        let r = redis().await;
        let (a, b) = (
            replica(&r, TaskBounds::default()),
            replica(&r, TaskBounds::default()),
        );
        let mut mine = Vec::new();
        for i in 0..7 {
            let at = if i % 2 == 0 { &a } else { &b };
            mine.push(
                at.create(
                    "alice",
                    &Quota::caller("alice"),
                    CancellationToken::new(),
                    Duration::MAX,
                )
                .await
                .unwrap()
                .id,
            );
        }
        let theirs = a
            .create(
                "bob",
                &Quota::caller("bob"),
                CancellationToken::new(),
                Duration::MAX,
            )
            .await
            .unwrap()
            .id;
        let short = a
            .create(
                "alice",
                &Quota::caller("alice"),
                CancellationToken::new(),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        assert_eq!(short.ttl, Duration::from_secs(5));
        let mut seen = Vec::new();
        let mut cursor = None;
        for _ in 0..10 {
            let (page, next) = b.list("alice", cursor, 3).await.unwrap();
            assert!(page.len() <= 3);
            seen.extend(page.into_iter().map(|v| v.id));
            cursor = next;
            if cursor.is_none() {
                break;
            }
        }
        assert!(cursor.is_none(), "the pages end");
        assert_eq!(seen.len(), 8, "{seen:?}");
        // The shorter TTL expires first: first in the order of expiry.
        assert_eq!(seen[0], short.id);
        assert!(mine.iter().all(|id| seen.contains(id)) && !seen.contains(&theirs));
        let (page, next) = b.list("mallory", None, 3).await.unwrap();
        assert!(page.is_empty() && next.is_none());

        // A wait through b ends when a records the end; an unknown id is no wait at all.
        assert!(!b.wait_end("alice", &theirs).await.unwrap());
        let waiting = b.wait_end("alice", &mine[0]);
        let finishing = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            a.finish(&mine[0], Status::Completed(json!({"content": []})))
                .await;
        };
        let (ended, ()) = tokio::join!(waiting, finishing);
        assert!(ended.unwrap());
    }

    #[tokio::test]
    async fn bounds_hold_across_replicas_and_expiry_frees_them() {
        let r = redis().await;
        let bounds = TaskBounds {
            per_caller: 2,
            total: 3,
            ttl: Duration::from_millis(400),
            ..TaskBounds::default()
        };
        let (a, b) = (replica(&r, bounds), replica(&r, bounds));
        a.create(
            "alice",
            &Quota::caller("alice"),
            CancellationToken::new(),
            Duration::MAX,
        )
        .await
        .unwrap();
        b.create(
            "alice",
            &Quota::caller("alice"),
            CancellationToken::new(),
            Duration::MAX,
        )
        .await
        .unwrap();
        assert!(matches!(
            a.create(
                "alice",
                &Quota::caller("alice"),
                CancellationToken::new(),
                Duration::MAX
            )
            .await,
            Err(NotCreated::Refused(Refused::PerCaller(2)))
        ));
        let token = CancellationToken::new();
        let t = b
            .create("bob", &Quota::caller("bob"), token.clone(), Duration::MAX)
            .await
            .unwrap();
        assert!(matches!(
            a.create(
                "carol",
                &Quota::caller("carol"),
                CancellationToken::new(),
                Duration::MAX
            )
            .await,
            Err(NotCreated::Refused(Refused::Total(3)))
        ));
        // After the TTL: gone everywhere, its work stopped, its slots free.
        let deadline = Instant::now() + Duration::from_secs(10);
        while b.get("bob", &t.id).await.unwrap().is_some() {
            assert!(Instant::now() < deadline, "the task outlived its TTL");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        b.reconcile().await;
        assert!(token.is_cancelled());
        a.create(
            "carol",
            &Quota::caller("carol"),
            CancellationToken::new(),
            Duration::MAX,
        )
        .await
        .unwrap();
        a.create(
            "alice",
            &Quota::caller("alice"),
            CancellationToken::new(),
            Duration::MAX,
        )
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn callers_without_credentials_are_bounded_each_and_together_across_replicas() {
        let r = redis().await;
        let bounds = TaskBounds {
            per_caller: 1,
            total: 10,
            anonymous: 2,
            ..TaskBounds::default()
        };
        let (a, b) = (replica(&r, bounds), replica(&r, bounds));
        let anon = |key: &'static str| Quota {
            key: std::borrow::Cow::Borrowed(key),
            anonymous: true,
        };
        let new = CancellationToken::new;
        // One address in two sessions (two owners) is one caller.
        a.create("session-1", &anon("@192.0.2.1"), new(), Duration::MAX)
            .await
            .unwrap();
        assert!(matches!(
            b.create("session-2", &anon("@192.0.2.1"), new(), Duration::MAX)
                .await,
            Err(NotCreated::Refused(Refused::PerCaller(1)))
        ));
        // A task without an owner is reachable by its id, through any replica.
        let t = b
            .create("", &anon("@192.0.2.2"), new(), Duration::MAX)
            .await
            .unwrap();
        assert!(a.get("", &t.id).await.unwrap().is_some());
        assert!(a.get("session-1", &t.id).await.unwrap().is_none());
        // Together they hold at most their pool; callers with credentials are not in it,
        // even one whose subject reads like an address's key.
        assert!(matches!(
            a.create("", &anon("@192.0.2.3"), new(), Duration::MAX).await,
            Err(NotCreated::Refused(Refused::Anonymous(2)))
        ));
        for who in ["alice", "@192.0.2.3"] {
            b.create(who, &Quota::caller(who), new(), Duration::MAX)
                .await
                .unwrap();
        }
        // `tasks/list` pages an owner's own tasks only.
        let (page, _) = a.list("session-1", None, 10).await.unwrap();
        assert_eq!(page.len(), 1);
        // Redis holds no client address.
        let Reply::Array(keys) = a.redis.call(&[b"KEYS", b"*"]).await.unwrap() else {
            panic!("KEYS");
        };
        let keys: Vec<String> = keys
            .into_iter()
            .filter_map(|k| match k {
                Reply::Bulk(k) => Some(String::from_utf8_lossy(&k).into_owned()),
                _ => None,
            })
            .collect();
        assert!(keys.iter().any(|k| k.contains("anon:")), "{keys:?}");
        for address in ["192.0.2.1", "192.0.2.2"] {
            assert!(!keys.iter().any(|k| k.contains(address)), "{keys:?}");
        }
    }

    #[tokio::test]
    async fn over_mutual_tls_an_acl_user_with_the_documented_commands_runs_every_script() {
        let r = crate::net::resp_tls::tests::TlsRedis::start().await;
        let ok = Reply::Status("OK".into());
        assert_eq!(r.admin(&["CONFIG", "SET", "tls-auth-clients", "yes"]).await, ok);
        let mut acl = vec![
            "ACL",
            "SETUSER",
            "tasks",
            "on",
            ">tasks-pw",
            "~test/ns/name/*",
            "resetchannels",
            "-@all",
        ];
        acl.extend(ACL_COMMANDS.split_whitespace());
        assert_eq!(r.admin(&acl).await, ok);
        let replica = |ca: &str| {
            SharedTasks::new(
                SharedOptions {
                    endpoint: r.endpoint(ca, true, Some(("tasks", "tasks-pw"))),
                    prefix: "test/ns/name/".into(),
                    timeout: Duration::from_secs(5),
                },
                TaskBounds::default(),
            )
        };
        let (a, b) = (replica("ca.crt"), replica("ca.crt"));
        let new = CancellationToken::new;
        // CREATE, for a caller with credentials and one without.
        let t = a
            .create("alice", &Quota::caller("alice"), new(), Duration::MAX)
            .await
            .unwrap();
        let anon = Quota {
            key: std::borrow::Cow::Borrowed("@192.0.2.9"),
            anonymous: true,
        };
        let other = b.create("", &anon, new(), Duration::MAX).await.unwrap();
        // HGETALL and ZRANGEBYSCORE, through the other replica.
        assert_eq!(
            b.get("alice", &t.id).await.unwrap().unwrap().status,
            Status::Working
        );
        assert_eq!(b.list("alice", None, 10).await.unwrap().0.len(), 1);
        // PARK on a, ANSWER through b, STATUSES and TAKE when a reconciles.
        let form = json!({"method": "elicitation/create", "params": {"mode": "form", "message": "ok?", "requestedSchema": {"type": "object"}}});
        let mut rx = a
            .park(&t.id, obj(json!({"ok": form})), Map::new())
            .await
            .expect("parked");
        let yes = json!({"action": "accept", "content": {"ok": true}});
        b.update("alice", &t.id, obj(json!({"ok": yes}))).await.unwrap();
        a.reconcile().await;
        assert_eq!(rx.try_recv().expect("resumed")["ok"], yes);
        // FINISH on a, CANCEL through a.
        assert!(a.finish(&t.id, Status::Completed(json!({"content": []}))).await);
        assert!(matches!(
            b.get("alice", &t.id).await.unwrap().unwrap().status,
            Status::Completed(_)
        ));
        assert!(a.cancel("", &other.id).await.unwrap());
        assert_eq!(
            b.get("", &other.id).await.unwrap().unwrap().status,
            Status::Cancelled
        );

        // A Redis whose certificate is not trusted: unavailable, saying why.
        let untrusting = replica("other-ca.crt");
        match untrusting
            .create("alice", &Quota::caller("alice"), new(), Duration::MAX)
            .await
        {
            Err(NotCreated::Unavailable(u)) => assert!(u.0.contains("TLS handshake failed"), "{u}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn hostile_ids_and_owners_are_unknown_and_a_dead_redis_is_a_clear_error() {
        let r = redis().await;
        let a = replica(&r, TaskBounds::default());
        let t = a
            .create(
                "o:wner\r\n*1",
                &Quota::caller("o:wner\r\n*1"),
                CancellationToken::new(),
                Duration::MAX,
            )
            .await
            .unwrap();
        assert!(a.get("o:wner\r\n*1", &t.id).await.unwrap().is_some());
        let huge = "a".repeat(1 << 16);
        for id in ["", "*", "task:", "../x", "\r\n", huge.as_str(), &t.id[..31]] {
            assert!(a.get("o:wner\r\n*1", id).await.unwrap().is_none(), "{id:.40}");
            assert!(!a.cancel("o:wner\r\n*1", id).await.unwrap());
        }
        // An owner that is a prefix or an extension of the real one is foreign.
        assert!(a.get("o:wner", &t.id).await.unwrap().is_none());
        assert!(a.get("o:wner\r\n*1x", &t.id).await.unwrap().is_none());
        drop(r);
        let e = a.get("o:wner\r\n*1", &t.id).await.unwrap_err();
        assert!(e.to_string().contains("task store is unavailable"), "{e}");
        assert!(matches!(
            a.create("x", &Quota::caller("x"), CancellationToken::new(), Duration::MAX)
                .await,
            Err(NotCreated::Unavailable(_))
        ));
    }
}
