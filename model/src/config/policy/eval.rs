//! Runs a compiled policy over borrowed facts: the caller, the tool and the arguments, read
//! in place (nothing is copied or converted; a rule without string concatenation allocates
//! nothing).
//!
//! Every step spends from a budget of [`MAX_COST`]; a policy that spends it all is a denial.
//! At `tools/list` time the arguments are unknown: a result that depends on them is
//! [`Verdict::Unknown`] (CEL's partial evaluation: `false && <unknown>` is still false).

use std::borrow::Cow;
use std::sync::LazyLock;

use serde_json::{Map, Value};

use super::expr::{Arith, Cmp, Lit, Node, Quant, StrTest, Var};
use crate::spec::access::Principal;

/// Steps one evaluation may take (each node, each element visited, each 32 bytes a string
/// operation reads): at a few nanoseconds a step, well under a millisecond.
pub const MAX_COST: u32 = 100_000;

/// What a tool is, for its policies.
#[derive(Debug, Clone, Copy)]
pub struct ToolFacts<'a> {
    /// Its name.
    pub name: &'a str,
    /// The upstream it is imported from (`""`: declared in the ToolSet).
    pub upstream: &'a str,
    /// Its annotations (`Value::Null` when it has none).
    pub annotations: &'a Value,
}

/// What a request is about, for its policies.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    /// A `tools/call` of this tool (also a `tools/list` entry: deciding whether it may be
    /// called).
    Tool(ToolFacts<'a>),
    /// A `resources/read` of this URI (as the client wrote it).
    Resource(&'a str),
    /// A `prompts/get` of this prompt.
    Prompt(&'a str),
}

impl<'a> From<ToolFacts<'a>> for Target<'a> {
    fn from(t: ToolFacts<'a>) -> Self {
        Self::Tool(t)
    }
}

impl Target<'_> {
    /// The request's method, as `request.method` reads it.
    pub fn method(&self) -> &'static str {
        match self {
            Self::Tool(_) => "tools/call",
            Self::Resource(_) => "resources/read",
            Self::Prompt(_) => "prompts/get",
        }
    }
}

/// What a policy decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// True.
    Allow,
    /// False.
    Deny,
    /// It could not be decided: an error (a missing field, a wrong type), or a result that
    /// is not a bool. A denial.
    Error,
    /// It ran out of its budget. A denial.
    TooCostly,
    /// It depends on the arguments, which are not known (`tools/list`).
    Unknown,
}

static EMPTY: LazyLock<Value> = LazyLock::new(|| Value::Object(Map::new()));

/// Why evaluation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Error,
    Unknown,
    Budget,
}

#[derive(Debug, Clone)]
enum V<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Double(f64),
    Str(Cow<'a, str>),
    /// A JSON array or object.
    Json(&'a Value),
    Strs(&'a [Box<str>]),
    Lits(&'a [Lit]),
}

type R<'a> = Result<V<'a>, Stop>;

/// A comprehension variable's binding, linked to the enclosing ones on the stack.
struct Scope<'s, 'a> {
    value: V<'a>,
    up: Option<&'s Scope<'s, 'a>>,
}

struct Env<'a> {
    caller: Option<&'a Principal>,
    claims: &'a Value,
    target: Target<'a>,
    args: Option<&'a Value>,
    steps: Option<&'a Value>,
    budget: u32,
}

/// Evaluates `root` on a request about `target`; `args` is `None` at `tools/list` time.
pub fn evaluate(
    root: &Node,
    caller: Option<&Principal>,
    target: Target<'_>,
    args: Option<&Value>,
) -> Verdict {
    evaluate_with(root, caller, target, args, None)
}

/// [`evaluate`] with a pipeline's finished `steps` (a step's `when`).
pub fn evaluate_with(
    root: &Node,
    caller: Option<&Principal>,
    target: Target<'_>,
    args: Option<&Value>,
    steps: Option<&Value>,
) -> Verdict {
    let claims = caller
        .and_then(|c| c.credential.as_deref())
        .map(crate::spec::caller::Credential::claims)
        .filter(|c| c.is_object())
        .unwrap_or(&EMPTY);
    let mut env = Env {
        caller,
        claims,
        target,
        args,
        steps,
        budget: MAX_COST,
    };
    match env.eval(root, None) {
        Ok(V::Bool(true)) => Verdict::Allow,
        Ok(V::Bool(false)) => Verdict::Deny,
        Ok(_) | Err(Stop::Error) => Verdict::Error,
        Err(Stop::Unknown) => Verdict::Unknown,
        Err(Stop::Budget) => Verdict::TooCostly,
    }
}

fn json(v: &Value) -> V<'_> {
    match v {
        Value::Null => V::Null,
        Value::Bool(b) => V::Bool(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                V::Int(i)
            } else if let Some(u) = n.as_u64() {
                V::Uint(u)
            } else {
                V::Double(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Value::String(s) => V::Str(Cow::Borrowed(s)),
        Value::Array(_) | Value::Object(_) => V::Json(v),
    }
}

fn lit(l: &Lit) -> V<'_> {
    match l {
        Lit::Null => V::Null,
        Lit::Bool(b) => V::Bool(*b),
        Lit::Int(i) => V::Int(*i),
        Lit::Uint(u) => V::Uint(*u),
        Lit::Double(d) => V::Double(*d),
        Lit::Str(s) => V::Str(Cow::Borrowed(s)),
    }
}

fn str_claim<'a>(claims: &'a Value, name: &str) -> &'a str {
    claims.get(name).and_then(Value::as_str).unwrap_or("")
}

/// `a` and `b` as two of one numeric kind, compared.
fn num_cmp(a: &V<'_>, b: &V<'_>) -> Option<std::cmp::Ordering> {
    match (a, b) {
        (V::Int(x), V::Int(y)) => Some(x.cmp(y)),
        (V::Uint(x), V::Uint(y)) => Some(x.cmp(y)),
        (V::Int(x), V::Uint(y)) => Some(if *x < 0 {
            std::cmp::Ordering::Less
        } else {
            (*x as u64).cmp(y)
        }),
        (V::Uint(x), V::Int(y)) => Some(if *y < 0 {
            std::cmp::Ordering::Greater
        } else {
            x.cmp(&(*y as u64))
        }),
        (V::Double(x), _) => x.partial_cmp(&as_f64(b)?),
        (_, V::Double(y)) => as_f64(a)?.partial_cmp(y),
        _ => None,
    }
}

#[allow(clippy::cast_precision_loss)] // CEL compares mixed numbers as doubles
fn as_f64(v: &V<'_>) -> Option<f64> {
    match v {
        V::Int(i) => Some(*i as f64),
        V::Uint(u) => Some(*u as f64),
        V::Double(d) => Some(*d),
        _ => None,
    }
}

impl<'a> Env<'a> {
    fn spend(&mut self, n: usize) -> Result<(), Stop> {
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        if n > self.budget {
            self.budget = 0;
            return Err(Stop::Budget);
        }
        self.budget -= n;
        Ok(())
    }

    fn var(&self, v: Var, scope: Option<&Scope<'_, 'a>>) -> R<'a> {
        let c = self.caller;
        Ok(match v {
            Var::Subject => V::Str(Cow::Borrowed(str_claim(self.claims, "sub"))),
            Var::Issuer => V::Str(Cow::Borrowed(str_claim(self.claims, "iss"))),
            Var::ClientId => V::Str(Cow::Borrowed(match str_claim(self.claims, "client_id") {
                "" => str_claim(self.claims, "azp"),
                id => id,
            })),
            Var::Claims => V::Json(self.claims),
            Var::Groups => V::Strs(c.map_or(&[], |c| &c.groups)),
            Var::Scopes => V::Strs(c.map_or(&[], |c| &c.scopes)),
            // Another request's `tool` is empty, like a caller without credentials.
            Var::ToolName => V::Str(Cow::Borrowed(match self.target {
                Target::Tool(t) => t.name,
                _ => "",
            })),
            Var::ToolUpstream => V::Str(Cow::Borrowed(match self.target {
                Target::Tool(t) => t.upstream,
                _ => "",
            })),
            Var::Annotations => match self.target {
                Target::Tool(ToolFacts {
                    annotations: a @ Value::Object(_),
                    ..
                }) => V::Json(a),
                _ => V::Json(&EMPTY),
            },
            Var::Method => V::Str(Cow::Borrowed(self.target.method())),
            Var::ResourceUri => V::Str(Cow::Borrowed(match self.target {
                Target::Resource(u) => u,
                _ => "",
            })),
            Var::PromptName => V::Str(Cow::Borrowed(match self.target {
                Target::Prompt(n) => n,
                _ => "",
            })),
            Var::Args => match self.args {
                Some(a) => V::Json(a),
                None => return Err(Stop::Unknown),
            },
            Var::Steps => match self.steps {
                Some(s) => V::Json(s),
                None => return Err(Stop::Unknown),
            },
            Var::Local(up) => {
                let mut s = scope;
                for _ in 0..up {
                    s = s.and_then(|s| s.up);
                }
                return s.map(|s| s.value.clone()).ok_or(Stop::Error);
            }
        })
    }

    // Long: one arm per node kind, each short.
    fn eval(&mut self, n: &'a Node, scope: Option<&Scope<'_, 'a>>) -> R<'a> {
        self.spend(1)?;
        match n {
            Node::Lit(l) => Ok(lit(l)),
            Node::List(l) => Ok(V::Lits(l)),
            Node::Var(v) => self.var(*v, scope),
            Node::Select(x, field) => match self.eval(x, scope)? {
                V::Json(Value::Object(m)) => m.get(&**field).map(json).ok_or(Stop::Error),
                _ => Err(Stop::Error),
            },
            Node::Has(x, field) => match self.eval(x, scope)? {
                V::Json(Value::Object(m)) => Ok(V::Bool(m.contains_key(&**field))),
                _ => Err(Stop::Error),
            },
            Node::Index(x, i) => {
                let x = self.eval(x, scope)?;
                let i = self.eval(i, scope)?;
                index(&x, &i)
            }
            Node::Not(x) => match self.eval(x, scope)? {
                V::Bool(b) => Ok(V::Bool(!b)),
                _ => Err(Stop::Error),
            },
            Node::Neg(x) => match self.eval(x, scope)? {
                V::Int(i) => i.checked_neg().map(V::Int).ok_or(Stop::Error),
                V::Double(d) => Ok(V::Double(-d)),
                _ => Err(Stop::Error),
            },
            Node::And(l, r) => self.logic(l, r, false, scope),
            Node::Or(l, r) => self.logic(l, r, true, scope),
            Node::Cond(parts) => {
                let [c, a, z] = &**parts;
                match self.eval(c, scope)? {
                    V::Bool(true) => self.eval(a, scope),
                    V::Bool(false) => self.eval(z, scope),
                    _ => Err(Stop::Error),
                }
            }
            Node::Cmp(op, l, r) => {
                let l = self.eval(l, scope)?;
                let r = self.eval(r, scope)?;
                self.compare(*op, &l, &r).map(V::Bool)
            }
            Node::Arith(op, l, r) => {
                let l = self.eval(l, scope)?;
                let r = self.eval(r, scope)?;
                self.arith(*op, l, r)
            }
            Node::In(x, coll) => {
                let x = self.eval(x, scope)?;
                let coll = self.eval(coll, scope)?;
                self.contains(&coll, &x).map(V::Bool)
            }
            Node::Size(x) => {
                let n = match self.eval(x, scope)? {
                    V::Str(s) => {
                        self.spend(s.len() / 32)?;
                        s.chars().count()
                    }
                    V::Json(Value::Array(a)) => a.len(),
                    V::Json(Value::Object(m)) => m.len(),
                    V::Strs(s) => s.len(),
                    V::Lits(l) => l.len(),
                    _ => return Err(Stop::Error),
                };
                Ok(V::Int(i64::try_from(n).unwrap_or(i64::MAX)))
            }
            Node::Str(op, s, x) => {
                let (V::Str(s), V::Str(x)) = (self.eval(s, scope)?, self.eval(x, scope)?) else {
                    return Err(Stop::Error);
                };
                self.spend(s.len() / 32)?;
                Ok(V::Bool(match op {
                    StrTest::StartsWith => s.starts_with(&*x),
                    StrTest::EndsWith => s.ends_with(&*x),
                    StrTest::Contains => s.contains(&*x),
                }))
            }
            Node::Matches(s, re) => {
                let V::Str(s) = self.eval(s, scope)? else {
                    return Err(Stop::Error);
                };
                self.spend(s.len() / 8)?;
                Ok(V::Bool(re.is_match(&s)))
            }
            Node::Quant(q, range, body) => self.quant(*q, range, body, scope),
        }
    }

    /// A side of `&&`/`||`: its bool, or why it has none (running out of budget stops
    /// everything).
    fn side(&mut self, n: &'a Node, scope: Option<&Scope<'_, 'a>>) -> Result<Result<bool, Stop>, Stop> {
        match self.eval(n, scope) {
            Ok(V::Bool(b)) => Ok(Ok(b)),
            Ok(_) => Ok(Err(Stop::Error)),
            Err(Stop::Budget) => Err(Stop::Budget),
            Err(e) => Ok(Err(e)),
        }
    }

    /// `&&` (`or` false) and `||` (`or` true), commutative over errors and unknowns as CEL
    /// defines them: a deciding side wins whatever the other is.
    fn logic(&mut self, l: &'a Node, r: &'a Node, or: bool, scope: Option<&Scope<'_, 'a>>) -> R<'a> {
        let a = self.side(l, scope)?;
        if a == Ok(or) {
            return Ok(V::Bool(or));
        }
        let z = self.side(r, scope)?;
        Self::combine(a, z, or)
    }

    fn combine(a: Result<bool, Stop>, z: Result<bool, Stop>, or: bool) -> R<'a> {
        match (a, z) {
            (Ok(x), _) | (_, Ok(x)) if x == or => Ok(V::Bool(or)),
            (Ok(_), Ok(_)) => Ok(V::Bool(!or)),
            (Err(Stop::Unknown), _) | (_, Err(Stop::Unknown)) => Err(Stop::Unknown),
            _ => Err(Stop::Error),
        }
    }

    /// `all` / `exists` / `exists_one` over a list's elements or a map's keys.
    fn quant(&mut self, q: Quant, range: &'a Node, body: &'a Node, scope: Option<&Scope<'_, 'a>>) -> R<'a> {
        let range = self.eval(range, scope)?;
        // all: true && ...; exists: false || ...
        let mut acc: Result<bool, Stop> = Ok(q == Quant::All);
        let mut count = 0u32;
        let mut step = |env: &mut Self, item: V<'a>| -> Result<bool, Stop> {
            env.spend(1)?;
            let inner = Scope {
                value: item,
                up: scope,
            };
            let r = env.side(body, Some(&inner))?;
            match q {
                Quant::All | Quant::Exists => {
                    acc = match Self::combine(acc, r, q == Quant::Exists) {
                        Ok(V::Bool(b)) => Ok(b),
                        Ok(_) => Err(Stop::Error),
                        Err(e) => Err(e),
                    };
                    // Decided: all found a false, exists found a true.
                    Ok(acc == Ok(q == Quant::Exists))
                }
                Quant::ExistsOne => {
                    match r {
                        Ok(true) => count += 1,
                        Ok(false) => {}
                        Err(e) => acc = Err(e),
                    }
                    Ok(acc.is_err())
                }
            }
        };
        match range {
            V::Json(Value::Array(items)) => {
                for x in items {
                    if step(self, json(x))? {
                        break;
                    }
                }
            }
            V::Json(Value::Object(m)) => {
                for k in m.keys() {
                    if step(self, V::Str(Cow::Borrowed(k)))? {
                        break;
                    }
                }
            }
            V::Strs(items) => {
                for x in items {
                    if step(self, V::Str(Cow::Borrowed(x)))? {
                        break;
                    }
                }
            }
            V::Lits(items) => {
                for x in items {
                    if step(self, lit(x))? {
                        break;
                    }
                }
            }
            _ => return Err(Stop::Error),
        }
        match q {
            Quant::ExistsOne => acc.map(|_| V::Bool(count == 1)),
            _ => acc.map(V::Bool),
        }
    }

    /// Equality as CEL defines it: numbers across kinds by value, lists element by
    /// element, maps key by key; values of different kinds are unequal.
    fn equal(&mut self, a: &V<'_>, b: &V<'_>) -> Result<bool, Stop> {
        self.spend(1)?;
        Ok(match (a, b) {
            (V::Null, V::Null) => true,
            (V::Bool(x), V::Bool(y)) => x == y,
            (V::Str(x), V::Str(y)) => {
                self.spend(x.len().min(y.len()) / 32)?;
                x == y
            }
            (V::Json(Value::Object(x)), V::Json(Value::Object(y))) => {
                if x.len() != y.len() {
                    return Ok(false);
                }
                for (k, v) in x {
                    let Some(w) = y.get(k) else { return Ok(false) };
                    if !self.equal(&json(v), &json(w))? {
                        return Ok(false);
                    }
                }
                true
            }
            _ if is_list(a) && is_list(b) => {
                if list_len(a) != list_len(b) {
                    return Ok(false);
                }
                for i in 0..list_len(a) {
                    let (x, y) = (list_at(a, i), list_at(b, i));
                    if let (Some(x), Some(y)) = (x, y)
                        && !self.equal(&x, &y)?
                    {
                        return Ok(false);
                    }
                }
                true
            }
            _ => num_cmp(a, b) == Some(std::cmp::Ordering::Equal),
        })
    }

    fn compare(&mut self, op: Cmp, a: &V<'_>, b: &V<'_>) -> Result<bool, Stop> {
        use std::cmp::Ordering::{Greater, Less};
        match op {
            Cmp::Eq => return self.equal(a, b),
            Cmp::Ne => return self.equal(a, b).map(|e| !e),
            _ => {}
        }
        let ord = match (a, b) {
            (V::Str(x), V::Str(y)) => {
                self.spend(x.len().min(y.len()) / 32)?;
                Some(x.cmp(y))
            }
            _ => num_cmp(a, b),
        };
        let ord = ord.ok_or(Stop::Error)?;
        Ok(match op {
            Cmp::Lt => ord == Less,
            Cmp::Le => ord != Greater,
            Cmp::Gt => ord == Greater,
            _ => ord != Less,
        })
    }

    fn arith(&mut self, op: Arith, a: V<'a>, b: V<'a>) -> R<'a> {
        match (a, b) {
            (V::Str(x), V::Str(y)) if op == Arith::Add => {
                self.spend((x.len() + y.len()) / 32)?;
                Ok(V::Str(Cow::Owned([&*x, &*y].concat())))
            }
            (V::Int(x), V::Int(y)) => match op {
                Arith::Add => x.checked_add(y),
                Arith::Sub => x.checked_sub(y),
                Arith::Mul => x.checked_mul(y),
                Arith::Div => x.checked_div(y),
                Arith::Rem => x.checked_rem(y),
            }
            .map(V::Int)
            .ok_or(Stop::Error),
            (V::Uint(x), V::Uint(y)) => match op {
                Arith::Add => x.checked_add(y),
                Arith::Sub => x.checked_sub(y),
                Arith::Mul => x.checked_mul(y),
                Arith::Div => x.checked_div(y),
                Arith::Rem => x.checked_rem(y),
            }
            .map(V::Uint)
            .ok_or(Stop::Error),
            (V::Double(x), V::Double(y)) => Ok(V::Double(match op {
                Arith::Add => x + y,
                Arith::Sub => x - y,
                Arith::Mul => x * y,
                Arith::Div => x / y,
                Arith::Rem => return Err(Stop::Error),
            })),
            _ => Err(Stop::Error),
        }
    }

    /// `x in coll`.
    fn contains(&mut self, coll: &V<'_>, x: &V<'_>) -> Result<bool, Stop> {
        match coll {
            V::Json(Value::Object(m)) => match x {
                V::Str(k) => Ok(m.contains_key(&**k)),
                _ => Err(Stop::Error),
            },
            V::Strs(items) => {
                let V::Str(x) = x else { return Err(Stop::Error) };
                self.spend(items.len())?;
                Ok(items.iter().any(|i| **i == **x))
            }
            _ if is_list(coll) => {
                for i in 0..list_len(coll) {
                    if let Some(item) = list_at(coll, i)
                        && self.equal(&item, x)?
                    {
                        return Ok(true);
                    }
                }
                Ok(false)
            }
            _ => Err(Stop::Error),
        }
    }
}

fn is_list(v: &V<'_>) -> bool {
    matches!(v, V::Json(Value::Array(_)) | V::Strs(_) | V::Lits(_))
}

fn list_len(v: &V<'_>) -> usize {
    match v {
        V::Json(Value::Array(a)) => a.len(),
        V::Strs(s) => s.len(),
        V::Lits(l) => l.len(),
        _ => 0,
    }
}

fn list_at<'a>(v: &V<'a>, i: usize) -> Option<V<'a>> {
    match v {
        V::Json(Value::Array(a)) => a.get(i).map(json),
        V::Strs(s) => s.get(i).map(|s| V::Str(Cow::Borrowed(&**s))),
        V::Lits(l) => l.get(i).map(lit),
        _ => None,
    }
}

/// `x[i]`: a list by a non-negative integer, a map by a string.
fn index<'a>(x: &V<'a>, i: &V<'_>) -> R<'a> {
    match (x, i) {
        (V::Json(Value::Object(m)), V::Str(k)) => m.get(&**k).map(json).ok_or(Stop::Error),
        (_, V::Int(_) | V::Uint(_)) if is_list(x) => {
            let n = match i {
                V::Int(n) => usize::try_from(*n).ok(),
                V::Uint(n) => usize::try_from(*n).ok(),
                _ => None,
            };
            n.and_then(|n| list_at(x, n)).ok_or(Stop::Error)
        }
        _ => Err(Stop::Error),
    }
}
