//! The policy compiler: a CEL expression, parsed by the `cel` crate, checked against the
//! variables a policy may read and compiled into a small tree that [`super::eval`] runs.
//!
//! The subset (anything else is refused at load, naming what):
//! - variables `caller` (`subject`, `issuer`, `clientId`, `claims`, `groups`, `scopes`),
//!   `tool` (`name`, `upstream`, `annotations`) and `args`;
//! - literals (null, bool, int, uint, double, string) and lists of literals;
//! - `!`, `-`, `&&`, `||`, `?:`, `==`, `!=`, `<`, `<=`, `>`, `>=`, `+`, `-`, `*`, `/`, `%`,
//!   `in`, `[]`, field selection and `has()`;
//! - `size()`, `startsWith()`, `endsWith()`, `contains()`, `matches()` (a literal pattern,
//!   compiled at load), and the macros `all`, `exists` and `exists_one`, nested at most
//!   [`MAX_COMPREHENSION_NESTING`] deep.
//!
//! Types are checked where they are known (the caller's and the tool's fields, literals);
//! `args`, `claims` and `annotations` hold JSON, whose values are `dyn` until run.

use cel::common::ast::{CallExpr, ComprehensionExpr, Expr, IdedExpr, LiteralValue, operators};
use regex::{Regex, RegexBuilder};

/// Longest expression, in bytes.
pub const MAX_EXPRESSION_BYTES: usize = 2048;
/// Deepest nesting of brackets in the source, and of the compiled tree.
pub const MAX_DEPTH: usize = 24;
/// Most nodes of a compiled expression.
pub const MAX_NODES: usize = 256;
/// Deepest nesting of `all`/`exists`/`exists_one`.
pub const MAX_COMPREHENSION_NESTING: usize = 2;
/// Longest `matches()` pattern, and the compiled size it may take.
pub const MAX_PATTERN_BYTES: usize = 256;
const MAX_REGEX_BYTES: usize = 64 * 1024;
/// Longest string literal.
pub const MAX_LITERAL_BYTES: usize = 512;
/// Most elements of a list literal.
pub const MAX_LIST_LITERAL: usize = 64;

/// A value known at load.
#[derive(Debug, Clone, PartialEq)]
pub enum Lit {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A signed integer.
    Int(i64),
    /// An unsigned integer (`1u`).
    Uint(u64),
    /// A double.
    Double(f64),
    /// A string.
    Str(Box<str>),
}

/// What a variable path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Var {
    /// `caller.subject`: the token's `sub`.
    Subject,
    /// `caller.issuer`: the token's `iss`.
    Issuer,
    /// `caller.clientId`: the token's `client_id`, or `azp`.
    ClientId,
    /// `caller.claims`: every claim of the token.
    Claims,
    /// `caller.groups`.
    Groups,
    /// `caller.scopes`.
    Scopes,
    /// `tool.name`.
    ToolName,
    /// `tool.upstream`: the upstream the tool is imported from, `""` for a declared tool.
    ToolUpstream,
    /// `tool.annotations`.
    Annotations,
    /// `request.method`: `tools/call`, `resources/read` or `prompts/get`.
    Method,
    /// `resource.uri`: the URI a `resources/read` asks for, `""` for any other request.
    ResourceUri,
    /// `prompt.name`: the prompt a `prompts/get` asks for, `""` for any other request.
    PromptName,
    /// `args`: the call's arguments.
    Args,
    /// `steps`: the results of a pipeline's finished steps (a step's `when` only).
    Steps,
    /// A comprehension's variable, 0 the innermost.
    Local(u8),
}

/// Comparison operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

/// Arithmetic operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arith {
    /// `+` (numbers, and strings: concatenation)
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/`
    Div,
    /// `%`
    Rem,
}

/// String tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrTest {
    /// `s.startsWith(x)`
    StartsWith,
    /// `s.endsWith(x)`
    EndsWith,
    /// `s.contains(x)`
    Contains,
}

/// The comprehension macros.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quant {
    /// `all`
    All,
    /// `exists`
    Exists,
    /// `exists_one`
    ExistsOne,
}

/// A compiled expression.
#[derive(Debug)]
pub enum Node {
    /// A literal.
    Lit(Lit),
    /// A list literal.
    List(Box<[Lit]>),
    /// A variable.
    Var(Var),
    /// `x.field` on a JSON object.
    Select(Box<Node>, Box<str>),
    /// `has(x.field)`.
    Has(Box<Node>, Box<str>),
    /// `x[i]`.
    Index(Box<Node>, Box<Node>),
    /// `!x`.
    Not(Box<Node>),
    /// `-x`.
    Neg(Box<Node>),
    /// `a && b`.
    And(Box<Node>, Box<Node>),
    /// `a || b`.
    Or(Box<Node>, Box<Node>),
    /// `c ? a : b`.
    Cond(Box<[Node; 3]>),
    /// A comparison.
    Cmp(Cmp, Box<Node>, Box<Node>),
    /// Arithmetic.
    Arith(Arith, Box<Node>, Box<Node>),
    /// `x in y`.
    In(Box<Node>, Box<Node>),
    /// `size(x)`.
    Size(Box<Node>),
    /// A string test.
    Str(StrTest, Box<Node>, Box<Node>),
    /// `s.matches('literal')`.
    Matches(Box<Node>, Box<Regex>),
    /// `range.all(v, body)` and its kin.
    Quant(Quant, Box<Node>, Box<Node>),
}

/// The static type of an expression, where it is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    Bool,
    Int,
    Uint,
    Double,
    Str,
    Null,
    /// A list of strings (`caller.groups`).
    StrList,
    /// A list of anything.
    List,
    /// A JSON object (`args`, `claims`, `annotations`).
    Map,
    /// Known only when run.
    Dyn,
    /// The `caller`, `tool`, `request`, `resource` and `prompt` objects: only their fields
    /// may be used.
    Caller,
    Tool,
    Request,
    Resource,
    Prompt,
}

impl Ty {
    fn name(self) -> &'static str {
        match self {
            Ty::Bool => "bool",
            Ty::Int => "int",
            Ty::Uint => "uint",
            Ty::Double => "double",
            Ty::Str => "string",
            Ty::Null => "null",
            Ty::StrList => "list(string)",
            Ty::List => "list",
            Ty::Map => "map",
            Ty::Dyn => "dyn",
            Ty::Caller => "caller",
            Ty::Tool => "tool",
            Ty::Request => "request",
            Ty::Resource => "resource",
            Ty::Prompt => "prompt",
        }
    }
    fn numeric(self) -> bool {
        matches!(self, Ty::Int | Ty::Uint | Ty::Double | Ty::Dyn)
    }
    fn is(self, want: Ty) -> bool {
        self == want || self == Ty::Dyn
    }
}

/// A compiled policy expression and what it reads.
#[derive(Debug)]
pub struct Program {
    /// The tree.
    pub root: Node,
    /// Whether it reads `args` (at `tools/list` time there are none).
    pub reads_args: bool,
}

/// Compiles `src`.
///
/// # Errors
/// Why it is refused: too large or deep, a syntax error, an unknown variable or function, a
/// type mismatch, or a result that cannot be a bool.
pub fn compile(src: &str) -> Result<Program, String> {
    compile_with(src, false)
}

/// Compiles a pipeline step's `when`: a policy's language, with `steps` (the results of the
/// steps finished before it) besides `caller`, `tool` and `args`.
///
/// # Errors
/// As [`compile`].
pub fn compile_condition(src: &str) -> Result<Program, String> {
    compile_with(src, true)
}

fn compile_with(src: &str, steps: bool) -> Result<Program, String> {
    super::scan::prescan(src, MAX_EXPRESSION_BYTES, MAX_DEPTH)?;
    let ast = cel::parser::Parser::new()
        .max_recursion_depth(u16::try_from(MAX_DEPTH * 2).unwrap_or(u16::MAX))
        .error_recovery_limit(4)
        .parse(src)
        .map_err(|e| syntax(&e.to_string()))?;
    let mut c = Checker {
        locals: Vec::new(),
        nodes: 0,
        reads_args: false,
        steps,
    };
    let (root, ty) = c.expr(&ast, 0)?;
    if !ty.is(Ty::Bool) {
        return Err(format!("must be a bool expression, but is of type {}", ty.name()));
    }
    Ok(Program {
        root,
        reads_args: c.reads_args,
    })
}

/// The parser's message, shortened to its first line (its snippet quotes the source).
fn syntax(e: &str) -> String {
    let first = e.lines().next().unwrap_or("syntax error");
    let first = first.strip_prefix("ERROR: <input>:").unwrap_or(first);
    let mut m = format!("syntax error at {first}");
    if m.len() > 200 {
        let mut end = 200;
        while !m.is_char_boundary(end) {
            end -= 1;
        }
        m.truncate(end);
    }
    m
}

struct Checker {
    /// Comprehension variables in scope, innermost last.
    locals: Vec<String>,
    nodes: usize,
    reads_args: bool,
    /// `steps` may be read (a pipeline step's condition).
    steps: bool,
}

type Out = Result<(Node, Ty), String>;

fn b(n: Node) -> Box<Node> {
    Box::new(n)
}

impl Checker {
    // Long: one arm per kind of CEL expression, each short.
    fn expr(&mut self, e: &IdedExpr, depth: usize) -> Out {
        if depth > MAX_DEPTH {
            return Err(format!("nests deeper than {MAX_DEPTH} levels"));
        }
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            return Err(format!("has more than {MAX_NODES} terms"));
        }
        match &e.expr {
            Expr::Literal(l) => lit(l).map(|(l, t)| (Node::Lit(l), t)),
            Expr::Ident(name) => self.ident(name),
            Expr::Select(s) => {
                if s.test {
                    let (operand, ty) = self.expr(&s.operand, depth + 1)?;
                    if !ty.is(Ty::Map) {
                        return Err(format!("has() needs a field of a map, not of {}", ty.name()));
                    }
                    return Ok((Node::Has(b(operand), s.field.as_str().into()), Ty::Bool));
                }
                self.select(&s.operand, &s.field, depth)
            }
            Expr::Call(call) => self.call(call, depth),
            Expr::List(l) => {
                if l.elements.len() > MAX_LIST_LITERAL {
                    return Err(format!("a list literal has at most {MAX_LIST_LITERAL} elements"));
                }
                let mut out = Vec::with_capacity(l.elements.len());
                for el in &l.elements {
                    match &el.expr {
                        Expr::Literal(x) => out.push(lit(x)?.0),
                        _ => return Err("a list literal may hold literals only".to_owned()),
                    }
                }
                self.nodes += out.len();
                Ok((Node::List(out.into()), Ty::List))
            }
            Expr::Comprehension(c) => self.comprehension(c, depth),
            Expr::Map(_) => Err("map literals are not supported".to_owned()),
            Expr::Struct(_) => Err("message literals are not supported".to_owned()),
            Expr::Unspecified => Err("unsupported expression".to_owned()),
        }
    }

    fn ident(&mut self, name: &str) -> Out {
        if let Some(pos) = self.locals.iter().rposition(|l| l == name) {
            let up = self.locals.len() - 1 - pos;
            return Ok((
                Node::Var(Var::Local(u8::try_from(up).unwrap_or(u8::MAX))),
                Ty::Dyn,
            ));
        }
        match name {
            "caller" => Ok((Node::Lit(Lit::Null), Ty::Caller)),
            "tool" => Ok((Node::Lit(Lit::Null), Ty::Tool)),
            "request" => Ok((Node::Lit(Lit::Null), Ty::Request)),
            "resource" => Ok((Node::Lit(Lit::Null), Ty::Resource)),
            "prompt" => Ok((Node::Lit(Lit::Null), Ty::Prompt)),
            "args" => {
                self.reads_args = true;
                Ok((Node::Var(Var::Args), Ty::Map))
            }
            "steps" if self.steps => Ok((Node::Var(Var::Steps), Ty::Map)),
            _ => Err(format!(
                "unknown variable `{}` (use caller, tool, request, resource, prompt, args{})",
                clip(name),
                if self.steps { " or steps" } else { "" }
            )),
        }
    }

    fn select(&mut self, operand: &IdedExpr, field: &str, depth: usize) -> Out {
        let (node, ty) = self.expr(operand, depth + 1)?;
        let var = |v: Var, t: Ty| Ok((Node::Var(v), t));
        match ty {
            Ty::Caller => match field {
                "subject" => var(Var::Subject, Ty::Str),
                "issuer" => var(Var::Issuer, Ty::Str),
                "clientId" => var(Var::ClientId, Ty::Str),
                "claims" => var(Var::Claims, Ty::Map),
                "groups" => var(Var::Groups, Ty::StrList),
                "scopes" => var(Var::Scopes, Ty::StrList),
                _ => Err(format!(
                    "unknown field `caller.{}` (subject, issuer, clientId, claims, groups, scopes)",
                    clip(field)
                )),
            },
            Ty::Tool => match field {
                "name" => var(Var::ToolName, Ty::Str),
                "upstream" => var(Var::ToolUpstream, Ty::Str),
                "annotations" => var(Var::Annotations, Ty::Map),
                _ => Err(format!(
                    "unknown field `tool.{}` (name, upstream, annotations)",
                    clip(field)
                )),
            },
            Ty::Request => match field {
                "method" => var(Var::Method, Ty::Str),
                _ => Err(format!("unknown field `request.{}` (method)", clip(field))),
            },
            Ty::Resource => match field {
                "uri" => var(Var::ResourceUri, Ty::Str),
                _ => Err(format!("unknown field `resource.{}` (uri)", clip(field))),
            },
            Ty::Prompt => match field {
                "name" => var(Var::PromptName, Ty::Str),
                _ => Err(format!("unknown field `prompt.{}` (name)", clip(field))),
            },
            Ty::Map | Ty::Dyn => Ok((Node::Select(b(node), field.into()), Ty::Dyn)),
            other => Err(format!("`.{}` selects a field of {}", clip(field), other.name())),
        }
    }

    // Long: the table of operators and functions, an arm each.
    fn call(&mut self, c: &CallExpr, depth: usize) -> Out {
        let d = depth + 1;
        let name = c.func_name.as_str();
        match (name, &c.target, c.args.as_slice()) {
            (operators::LOGICAL_NOT, None, [x]) => {
                let (x, _) = self.typed(x, d, Ty::Bool, "!")?;
                Ok((Node::Not(b(x)), Ty::Bool))
            }
            (operators::NEGATE, None, [x]) => {
                let (x, t) = self.expr(x, d)?;
                if !matches!(t, Ty::Int | Ty::Double | Ty::Dyn) {
                    return Err(format!("`-` needs an int or a double, not {}", t.name()));
                }
                Ok((Node::Neg(b(x)), t))
            }
            (operators::LOGICAL_AND | operators::LOGICAL_OR, None, [l, r]) => {
                let op = if name == operators::LOGICAL_AND {
                    "&&"
                } else {
                    "||"
                };
                let (l, _) = self.typed(l, d, Ty::Bool, op)?;
                let (r, _) = self.typed(r, d, Ty::Bool, op)?;
                let n = if name == operators::LOGICAL_AND {
                    Node::And(b(l), b(r))
                } else {
                    Node::Or(b(l), b(r))
                };
                Ok((n, Ty::Bool))
            }
            (operators::CONDITIONAL, None, [c0, a, z]) => {
                let (c0, _) = self.typed(c0, d, Ty::Bool, "?:")?;
                let (a, ta) = self.value(a, d)?;
                let (z, tz) = self.value(z, d)?;
                let t = if ta == tz { ta } else { Ty::Dyn };
                Ok((Node::Cond(Box::new([c0, a, z])), t))
            }
            (
                operators::EQUALS
                | operators::NOT_EQUALS
                | operators::LESS
                | operators::LESS_EQUALS
                | operators::GREATER
                | operators::GREATER_EQUALS,
                None,
                [l, r],
            ) => self.compare(name, l, r, d),
            (
                operators::ADD
                | operators::SUBSTRACT
                | operators::MULTIPLY
                | operators::DIVIDE
                | operators::MODULO,
                None,
                [l, r],
            ) => self.arith(name, l, r, d),
            (operators::IN, None, [x, coll]) => {
                let (x, tx) = self.value(x, d)?;
                let (coll, tc) = self.expr(coll, d)?;
                match tc {
                    Ty::StrList if !tx.is(Ty::Str) => Err(format!(
                        "`in` a list of strings needs a string, not {}",
                        tx.name()
                    )),
                    Ty::Map if !tx.is(Ty::Str) => {
                        Err(format!("`in` a map needs a string key, not {}", tx.name()))
                    }
                    Ty::StrList | Ty::List | Ty::Map | Ty::Dyn => Ok((Node::In(b(x), b(coll)), Ty::Bool)),
                    other => Err(format!("`in` needs a list or a map, not {}", other.name())),
                }
            }
            (operators::INDEX, None, [x, i]) => {
                let (x, tx) = self.expr(x, d)?;
                let (i, ti) = self.value(i, d)?;
                let t = match tx {
                    Ty::StrList | Ty::List if ti.is(Ty::Int) || ti == Ty::Uint => {
                        if tx == Ty::StrList {
                            Ty::Str
                        } else {
                            Ty::Dyn
                        }
                    }
                    Ty::Map if ti.is(Ty::Str) => Ty::Dyn,
                    Ty::Dyn => Ty::Dyn,
                    _ => {
                        return Err(format!("cannot index {} with {}", tx.name(), ti.name()));
                    }
                };
                Ok((Node::Index(b(x), b(i)), t))
            }
            ("size", None, [_]) | ("size", Some(_), []) => {
                let x = c.target.as_deref().unwrap_or_else(|| &c.args[0]);
                let (x, t) = self.expr(x, d)?;
                if !matches!(t, Ty::Str | Ty::StrList | Ty::List | Ty::Map | Ty::Dyn) {
                    return Err(format!("size() of {}", t.name()));
                }
                Ok((Node::Size(b(x)), Ty::Int))
            }
            ("startsWith" | "endsWith" | "contains", Some(s), [x]) => {
                let (s, _) = self.typed(s, d, Ty::Str, name)?;
                let (x, _) = self.typed(x, d, Ty::Str, name)?;
                let op = match name {
                    "startsWith" => StrTest::StartsWith,
                    "endsWith" => StrTest::EndsWith,
                    _ => StrTest::Contains,
                };
                Ok((Node::Str(op, b(s), b(x)), Ty::Bool))
            }
            ("matches", Some(s), [p]) => {
                let (s, _) = self.typed(s, d, Ty::Str, name)?;
                let Expr::Literal(LiteralValue::String(p)) = &p.expr else {
                    return Err("matches() takes a string literal (compiled at load)".to_owned());
                };
                let p = p.inner();
                if p.len() > MAX_PATTERN_BYTES {
                    return Err(format!(
                        "a matches() pattern is at most {MAX_PATTERN_BYTES} bytes"
                    ));
                }
                let re = RegexBuilder::new(p)
                    .size_limit(MAX_REGEX_BYTES)
                    .dfa_size_limit(MAX_REGEX_BYTES)
                    .build()
                    .map_err(|_| {
                        "matches(): the pattern is not a valid regular expression, or too large".to_owned()
                    })?;
                Ok((Node::Matches(b(s), Box::new(re)), Ty::Bool))
            }
            _ => Err(format!(
                "unknown function `{}` with {} argument(s){}",
                clip(name.trim_matches('_')),
                c.args.len(),
                if c.target.is_some() { " on a receiver" } else { "" }
            )),
        }
    }

    /// An operand that must be a value (not a bare object such as `caller` or `tool`).
    fn value(&mut self, e: &IdedExpr, d: usize) -> Out {
        let (n, t) = self.expr(e, d)?;
        if matches!(t, Ty::Caller | Ty::Tool | Ty::Request | Ty::Resource | Ty::Prompt) {
            return Err(format!("`{}` is an object: use one of its fields", t.name()));
        }
        Ok((n, t))
    }

    fn typed(&mut self, e: &IdedExpr, d: usize, want: Ty, op: &str) -> Out {
        let (n, t) = self.expr(e, d)?;
        if !t.is(want) {
            return Err(format!("{op} needs a {}, not {}", want.name(), t.name()));
        }
        Ok((n, t))
    }

    fn compare(&mut self, name: &str, l: &IdedExpr, r: &IdedExpr, d: usize) -> Out {
        let (l, tl) = self.value(l, d)?;
        let (r, tr) = self.value(r, d)?;
        let op = match name {
            operators::EQUALS => Cmp::Eq,
            operators::NOT_EQUALS => Cmp::Ne,
            operators::LESS => Cmp::Lt,
            operators::LESS_EQUALS => Cmp::Le,
            operators::GREATER => Cmp::Gt,
            _ => Cmp::Ge,
        };
        let known = tl != Ty::Dyn && tr != Ty::Dyn;
        let numbers = tl.numeric() && tr.numeric();
        if matches!(op, Cmp::Eq | Cmp::Ne) {
            let lists = matches!(tl, Ty::List | Ty::StrList) && matches!(tr, Ty::List | Ty::StrList);
            if known && tl != tr && !numbers && !lists && tl != Ty::Null && tr != Ty::Null {
                return Err(format!("cannot compare {} with {}", tl.name(), tr.name()));
            }
        } else {
            let strings = tl.is(Ty::Str) && tr.is(Ty::Str);
            if !(numbers || strings) {
                return Err(format!("cannot order {} and {}", tl.name(), tr.name()));
            }
        }
        Ok((Node::Cmp(op, b(l), b(r)), Ty::Bool))
    }

    fn arith(&mut self, name: &str, l: &IdedExpr, r: &IdedExpr, d: usize) -> Out {
        let (l, tl) = self.value(l, d)?;
        let (r, tr) = self.value(r, d)?;
        let op = match name {
            operators::ADD => Arith::Add,
            operators::SUBSTRACT => Arith::Sub,
            operators::MULTIPLY => Arith::Mul,
            operators::DIVIDE => Arith::Div,
            _ => Arith::Rem,
        };
        let t = match (tl, tr) {
            (Ty::Str, Ty::Str) | (Ty::Str, Ty::Dyn) | (Ty::Dyn, Ty::Str) if op == Arith::Add => Ty::Str,
            (Ty::Dyn, Ty::Dyn) => Ty::Dyn,
            // No implicit conversions in CEL: the known side's type is the result's.
            (Ty::Dyn, t) | (t, Ty::Dyn) if matches!(t, Ty::Int | Ty::Uint | Ty::Double) => t,
            (a, z) if a == z && matches!(a, Ty::Int | Ty::Uint | Ty::Double) => {
                if op == Arith::Rem && a == Ty::Double {
                    return Err("% needs integers".to_owned());
                }
                a
            }
            _ => {
                return Err(format!("no arithmetic on {} and {}", tl.name(), tr.name()));
            }
        };
        Ok((Node::Arith(op, b(l), b(r)), t))
    }

    fn comprehension(&mut self, c: &ComprehensionExpr, depth: usize) -> Out {
        let quant = macro_kind(c).ok_or_else(|| {
            "only the all, exists and exists_one macros are supported (not map or filter)".to_owned()
        })?;
        if self.locals.len() >= MAX_COMPREHENSION_NESTING {
            return Err(format!(
                "all/exists/exists_one nest at most {MAX_COMPREHENSION_NESTING} deep"
            ));
        }
        if c.iter_var2.is_some() {
            return Err("two-variable comprehensions are not supported".to_owned());
        }
        let (range, tr) = self.value(&c.iter_range, depth + 1)?;
        if !matches!(tr, Ty::StrList | Ty::List | Ty::Map | Ty::Dyn) {
            return Err(format!("{} over {}", quant_name(quant), tr.name()));
        }
        self.locals.push(c.iter_var.clone());
        let body = quant_body(quant, c).ok_or_else(|| "unsupported macro expansion".to_owned());
        let out = body.and_then(|body| self.typed(body, depth + 1, Ty::Bool, quant_name(quant)));
        self.locals.pop();
        let (body, _) = out?;
        Ok((Node::Quant(quant, b(range), b(body)), Ty::Bool))
    }
}

fn quant_name(q: Quant) -> &'static str {
    match q {
        Quant::All => "all",
        Quant::Exists => "exists",
        Quant::ExistsOne => "exists_one",
    }
}

/// Which macro a comprehension is the expansion of, from its accumulator's start and step.
fn macro_kind(c: &ComprehensionExpr) -> Option<Quant> {
    let Expr::Literal(init) = &c.accu_init.expr else {
        return None;
    };
    let Expr::Call(step) = &c.loop_step.expr else {
        return None;
    };
    match (init, step.func_name.as_str()) {
        (LiteralValue::Boolean(v), operators::LOGICAL_AND) if *v.inner() => Some(Quant::All),
        (LiteralValue::Boolean(v), operators::LOGICAL_OR) if !*v.inner() => Some(Quant::Exists),
        (LiteralValue::Int(v), operators::CONDITIONAL) if *v.inner() == 0 => Some(Quant::ExistsOne),
        _ => None,
    }
}

/// The predicate inside a macro's loop step.
fn quant_body(q: Quant, c: &ComprehensionExpr) -> Option<&IdedExpr> {
    let Expr::Call(step) = &c.loop_step.expr else {
        return None;
    };
    match (q, step.args.as_slice()) {
        (Quant::All | Quant::Exists, [_accu, body]) => Some(body),
        (Quant::ExistsOne, [body, _, _]) => Some(body),
        _ => None,
    }
}

fn lit(l: &LiteralValue) -> Result<(Lit, Ty), String> {
    Ok(match l {
        LiteralValue::Boolean(v) => (Lit::Bool(*v.inner()), Ty::Bool),
        LiteralValue::Int(v) => (Lit::Int(*v.inner()), Ty::Int),
        LiteralValue::UInt(v) => (Lit::Uint(*v.inner()), Ty::Uint),
        LiteralValue::Double(v) => (Lit::Double(*v.inner()), Ty::Double),
        LiteralValue::Null => (Lit::Null, Ty::Null),
        LiteralValue::String(s) => {
            let s = s.inner();
            if s.len() > MAX_LITERAL_BYTES {
                return Err(format!("a string literal is at most {MAX_LITERAL_BYTES} bytes"));
            }
            (Lit::Str(s.into()), Ty::Str)
        }
        LiteralValue::Bytes(_) => return Err("bytes literals are not supported".to_owned()),
    })
}

/// A name from the expression, cut short for a message.
fn clip(s: &str) -> &str {
    let mut end = s.len().min(64);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(src: &str) -> String {
        compile(src).map(|_| ()).expect_err(src)
    }

    #[test]
    fn the_typical_rules_compile() {
        for src in [
            "'sre' in caller.groups && args.namespace != 'prod'",
            "caller.claims.department == 'platform' || tool.annotations.readOnlyHint == true",
            "has(args.namespace) && args.namespace in ['dev', 'staging']",
            "caller.scopes.exists(s, s.startsWith('deploy:'))",
            "args.replicas <= 10 && size(args.name) < 64",
            "args.items.all(i, i.kind != 'Secret' && caller.groups.exists(g, g == i.team))",
            "caller.subject.matches('^[a-z]+@example\\\\.com$')",
            "tool.name.startsWith('k8s-') ? 'sre' in caller.groups : true",
            "caller.clientId == 'ci' && tool.upstream == 'github'",
            "args.tags.exists_one(t, t == 'urgent')",
            "args.namespace + '-x' == caller.subject + '-x'",
            "args.count % 2 == 0 && -args.count < 0",
            "caller.groups[0] == 'a' && args['namespace'] == 'dev' && args.list[1] == 2",
        ] {
            compile(src).unwrap_or_else(|e| panic!("{src}: {e}"));
        }
        assert!(compile("args.x == 1").unwrap().reads_args);
        assert!(!compile("'a' in caller.groups").unwrap().reads_args);
    }

    #[test]
    fn unknown_names_and_wrong_types_are_refused_with_a_reason() {
        for (src, want) in [
            ("user.name == 'x'", "unknown variable `user`"),
            ("caller.email == 'x'", "unknown field `caller.email`"),
            ("tool.owner == 'x'", "unknown field `tool.owner`"),
            ("lower(args.x) == 'a'", "unknown function `lower`"),
            ("args.x.lowerAscii() == 'a'", "unknown function `lowerAscii`"),
            ("caller.groups", "must be a bool expression"),
            ("args.n + 1", "must be a bool"),
            ("caller.subject == 1", "cannot compare string with int"),
            ("caller.groups < 'a'", "cannot order"),
            ("1 in caller.groups", "`in` a list of strings needs a string"),
            ("caller == tool", "is an object"),
            ("!caller.subject", "! needs a bool, not string"),
            ("caller.subject && true", "&& needs a bool"),
            ("args.items.map(i, i.x).size() > 0", "not map or filter"),
            ("args.items.filter(i, i.x).size() > 0", "not map or filter"),
            ("args.s.matches(args.p)", "string literal"),
            ("args.s.matches('(')", "not a valid regular expression"),
            ("{'a': 1}.a == 1", "map literals"),
            ("[args.x] == [1]", "literals only"),
            ("b'x' == args.x", "bytes literals"),
            ("args.x ==", "syntax error"),
            ("", "must not be empty"),
            ("caller.subject.size() == 'a'", "cannot compare int with string"),
            ("1.5 % 2.0 == 0.0", "% needs integers"),
        ] {
            let e = err(src);
            assert!(e.contains(want), "{src}: {e}");
        }
    }

    #[test]
    fn hostile_expressions_are_refused_at_load() {
        let long = format!("args.x == '{}'", "a".repeat(MAX_EXPRESSION_BYTES));
        assert!(err(&long).contains("bytes long"));
        let lit = format!("args.x == '{}'", "a".repeat(MAX_LITERAL_BYTES + 1));
        assert!(err(&lit).contains("string literal is at most"));
        let parens = format!("{}true{}", "(".repeat(200), ")".repeat(200));
        assert!(err(&parens).contains("nests deeper"));
        let lists = format!("args.x in {}1{}", "[".repeat(100), "]".repeat(100));
        assert!(err(&lists).contains("nests deeper"));
        let nots = format!("{}true", "!".repeat(500));
        assert!(err(&nots).contains("nests deeper"));
        let negs = format!("{}1 == 1", "- ".repeat(500));
        assert!(err(&negs).contains("nests deeper"));
        // A flat chain is not deep in the text, but is in the tree.
        let chain = vec!["args.a == 1"; 120].join(" && ");
        let e = err(&chain);
        assert!(e.contains("deeper") || e.contains("terms"), "{e}");
        let sum = format!("{} == 0", vec!["args.a"; 300].join(" + "));
        let e = err(&sum);
        assert!(
            e.contains("deeper") || e.contains("terms") || e.contains("bytes"),
            "{e}"
        );
        let selects = format!("args{} == 1", ".a".repeat(200));
        let e = err(&selects);
        assert!(e.contains("deeper") || e.contains("terms"), "{e}");
        let nested = "args.a.all(x, args.b.all(y, args.c.all(z, x == y && y == z)))";
        assert!(err(nested).contains("nest at most 2"));
        let big = format!("args.x in [{}]", vec!["'a'"; MAX_LIST_LITERAL + 1].join(","));
        assert!(err(&big).contains("at most 64 elements"));
        let re = format!("args.x.matches('{}')", "a{1000}{1000}");
        assert!(err(&re).contains("regular expression"));
        let long_re = format!("args.x.matches('{}')", "a".repeat(MAX_PATTERN_BYTES + 1));
        assert!(err(&long_re).contains("pattern is at most"));
        // The longest chains that fit, of every binary operator and of postfix selections,
        // indexes and calls: refused, without exhausting a small stack.
        std::thread::Builder::new()
            .stack_size(1 << 20)
            .spawn(|| {
                for unit in [
                    " && a",
                    " || a",
                    " + a",
                    " * a",
                    " == a",
                    " < a",
                    " in a",
                    " ? a : a",
                    ".a",
                    "[0]",
                    ".size()",
                    ".all(x, x)",
                    "-",
                    "!",
                    "(a)",
                    "'\\u00e9'",
                ] {
                    let n = MAX_EXPRESSION_BYTES / unit.len();
                    let src = format!("a{}", unit.repeat(n - 1));
                    let src = &src[..src.len().min(MAX_EXPRESSION_BYTES)];
                    assert!(compile(src).is_err(), "{unit}");
                }
            })
            .unwrap()
            .join()
            .unwrap();
        // Brackets inside strings do not count, and unbalanced ones are a syntax error.
        compile(&format!("args.x == '{}'", "(".repeat(100))).unwrap();
        assert!(err(")))(((").contains("syntax"));
    }
}
