//! The vault in Redis (every replica), over [`crate::net::resp`]. Keys, all under
//! `quiver:oauth:v1:P:` (`P`, `U`, `S`: the prefix's, the upstream's and the subject's
//! hash, 64 hex digits):
//!
//! - `…U:S` a slot's sealed tokens, expiring with them;
//! - `…user:S` the subject's slots: a sorted set of `U` scored by expiry (ms, Redis's clock);
//! - `…users` every subject: a sorted set of `S` scored by its last slot's expiry;
//! - `…lock:U:S` the lock of a slot's refresh (`SET NX PX`, deleted only by its owner);
//! - `…used:N` a used sign-in state or link (`N`: the hash of its nonce).
//!
//! Every change is one Lua script, atomic in Redis. [`RedisStore::remove_user`]'s script
//! builds the slot keys of a subject from the prefix, so the vault needs a standalone Redis
//! (or one whose keys are all in one slot).

use std::time::Duration;

use super::{KEY_PREFIX, Loaded, Options, Slot, StoreError, hex, prefix_hash};
use crate::net::resp::{Client, Endpoint, Reply};

/// What the vault needs of a Redis ACL user (`ACL SETUSER`): its scripts run by `EVAL`, the
/// lock taken by `SET`, and what the scripts call.
pub const ACL_COMMANDS: &str = "+eval +set +get +del +time +zadd +zrem +zcard +zcount +zscore \
                                +zrange +zremrangebyscore +pexpire +pttl";
/// The keys of the vault with prefix `prefix` (`--upstream-sign-in-redis-prefix`), as an
/// ACL key pattern: `~quiver:oauth:v1:HASH:*`, `HASH` the SHA-256 of the prefix in hex.
/// A user given only this pattern reaches no other prefix's keys.
pub fn acl_keys(prefix: &str) -> String {
    format!("~{KEY_PREFIX}{}:*", prefix_hash(prefix))
}

/// A Lua function removing a slot (KEYS[1]), its entry (ARGV[1], U) in the subject's index
/// (KEYS[2]), and the subject (ARGV[2], S) from all subjects (KEYS[3]) when it holds no more.
macro_rules! drop_fn {
    () => {
        r"
local function drop()
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  if redis.call('ZCARD', KEYS[2]) == 0 then
    redis.call('DEL', KEYS[2])
    redis.call('ZREM', KEYS[3], ARGV[2])
  end
end
"
    };
}

/// A slot's sealed bytes; -1 (and the slot dropped) when they are over ARGV[3] bytes.
const LOAD: &str = concat!(
    drop_fn!(),
    r"
local v = redis.call('GET', KEYS[1])
if not v then return false end
if #v > tonumber(ARGV[3]) then
  drop()
  return -1
end
return v
"
);

/// Keeps a slot's sealed bytes. ARGV: U, S, the bytes, the TTL (ms), the bound of subjects,
/// the bound of slots per subject, and optionally the bytes the slot must still hold.
/// Answers 1, or -1 (a new subject over the bound), -2 (a new slot over the subject's bound),
/// 0 (the slot no longer holds the bytes expected).
const STORE: &str = r"
if ARGV[7] and redis.call('GET', KEYS[1]) ~= ARGV[7] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if not redis.call('ZSCORE', KEYS[3], ARGV[2]) and redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[5]) then
  return -1
end
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) and redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[6]) then
  return -2
end
redis.call('SET', KEYS[1], ARGV[3], 'PX', ttl)
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
local last = tonumber(redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')[2])
redis.call('ZADD', KEYS[3], last, ARGV[2])
local keep = last - now + 1000
redis.call('PEXPIRE', KEYS[2], keep)
if redis.call('PTTL', KEYS[3]) < keep then redis.call('PEXPIRE', KEYS[3], keep) end
return 1
";

/// Sets ARGV[2] where ARGV[1] still is, keeping the expiry. Answers 1 if set.
const REPLACE: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
return 1
";

/// Drops the slot if it still holds ARGV[3]. Answers 1 if dropped.
const DISCARD: &str = concat!(
    drop_fn!(),
    r"
if redis.call('GET', KEYS[1]) ~= ARGV[3] then return 0 end
drop()
return 1
"
);

/// Drops the slot; answers what it held (nil: nothing, -1: over ARGV[3] bytes).
const REMOVE: &str = concat!(
    drop_fn!(),
    r"
local v = redis.call('GET', KEYS[1])
drop()
if v and #v > tonumber(ARGV[3]) then return -1 end
return v
"
);

/// Drops every slot of a subject. KEYS: its index, all subjects. ARGV: the key prefix, S,
/// the largest value answered, the budget of bytes answered, the most slots read. Answers
/// U and sealed bytes pairs (those within the bounds; the others are dropped unanswered).
const REMOVE_USER: &str = r"
local out = {}
local left = tonumber(ARGV[4])
for _, u in ipairs(redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[5]) - 1)) do
  local k = ARGV[1] .. u .. ':' .. ARGV[2]
  local v = redis.call('GET', k)
  if v and #v <= tonumber(ARGV[3]) and #u + #v + 64 <= left then
    table.insert(out, u)
    table.insert(out, v)
    left = left - #u - #v - 64
  end
  redis.call('DEL', k)
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[2])
return out
";

/// The subject's slots that have not expired. KEYS: its index.
const COUNT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
";

/// Deletes the lock KEYS[1] if ARGV[1] holds it. Answers 1 if deleted.
const UNLOCK: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

/// Which Redis holds the vault.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Which Redis (address, ACL user and password, TLS).
    pub endpoint: Endpoint,
    /// Longest exchange (connecting, the TLS handshake and `AUTH` included).
    pub timeout: Duration,
    /// Connections at most.
    pub max_connections: usize,
}

/// The vault's Redis.
#[derive(Debug)]
pub(super) struct RedisStore {
    redis: Client,
    /// `quiver:oauth:v1:P:`, the start of every key.
    base: String,
    /// The key of all subjects.
    users: Vec<u8>,
    /// The largest sealed value read, as a script argument.
    max_sealed: String,
    /// The bytes of values one `remove_user` answers, at most.
    budget: usize,
}

fn ms(d: Duration) -> String {
    u64::try_from(d.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
        .to_string()
}

fn unexpected() -> String {
    "redis: unexpected reply".into()
}

impl RedisStore {
    pub(super) fn new(r: RedisOptions, opts: &Options, base: &str) -> Self {
        // Room for every slot of one subject (remove_user), within 16 MiB.
        let budget = (opts.max_sealed + 160)
            .saturating_mul(opts.max_per_user)
            .clamp(4096, 16 << 20);
        Self {
            redis: Client::new(crate::net::resp::Options {
                endpoint: r.endpoint,
                timeout: r.timeout,
                max_connections: r.max_connections.max(1),
                max_reply: budget + 4096,
            }),
            base: base.to_owned(),
            users: format!("{base}users").into_bytes(),
            max_sealed: opts.max_sealed.to_string(),
            budget,
        }
    }

    /// The key of the index of the subject of hash `user_hex`.
    fn index_key(&self, user_hex: &str) -> Vec<u8> {
        format!("{}user:{user_hex}", self.base).into_bytes()
    }

    async fn eval(&self, script: &str, keys: &[&[u8]], args: &[&[u8]]) -> Result<Reply, String> {
        match self.redis.eval(script, keys, args).await {
            // Redis's words (NOPERM, OOM, WRONGTYPE, ...), never a value of ours.
            Ok(Reply::Error(e)) => Err(format!("redis: {e}")),
            Ok(r) => Ok(r),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Runs `script` on `slot`: KEYS the slot, its subject's index, all subjects; ARGV U, S
    /// and `args`.
    async fn on_slot(&self, script: &str, slot: &Slot, args: &[&[u8]]) -> Result<Reply, String> {
        let (u, s) = (hex(&slot.upstream), hex(&slot.user));
        let index = self.index_key(&s);
        let mut argv: Vec<&[u8]> = Vec::with_capacity(2 + args.len());
        argv.extend([u.as_bytes(), s.as_bytes()]);
        argv.extend_from_slice(args);
        self.eval(script, &[slot.id.as_bytes(), &index, &self.users], &argv)
            .await
    }

    pub(super) async fn load(&self, slot: &Slot) -> Result<Loaded, String> {
        match self.on_slot(LOAD, slot, &[self.max_sealed.as_bytes()]).await? {
            Reply::Nil => Ok(Loaded::Absent),
            Reply::Int(-1) => Ok(Loaded::TooLarge),
            Reply::Bulk(b) => Ok(Loaded::Sealed(b)),
            _ => Err(unexpected()),
        }
    }

    /// Keeps `sealed` in `slot`; with `expected`, only if the slot still holds those bytes.
    pub(super) async fn store(
        &self,
        slot: &Slot,
        sealed: &str,
        (ttl, expected): (Duration, Option<&[u8]>),
        opts: &Options,
    ) -> Result<(), StoreError> {
        let (ttl, users, per) = (ms(ttl), opts.max_users.to_string(), opts.max_per_user.to_string());
        let mut args: Vec<&[u8]> = vec![
            sealed.as_bytes(),
            ttl.as_bytes(),
            users.as_bytes(),
            per.as_bytes(),
        ];
        args.extend(expected);
        match self.on_slot(STORE, slot, &args).await.map_err(StoreError::Io)? {
            Reply::Int(1) => Ok(()),
            Reply::Int(0) => Err(StoreError::Changed),
            Reply::Int(-1) => Err(StoreError::TooManyUsers),
            Reply::Int(-2) => Err(StoreError::TooManyUpstreams),
            _ => Err(StoreError::Io(unexpected())),
        }
    }

    pub(super) async fn replace(&self, slot: &Slot, old: &[u8], new: &[u8]) -> Result<bool, String> {
        match self.eval(REPLACE, &[slot.id.as_bytes()], &[old, new]).await? {
            Reply::Int(n) => Ok(n == 1),
            _ => Err(unexpected()),
        }
    }

    pub(super) async fn discard(&self, slot: &Slot, old: &[u8]) -> Result<bool, String> {
        match self.on_slot(DISCARD, slot, &[old]).await? {
            Reply::Int(n) => Ok(n == 1),
            _ => Err(unexpected()),
        }
    }

    pub(super) async fn remove(&self, slot: &Slot) -> Result<Option<Vec<u8>>, String> {
        match self.on_slot(REMOVE, slot, &[self.max_sealed.as_bytes()]).await? {
            Reply::Bulk(b) => Ok(Some(b)),
            Reply::Nil | Reply::Int(-1) => Ok(None),
            _ => Err(unexpected()),
        }
    }

    pub(super) async fn remove_user(
        &self,
        user: &[u8; 32],
        opts: &Options,
    ) -> Result<Vec<(String, Vec<u8>)>, String> {
        let s = hex(user);
        let index = self.index_key(&s);
        let (budget, most) = (self.budget.to_string(), opts.max_per_user.to_string());
        let args: [&[u8]; 5] = [
            self.base.as_bytes(),
            s.as_bytes(),
            self.max_sealed.as_bytes(),
            budget.as_bytes(),
            most.as_bytes(),
        ];
        let Reply::Array(items) = self.eval(REMOVE_USER, &[&index, &self.users], &args).await? else {
            return Err(unexpected());
        };
        let mut out = Vec::with_capacity(items.len() / 2);
        let mut items = items.into_iter();
        while let (Some(Reply::Bulk(u)), Some(Reply::Bulk(v))) = (items.next(), items.next()) {
            // The upstream hash comes back as Redis holds it: only 64 hex digits name a slot.
            if u.len() == 64 && u.iter().all(u8::is_ascii_hexdigit) {
                let u = String::from_utf8_lossy(&u);
                out.push((format!("{}{u}:{s}", self.base), v));
            }
        }
        Ok(out)
    }

    pub(super) async fn count(&self, user: &[u8; 32]) -> Result<usize, String> {
        match self.eval(COUNT, &[&self.index_key(&hex(user))], &[]).await? {
            Reply::Int(n) => Ok(usize::try_from(n).unwrap_or(0)),
            _ => Err(unexpected()),
        }
    }

    fn lock_key(&self, slot: &Slot) -> Vec<u8> {
        let rest = slot.id.strip_prefix(&self.base).unwrap_or(&slot.id);
        format!("{}lock:{rest}", self.base).into_bytes()
    }

    /// Takes the refresh lock of `slot` as `owner` for `hold`; answers whether it was free.
    pub(super) async fn lock(&self, slot: &Slot, owner: &str, hold: Duration) -> Result<bool, String> {
        let key = self.lock_key(slot);
        let hold = ms(hold);
        let args: [&[u8]; 6] = [b"SET", &key, owner.as_bytes(), b"NX", b"PX", hold.as_bytes()];
        match self.redis.call(&args).await.map_err(|e| e.to_string())? {
            Reply::Status(s) if s == "OK" => Ok(true),
            Reply::Nil => Ok(false),
            Reply::Error(e) => Err(format!("redis: {e}")),
            _ => Err(unexpected()),
        }
    }

    /// Marks the sign-in state (or link) of nonce hash `hash` used for `ttl`; answers
    /// whether it was not yet.
    pub(super) async fn first_use(&self, hash: &str, ttl: Duration) -> Result<bool, String> {
        let key = format!("{}used:{hash}", self.base);
        let ttl = ms(ttl);
        let args: [&[u8]; 6] = [b"SET", key.as_bytes(), b"1", b"NX", b"PX", ttl.as_bytes()];
        match self.redis.call(&args).await.map_err(|e| e.to_string())? {
            Reply::Status(s) if s == "OK" => Ok(true),
            Reply::Nil => Ok(false),
            Reply::Error(e) => Err(format!("redis: {e}")),
            _ => Err(unexpected()),
        }
    }

    /// Releases the refresh lock of `slot` if `owner` still holds it; answers whether it did.
    pub(super) async fn unlock(&self, slot: &Slot, owner: &str) -> Result<bool, String> {
        match self
            .eval(UNLOCK, &[&self.lock_key(slot)], &[owner.as_bytes()])
            .await?
        {
            Reply::Int(n) => Ok(n == 1),
            _ => Err(unexpected()),
        }
    }
}

#[cfg(test)]
#[path = "redis_tests.rs"]
mod tests;
