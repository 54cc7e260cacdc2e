//! A compiled JSON Schema validator for tool arguments, and the `input:` shorthand.
//!
//! Supports the keywords tool schemas use in practice (types, properties, required,
//! additionalProperties, items, enum, const, numeric and length bounds, multipleOf, pattern,
//! property and item counts, uniqueItems, dependentRequired, anyOf, oneOf, allOf, not,
//! if/then/else, and local `$ref`s into `$defs`/`definitions`, any `#/...` pointer or a
//! `$anchor`) and rejects any other keyword at load time instead of silently ignoring it.
//! Annotations (`title`, `description`, `x-*` extensions, ...) are accepted and ignored.
//!
//! This is only the validator: what `tools/list` shows is the document as its author wrote
//! it, kept beside the compiled form (see `config::compile`).
//!
//! A `$ref` is compiled by inlining its target, so validation never follows references at
//! run time. Recursive references are refused, and one document may expand to at most
//! [`MAX_NODES`] subschemas (shared definitions referenced many times multiply).

use std::collections::BTreeMap;

use regex::{Regex, RegexBuilder};

/// Compiled size a `pattern` may take (NFA and lazy-DFA cache each): `\\w{200}` would
/// otherwise take ~11 MB, and a ToolSet or an upstream may declare thousands.
const MAX_REGEX_BYTES: usize = 64 * 1024;

fn bounded_regex(p: &str) -> Result<Regex, regex::Error> {
    RegexBuilder::new(p)
        .size_limit(MAX_REGEX_BYTES)
        .dfa_size_limit(MAX_REGEX_BYTES)
        .build()
}
use serde_json::{Map, Value, json};

const T_NULL: u8 = 1;
const T_BOOL: u8 = 2;
const T_INT: u8 = 4;
const T_NUM: u8 = 8;
const T_STR: u8 = 16;
const T_ARR: u8 = 32;
const T_OBJ: u8 = 64;
const T_ANY: u8 = 127;

/// Keywords accepted and ignored because they only annotate.
const ANNOTATIONS: &[&str] = &[
    "$schema",
    "$id",
    "$comment",
    "title",
    "description",
    "default",
    "examples",
    "format",
    "deprecated",
    "readOnly",
    "writeOnly",
    "contentMediaType",
    "contentEncoding",
    // Legacy titles of `enum` values (MCP elicitation forms).
    "enumNames",
    // A name a `$ref` may use (`#name`); resolved by [`resolve`].
    "$anchor",
];

/// Whether `k` only annotates: a listed annotation or an `x-` extension keyword
/// (`x-mcp-header`, vendor metadata).
fn is_annotation(k: &str) -> bool {
    ANNOTATIONS.contains(&k) || k.starts_with("x-")
}

/// The keywords the validator enforces or follows (annotations aside): what a schema may
/// say to be checked. A schema from elsewhere (an OpenAPI document) is listed as written and
/// checked by the subset of it made of these and the annotations (see [`understood`]).
pub const CHECKED: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "$defs",
    "definitions",
    "$ref",
    "anyOf",
    "oneOf",
    "allOf",
    "not",
    "if",
    "then",
    "else",
    "enum",
    "const",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "multipleOf",
    "uniqueItems",
    "dependentRequired",
    "pattern",
];

/// Whether the validator accepts keyword `k`: it checks it, or it only annotates.
pub fn understood(k: &str) -> bool {
    CHECKED.contains(&k) || is_annotation(k)
}

/// The part of a schema from elsewhere (an OpenAPI document, an upstream server) that the
/// validator checks: keywords it does not understand (OpenAPI's annotations, assertions it
/// cannot enforce such as `patternProperties`, a `pattern` it cannot compile) are left out,
/// in every subschema it follows. The one who wrote the schema still enforces what is left
/// out; the listing keeps it all.
pub fn enforceable(v: &Value) -> Value {
    let Some(o) = v.as_object() else {
        return v.clone();
    };
    let mut out = serde_json::Map::new();
    for (k, x) in o {
        let kept = match k.as_str() {
            "properties" | "$defs" | "definitions" => Value::Object(
                x.as_object()
                    .into_iter()
                    .flatten()
                    .map(|(n, s)| (n.clone(), enforceable(s)))
                    .collect(),
            ),
            "anyOf" | "oneOf" | "allOf" => {
                Value::Array(x.as_array().into_iter().flatten().map(enforceable).collect())
            }
            "items" if !x.is_object() && !x.is_boolean() => continue,
            "items" | "additionalProperties" | "not" | "if" | "then" | "else" => enforceable(x),
            "pattern" if x.as_str().is_none_or(|p| bounded_regex(p).is_err()) => continue,
            key if understood(key) => x.clone(),
            _ => continue,
        };
        out.insert(k.clone(), kept);
    }
    Value::Object(out)
}

/// Subschemas one document may compile to, `$ref` expansions included.
pub const MAX_NODES: usize = 10_000;
/// References that may be expanded inside one another (each also nests the compiled schema).
pub const MAX_REF_DEPTH: usize = 16;

/// The document being compiled, for resolving `$ref`s and bounding their expansion.
struct Refs<'a> {
    root: &'a Value,
    /// Every `$anchor` of the document and the schema carrying it, collected on the first
    /// reference by anchor (one walk per document, however many references).
    anchors: Option<BTreeMap<&'a str, &'a Value>>,
    /// References being expanded, outermost first (a repeat is a cycle).
    stack: Vec<&'a str>,
    nodes: usize,
}

/// Where a value sits in the arguments, as a chain of borrowed segments on the stack;
/// rendered (`arguments.tags[1]`) only when reporting a violation.
#[derive(Debug, Clone, Copy)]
enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl std::fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Root => f.write_str("arguments"),
            Self::Key(p, k) => write!(f, "{p}.{k}"),
            Self::Index(p, i) => write!(f, "{p}[{i}]"),
        }
    }
}

/// A compiled schema. What most schemas use (type, properties, required, items) is inline;
/// the other keywords live in one box only schemas that use them pay for: a tool's schema
/// and each property's are kept per tool, so this keeps the common case at ~90 bytes.
#[derive(Debug, Clone, Default)]
pub struct Schema {
    types: u8,
    /// True when the schema accepts every value: validation is skipped entirely.
    trivial: bool,
    properties: Vec<(Box<str>, Schema)>,
    required: Vec<Box<str>>,
    additional: Option<Additional>,
    items: Option<Box<Schema>>,
    rare: Option<Box<Rare>>,
}

// Kept per tool and per property: a field added inline should be a deliberate choice.
const _: () = assert!(std::mem::size_of::<Schema>() <= 96);

/// The keywords a schema seldom uses.
#[derive(Debug, Clone, Default)]
struct Rare {
    enumeration: Option<Vec<Value>>,
    constant: Option<Value>,
    minimum: Option<f64>,
    maximum: Option<f64>,
    exclusive_minimum: Option<f64>,
    exclusive_maximum: Option<f64>,
    min_length: Option<usize>,
    max_length: Option<usize>,
    pattern: Option<Regex>,
    min_items: Option<usize>,
    max_items: Option<usize>,
    any_of: Vec<Schema>,
    one_of: Vec<Schema>,
    all_of: Vec<Schema>,
    multiple_of: Option<f64>,
    min_properties: Option<usize>,
    max_properties: Option<usize>,
    unique_items: bool,
    /// `dependentRequired`: when the first property is present, so must the others be.
    dependent_required: Vec<Dependent>,
    not: Option<Box<Schema>>,
    /// `if`, `then`, `else`: when a value matches `if`, `then` applies, otherwise `else`.
    conditional: Option<Box<Conditional>>,
    /// The root's properties declared with `x-mcp-header`, as (property, header name in
    /// lower case: `mcp-param-region`).
    param_headers: Vec<(Box<str>, Box<str>)>,
}

/// A `dependentRequired` entry: when the property is present, the others must be too.
type Dependent = (Box<str>, Vec<Box<str>>);

#[derive(Debug, Clone, Default)]
struct Conditional {
    when: Option<Schema>,
    then: Option<Schema>,
    otherwise: Option<Schema>,
}

/// What a schema without a [`Rare`] box checks of them: nothing.
static NO_RARE: Rare = Rare {
    enumeration: None,
    constant: None,
    minimum: None,
    maximum: None,
    exclusive_minimum: None,
    exclusive_maximum: None,
    min_length: None,
    max_length: None,
    pattern: None,
    min_items: None,
    max_items: None,
    any_of: Vec::new(),
    one_of: Vec::new(),
    all_of: Vec::new(),
    multiple_of: None,
    min_properties: None,
    max_properties: None,
    unique_items: false,
    dependent_required: Vec::new(),
    not: None,
    conditional: None,
    param_headers: Vec::new(),
};

#[derive(Debug, Clone)]
enum Additional {
    Deny,
    Schema(Box<Schema>),
}

impl Schema {
    fn rare(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Box::default)
    }

    /// Compiles a JSON Schema document.
    ///
    /// # Errors
    /// Every unsupported keyword or malformed value, each with its JSON-pointer-like path.
    pub fn compile(v: &Value) -> Result<Self, Vec<String>> {
        let mut errs = Vec::new();
        let mut refs = Refs {
            root: v,
            anchors: None,
            stack: Vec::new(),
            nodes: 0,
        };
        let mut s = compile_at(v, "", &mut errs, &mut refs);
        let headers = param_headers(v, &mut errs);
        if !headers.is_empty() {
            s.rare().param_headers = headers;
        }
        if errs.is_empty() { Ok(s) } else { Err(errs) }
    }

    /// The properties a client mirrors into `Mcp-Param-*` request headers (`x-mcp-header`
    /// on a property of the root), as (property, lower-case header name).
    pub fn param_headers(&self) -> &[(Box<str>, Box<str>)] {
        self.rare.as_deref().map_or(&[], |r| &r.param_headers)
    }

    /// The names of the declared properties, if this is an object schema that declares them.
    pub fn property_names(&self) -> impl Iterator<Item = &str> {
        self.properties.iter().map(|(k, _)| &**k)
    }

    /// Whether properties beyond the declared ones are accepted.
    pub fn allows_additional(&self) -> bool {
        !matches!(self.additional, Some(Additional::Deny))
    }

    /// Validates `v`, appending one message per violation (`path: problem`).
    pub fn validate(&self, v: &Value, errors: &mut Vec<String>) {
        if !self.trivial {
            self.check(v, &Path::Root, errors);
        }
    }

    /// True when `v` conforms.
    pub fn is_valid(&self, v: &Value) -> bool {
        let mut e = Vec::new();
        self.validate(v, &mut e);
        e.is_empty()
    }

    fn check(&self, v: &Value, path: &Path<'_>, errors: &mut Vec<String>) {
        if self.trivial {
            return;
        }
        // The path is only rendered when there is something to report: valid input
        // allocates nothing here.
        let r = self.rare.as_deref().unwrap_or(&NO_RARE);
        let t = type_bit(v);
        if self.types & t == 0 && !(t == T_INT && self.types & T_NUM != 0) {
            errors.push(format!(
                "{path}: expected {}, got {}",
                type_names(self.types),
                type_name(v)
            ));
            return;
        }
        if let Some(c) = &r.constant
            && !json_eq(c, v)
        {
            errors.push(format!("{path}: must equal {c}"));
        }
        if let Some(e) = &r.enumeration
            && !e.iter().any(|x| json_eq(x, v))
        {
            let list: Vec<String> = e.iter().map(Value::to_string).collect();
            errors.push(format!("{path}: must be one of {}", list.join(", ")));
        }
        match v {
            Value::Number(n) => check_number(r, n, path, errors),
            Value::String(s) => check_string(r, s, path, errors),
            Value::Array(a) => self.check_array(r, a, path, errors),
            Value::Object(o) => self.check_object(o, path, errors),
            _ => {}
        }
        for s in &r.all_of {
            s.check(v, path, errors);
        }
        if !r.any_of.is_empty() && !r.any_of.iter().any(|s| s.is_valid(v)) {
            errors.push(format!("{path}: matches none of the anyOf alternatives"));
        }
        if !r.one_of.is_empty() {
            let n = r.one_of.iter().filter(|s| s.is_valid(v)).count();
            if n != 1 {
                errors.push(format!(
                    "{path}: must match exactly one oneOf alternative, matches {n}"
                ));
            }
        }
        if r.not.as_ref().is_some_and(|s| s.is_valid(v)) {
            errors.push(format!("{path}: must not match the `not` schema"));
        }
        if let Some(c) = &r.conditional
            && let Some(when) = &c.when
        {
            let branch = if when.is_valid(v) { &c.then } else { &c.otherwise };
            if let Some(b) = branch {
                b.check(v, path, errors);
            }
        }
    }

    /// The array keywords: item counts, and each item against `items`.
    #[inline]
    fn check_array(&self, r: &Rare, a: &[Value], path: &Path<'_>, errors: &mut Vec<String>) {
        if r.min_items.is_some_and(|m| a.len() < m) {
            errors.push(format!("{path}: fewer than {} items", r.min_items.unwrap_or(0)));
        }
        if r.max_items.is_some_and(|m| a.len() > m) {
            errors.push(format!("{path}: more than {} items", r.max_items.unwrap_or(0)));
        }
        if r.unique_items {
            // Hashed, not compared pairwise: a hostile array of distinct items stays linear.
            let mut seen = std::collections::HashSet::with_capacity(a.len());
            if let Some(i) = a.iter().position(|x| !seen.insert(unique_key(x))) {
                errors.push(format!(
                    "{path}: items must be unique; item {i} repeats an earlier one"
                ));
            }
        }
        if let Some(items) = &self.items {
            for (i, x) in a.iter().enumerate() {
                items.check(x, &Path::Index(path, i), errors);
            }
        }
    }

    /// The object keywords: required properties, and each property against its schema.
    #[inline]
    fn check_object(&self, o: &Map<String, Value>, path: &Path<'_>, errors: &mut Vec<String>) {
        if let Some(r) = self.rare.as_deref() {
            check_object_counts(r, o, path, errors);
        }
        for r in &self.required {
            if !o.contains_key(&**r) {
                errors.push(format!("{path}: missing required property `{r}`"));
            }
        }
        for (k, x) in o {
            let path = &Path::Key(path, k);
            if let Some((_, s)) = self.properties.iter().find(|(name, _)| **name == **k) {
                s.check(x, path, errors);
            } else {
                match &self.additional {
                    Some(Additional::Deny) => errors.push(format!("{path}: unknown property")),
                    Some(Additional::Schema(s)) => s.check(x, path, errors),
                    None => {}
                }
            }
        }
    }
}

/// The object keywords kept in [`Rare`]: property counts and `dependentRequired`.
fn check_object_counts(r: &Rare, o: &Map<String, Value>, path: &Path<'_>, errors: &mut Vec<String>) {
    if let Some(m) = r.min_properties.filter(|&m| o.len() < m) {
        errors.push(format!("{path}: fewer than {m} properties"));
    }
    if let Some(m) = r.max_properties.filter(|&m| o.len() > m) {
        errors.push(format!("{path}: more than {m} properties"));
    }
    for (when, needed) in &r.dependent_required {
        if o.contains_key(&**when) {
            for n in needed.iter().filter(|n| !o.contains_key(&***n)) {
                errors.push(format!("{path}: `{n}` is required when `{when}` is present"));
            }
        }
    }
}

/// The number keywords: bounds.
#[inline]
fn check_number(r: &Rare, n: &serde_json::Number, path: &Path<'_>, errors: &mut Vec<String>) {
    let x = n.as_f64().unwrap_or(f64::NAN);
    let bad = |cond: bool, what: String, errors: &mut Vec<String>| {
        if cond {
            errors.push(format!("{path}: {what}"));
        }
    };
    if let Some(m) = r.minimum {
        bad(x < m, format!("must be >= {m}"), errors);
    }
    if let Some(m) = r.maximum {
        bad(x > m, format!("must be <= {m}"), errors);
    }
    if let Some(m) = r.exclusive_minimum {
        bad(x <= m, format!("must be > {m}"), errors);
    }
    if let Some(m) = r.exclusive_maximum {
        bad(x >= m, format!("must be < {m}"), errors);
    }
    if let Some(m) = r.multiple_of {
        let q = x / m;
        bad(
            !q.is_finite() || (q - q.round()).abs() > 1e-9 * q.abs().max(1.0),
            format!("must be a multiple of {m}"),
            errors,
        );
    }
}

/// The string keywords: lengths in characters, and the pattern.
#[inline]
fn check_string(r: &Rare, s: &str, path: &Path<'_>, errors: &mut Vec<String>) {
    if r.min_length.is_some() || r.max_length.is_some() {
        let n = s.chars().count();
        if r.min_length.is_some_and(|m| n < m) {
            errors.push(format!(
                "{path}: shorter than {} characters",
                r.min_length.unwrap_or(0)
            ));
        }
        if r.max_length.is_some_and(|m| n > m) {
            errors.push(format!(
                "{path}: longer than {} characters",
                r.max_length.unwrap_or(0)
            ));
        }
    }
    if let Some(re) = &r.pattern
        && !re.is_match(s)
    {
        errors.push(format!("{path}: does not match pattern {}", re.as_str()));
    }
}

/// Every subschema carrying a string `$anchor`, by anchor (the first one wins).
fn collect_anchors(root: &Value) -> BTreeMap<&str, &Value> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(o) => {
                if let Some(a) = o.get("$anchor").and_then(Value::as_str) {
                    out.entry(a).or_insert(v);
                }
                // `enum` and `const` hold values, not schemas.
                stack.extend(
                    o.iter()
                        .filter(|(k, _)| !matches!(k.as_str(), "enum" | "const" | "default" | "examples"))
                        .map(|(_, x)| x),
                );
            }
            Value::Array(a) => stack.extend(a),
            _ => {}
        }
    }
    out
}

/// Whether `a` is a plain-name fragment (`$anchor`'s syntax in 2020-12).
fn valid_anchor(a: &str) -> bool {
    let mut b = a.bytes();
    b.next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_'))
}

/// The target of a local `$ref` (`#`, `#/$defs/name`, any `#/json/pointer`, `#anchor`).
fn resolve<'a>(r: &'a Value, refs: &mut Refs<'a>) -> Result<(&'a Value, &'a str), String> {
    let Some(reference) = r.as_str() else {
        return Err("must be a string".to_owned());
    };
    let Some(pointer) = reference.strip_prefix('#') else {
        return Err(format!(
            "`{reference}`: only local references (`#/...`) are supported; inline the schema or put it under `$defs`"
        ));
    };
    if refs.stack.len() >= MAX_REF_DEPTH {
        return Err(format!(
            "`{reference}`: references nest more than {MAX_REF_DEPTH} deep"
        ));
    }
    if refs.stack.contains(&reference) {
        return Err(format!(
            "`{reference}` refers to itself (directly or through other references); recursive schemas are not supported"
        ));
    }
    if !pointer.is_empty() && !pointer.starts_with('/') {
        let root = refs.root;
        let anchors = refs.anchors.get_or_insert_with(|| collect_anchors(root));
        return anchors
            .get(pointer)
            .map(|t| (*t, reference))
            .ok_or_else(|| format!("`{reference}`: no `$anchor` named {pointer:?} in this schema"));
    }
    // JSON pointers escape `/` as `~1` and `~` as `~0`; URI fragments may percent-encode.
    let decoded = percent_decode(pointer);
    refs.root
        .pointer(&decoded)
        .map(|t| (t, reference))
        .ok_or_else(|| format!("`{reference}` points at nothing in this schema"))
}

fn percent_decode(s: &str) -> String {
    if !s.contains('%') {
        return s.to_owned();
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let Some(h) = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(h);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What `uniqueItems` compares: numbers by value (`1` and `1.0` are one), anything else by
/// its JSON text (as [`json_eq`] does).
fn unique_key(v: &Value) -> String {
    match v {
        Value::Number(n) => format!("#{:?}", n.as_f64().unwrap_or(f64::NAN)),
        other => other.to_string(),
    }
}

fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

fn type_bit(v: &Value) -> u8 {
    match v {
        Value::Null => T_NULL,
        Value::Bool(_) => T_BOOL,
        Value::Number(n) if n.is_i64() || n.is_u64() => T_INT,
        Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => T_INT | T_NUM,
        Value::Number(_) => T_NUM,
        Value::String(_) => T_STR,
        Value::Array(_) => T_ARR,
        Value::Object(_) => T_OBJ,
    }
}

/// The JSON Schema type name of `v` (a whole number is an `integer`).
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_names(bits: u8) -> String {
    let names = [
        (T_NULL, "null"),
        (T_BOOL, "boolean"),
        (T_INT, "integer"),
        (T_NUM, "number"),
        (T_STR, "string"),
        (T_ARR, "array"),
        (T_OBJ, "object"),
    ];
    let v: Vec<&str> = names
        .iter()
        .filter(|(b, _)| bits & b != 0 && !(*b == T_INT && bits & T_NUM != 0))
        .map(|(_, n)| *n)
        .collect();
    v.join(" or ")
}

fn parse_type(name: &str) -> Option<u8> {
    Some(match name {
        "null" => T_NULL,
        "boolean" => T_BOOL,
        "integer" => T_INT,
        "number" => T_NUM | T_INT,
        "string" => T_STR,
        "array" => T_ARR,
        "object" => T_OBJ,
        _ => return None,
    })
}

/// `path.k`, or `k` at the root.
fn here(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_owned()
    } else {
        format!("{path}.{k}")
    }
}

fn compile_at<'a>(v: &'a Value, path: &str, errs: &mut Vec<String>, refs: &mut Refs<'a>) -> Schema {
    refs.nodes += 1;
    if refs.nodes == MAX_NODES + 1 {
        errs.push(format!(
            "{}: the schema expands to more than {MAX_NODES} subschemas ($ref expansions included)",
            if path.is_empty() { "schema" } else { path }
        ));
    }
    if refs.nodes > MAX_NODES {
        return Schema {
            types: T_ANY,
            trivial: true,
            ..Schema::default()
        };
    }
    let obj = match v {
        Value::Bool(true) => {
            return Schema {
                types: T_ANY,
                trivial: true,
                ..Schema::default()
            };
        }
        Value::Bool(false) => {
            return Schema {
                types: 0,
                ..Schema::default()
            };
        }
        Value::Object(o) => o,
        _ => {
            errs.push(format!(
                "{}: a schema must be an object or a boolean",
                if path.is_empty() { "schema" } else { path }
            ));
            return Schema::default();
        }
    };
    let mut s = Schema {
        types: T_ANY,
        ..Schema::default()
    };
    for (k, x) in obj {
        if !structure_keyword(&mut s, k, x, path, errs, refs)
            && !constraint_keyword(&mut s, k, x, path, errs)
            && !is_annotation(k)
        {
            errs.push(format!("{}: unsupported JSON Schema keyword", here(path, k)));
        }
    }
    for r in &s.required {
        if !s.properties.is_empty()
            && !s.properties.iter().any(|(n, _)| n == r)
            && matches!(s.additional, Some(Additional::Deny))
        {
            errs.push(format!(
                "{}: `{r}` is required but not a property and additionalProperties is false",
                here(path, "required")
            ));
        }
    }
    s.trivial = obj.keys().all(|k| is_annotation(k));
    s
}

/// Compiles keyword `k` (value `x`) of the schema at `path` into `s` when it shapes the
/// schema (types, properties, items, references, combinators); false for other keywords.
fn structure_keyword<'a>(
    s: &mut Schema,
    k: &str,
    x: &'a Value,
    path: &str,
    errs: &mut Vec<String>,
    refs: &mut Refs<'a>,
) -> bool {
    match k {
        "type" => s.types = parse_types(x, path, errs),
        "properties" => match x.as_object() {
            Some(props) => {
                for (name, sub) in props {
                    let p = compile_at(sub, &here(path, &format!("properties.{name}")), errs, refs);
                    s.properties.push((name.as_str().into(), p));
                }
            }
            None => errs.push(format!("{}: must be an object", here(path, k))),
        },
        "required" => match x.as_array() {
            Some(a) if a.iter().all(Value::is_string) => {
                s.required = a.iter().filter_map(Value::as_str).map(Into::into).collect();
            }
            _ => errs.push(format!("{}: must be an array of strings", here(path, k))),
        },
        "additionalProperties" => {
            s.additional = Some(match x {
                Value::Bool(false) => Additional::Deny,
                other => Additional::Schema(Box::new(compile_at(other, &here(path, k), errs, refs))),
            });
        }
        "items" => s.items = Some(Box::new(compile_at(x, &here(path, k), errs, refs))),
        "$defs" | "definitions" => match x.as_object() {
            // Checked here even when unused; used ones are compiled again where referenced.
            Some(defs) => {
                for (name, sub) in defs {
                    compile_at(sub, &here(path, &format!("{k}.{name}")), errs, refs);
                }
            }
            None => errs.push(format!("{}: must be an object", here(path, k))),
        },
        "$ref" => match resolve(x, refs) {
            Ok((target, reference)) => {
                refs.stack.push(reference);
                let inner = compile_at(target, &here(path, k), errs, refs);
                refs.stack.pop();
                // Keywords beside the `$ref` apply too (2020-12): both must hold.
                s.rare().all_of.push(inner);
            }
            Err(e) => errs.push(format!("{}: {e}", here(path, k))),
        },
        "anyOf" | "oneOf" | "allOf" => match x.as_array() {
            Some(a) if !a.is_empty() => {
                let list = a
                    .iter()
                    .enumerate()
                    .map(|(i, sub)| compile_at(sub, &format!("{}[{i}]", here(path, k)), errs, refs))
                    .collect();
                match k {
                    "anyOf" => s.rare().any_of = list,
                    "oneOf" => s.rare().one_of = list,
                    _ => s.rare().all_of.extend(list),
                }
            }
            _ => errs.push(format!("{}: must be a non-empty array of schemas", here(path, k))),
        },
        "not" => s.rare().not = Some(Box::new(compile_at(x, &here(path, k), errs, refs))),
        "if" | "then" | "else" => {
            let sub = Some(compile_at(x, &here(path, k), errs, refs));
            let c = s.rare().conditional.get_or_insert_with(Box::default);
            match k {
                "if" => c.when = sub,
                "then" => c.then = sub,
                _ => c.otherwise = sub,
            }
        }
        "$anchor" => {
            if !x.as_str().is_some_and(valid_anchor) {
                errs.push(format!(
                    "{}: must be a name (a letter or `_`, then letters, digits, `-`, `.`, `_`)",
                    here(path, k)
                ));
            }
        }
        _ => return false,
    }
    true
}

/// The type bits of a `type` keyword (one name or an array of names).
fn parse_types(x: &Value, path: &str, errs: &mut Vec<String>) -> u8 {
    let names: Vec<&Value> = match x {
        Value::Array(a) => a.iter().collect(),
        one => vec![one],
    };
    let mut bits = 0;
    for n in names {
        match n.as_str().and_then(parse_type) {
            Some(b) => bits |= b,
            None => errs.push(format!("{}: unknown type {n}", here(path, "type"))),
        }
    }
    bits
}

/// Compiles keyword `k` (value `x`) of the schema at `path` into `s` when it constrains
/// values (enum, const, bounds, lengths, pattern); false for other keywords.
fn constraint_keyword(s: &mut Schema, k: &str, x: &Value, path: &str, errs: &mut Vec<String>) -> bool {
    let num = |errs: &mut Vec<String>| -> Option<f64> {
        x.as_f64().or_else(|| {
            errs.push(format!("{}: must be a number", here(path, k)));
            None
        })
    };
    let count = |errs: &mut Vec<String>| -> Option<usize> {
        x.as_u64().map(|n| n as usize).or_else(|| {
            errs.push(format!("{}: must be a non-negative integer", here(path, k)));
            None
        })
    };
    match k {
        "enum" => match x.as_array() {
            Some(a) => s.rare().enumeration = Some(a.clone()),
            None => errs.push(format!("{}: must be an array", here(path, k))),
        },
        "const" => s.rare().constant = Some(x.clone()),
        "minimum" => s.rare().minimum = num(errs),
        "maximum" => s.rare().maximum = num(errs),
        "exclusiveMinimum" => s.rare().exclusive_minimum = num(errs),
        "exclusiveMaximum" => s.rare().exclusive_maximum = num(errs),
        "minLength" => s.rare().min_length = count(errs),
        "maxLength" => s.rare().max_length = count(errs),
        "minItems" => s.rare().min_items = count(errs),
        "maxItems" => s.rare().max_items = count(errs),
        "minProperties" => s.rare().min_properties = count(errs),
        "maxProperties" => s.rare().max_properties = count(errs),
        "multipleOf" => match x.as_f64() {
            Some(m) if m > 0.0 && m.is_finite() => s.rare().multiple_of = Some(m),
            _ => errs.push(format!("{}: must be a number greater than 0", here(path, k))),
        },
        "uniqueItems" => match x.as_bool() {
            Some(u) => s.rare().unique_items = u,
            None => errs.push(format!("{}: must be a boolean", here(path, k))),
        },
        "dependentRequired" => match dependent_required(x) {
            Some(d) => s.rare().dependent_required = d,
            None => errs.push(format!(
                "{}: must be an object of arrays of property names",
                here(path, k)
            )),
        },
        "pattern" => match x.as_str().map(bounded_regex) {
            Some(Ok(re)) => s.rare().pattern = Some(re),
            Some(Err(e)) => errs.push(format!("{}: invalid regular expression: {e}", here(path, k))),
            None => errs.push(format!("{}: must be a string", here(path, k))),
        },
        _ => return false,
    }
    true
}

/// The `x-mcp-header` declarations of an input schema's root properties (property,
/// lower-case header name) without compiling the schema: what a caller of a tool that
/// another server lists must mirror. Invalid declarations are left out.
#[must_use]
pub fn declared_param_headers(input_schema: &Value) -> Vec<(Box<str>, Box<str>)> {
    param_headers(input_schema, &mut Vec::new())
}

/// Longest `x-mcp-header` name accepted (the header is `Mcp-Param-` and this).
pub const MAX_PARAM_HEADER_LEN: usize = 64;

/// The `x-mcp-header` declarations of the root's properties, checked: each names a header
/// (an RFC 9110 token of at most [`MAX_PARAM_HEADER_LEN`] characters, unique without case)
/// on a property of type string, integer or boolean (not number: a float has no single
/// text form to compare).
fn param_headers(root: &Value, errs: &mut Vec<String>) -> Vec<(Box<str>, Box<str>)> {
    let Some(props) = root.get("properties").and_then(Value::as_object) else {
        return Vec::new();
    };
    let mut out: Vec<(Box<str>, Box<str>)> = Vec::new();
    for (name, p) in props {
        let Some(h) = p.get("x-mcp-header") else {
            continue;
        };
        let at = format!("properties.{name}.x-mcp-header");
        let Some(h) = h.as_str().filter(|h| {
            !h.is_empty()
                && h.len() <= MAX_PARAM_HEADER_LEN
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        }) else {
            errs.push(format!(
                "{at}: must be a header name of 1 to {MAX_PARAM_HEADER_LEN} letters, digits or !#$%&'*+-.^_`|~"
            ));
            continue;
        };
        let primitive = p
            .get("type")
            .and_then(Value::as_str)
            .is_some_and(|t| matches!(t, "string" | "integer" | "boolean"));
        if !primitive {
            errs.push(format!(
                "{at}: only a property of type string, integer or boolean can be mirrored into a header"
            ));
            continue;
        }
        let header: Box<str> = format!("mcp-param-{}", h.to_ascii_lowercase()).into();
        if out.iter().any(|(_, x)| *x == header) {
            errs.push(format!(
                "{at}: `{h}` is declared by another property too (header names ignore case)"
            ));
            continue;
        }
        out.push((name.as_str().into(), header));
    }
    out
}

/// `dependentRequired`: `{property: [names required with it]}`.
fn dependent_required(x: &Value) -> Option<Vec<Dependent>> {
    x.as_object()?
        .iter()
        .map(|(k, v)| {
            let names = v
                .as_array()?
                .iter()
                .map(|n| n.as_str().map(Box::from))
                .collect::<Option<Vec<_>>>()?;
            Some((k.as_str().into(), names))
        })
        .collect()
}

/// Expands the `input:` shorthand into an object JSON Schema.
///
/// `{a: number, b: "string?", tags: {type: array, items: {type: string}}}` becomes an object
/// schema with `a` required, `b` optional, `tags` as written, and no other properties.
///
/// # Errors
/// One message per property whose type is neither a known type name nor a schema object.
pub fn expand_shorthand(input: &BTreeMap<String, Value>) -> Result<Value, Vec<String>> {
    let mut props = Map::new();
    let mut required = Vec::new();
    let mut errs = Vec::new();
    for (name, spec) in input {
        match spec {
            Value::String(t) => {
                let (ty, optional) = match t.strip_suffix('?') {
                    Some(base) => (base.trim(), true),
                    None => (t.trim(), false),
                };
                if parse_type(ty).is_none() || ty == "null" {
                    errs.push(format!(
                        "{name}: unknown type `{ty}` (string, number, integer, boolean, object, array; `?` suffix for optional)"
                    ));
                    continue;
                }
                props.insert(name.clone(), json!({"type": ty}));
                if !optional {
                    required.push(Value::String(name.clone()));
                }
            }
            Value::Object(_) => {
                props.insert(name.clone(), spec.clone());
                required.push(Value::String(name.clone()));
            }
            other => errs.push(format!(
                "{name}: expected a type name or a schema object, got {other}"
            )),
        }
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    Ok(json!({
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": false,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_checked_keyword_is_compiled_and_no_other_is() {
        let values = |k: &str| match k {
            "type" => json!("object"),
            "properties" | "$defs" | "definitions" | "dependentRequired" => json!({}),
            "required" | "enum" => json!([]),
            "anyOf" | "oneOf" | "allOf" => json!([true]),
            "$ref" => json!("#"),
            "pattern" => json!("a"),
            "uniqueItems" => json!(true),
            "items" | "additionalProperties" | "not" | "if" | "then" | "else" => json!({}),
            _ => json!(1),
        };
        for k in CHECKED {
            let e = Schema::compile(&json!({ *k: values(k) }))
                .err()
                .unwrap_or_default();
            assert!(!e.iter().any(|m| m.contains("unsupported")), "{k}: {e:?}");
        }
        for k in [
            "patternProperties",
            "prefixItems",
            "discriminator",
            "example",
            "nullable",
            "$dynamicRef",
        ] {
            assert!(!understood(k), "{k}");
            let e = Schema::compile(&json!({ k: {} })).unwrap_err();
            assert!(e.iter().any(|m| m.contains("unsupported")), "{k}: {e:?}");
        }
    }

    fn errors(schema: Value, v: Value) -> Vec<String> {
        let s = Schema::compile(&schema).unwrap();
        let mut e = Vec::new();
        s.validate(&v, &mut e);
        e
    }

    #[test]
    fn validates_objects_with_paths() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "number"}, "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["a"], "additionalProperties": false});
        assert!(errors(schema.clone(), json!({"a": 1})).is_empty());
        assert!(errors(schema.clone(), json!({"a": 1.5, "tags": ["x"]})).is_empty());
        let e = errors(schema, json!({"tags": ["x", 3], "zz": 1}));
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(e.iter().any(|m| m == "arguments: missing required property `a`"));
        assert!(
            e.iter()
                .any(|m| m == "arguments.tags[1]: expected string, got integer")
        );
        assert!(e.iter().any(|m| m == "arguments.zz: unknown property"));
    }

    #[test]
    fn integer_accepts_whole_floats_number_accepts_integers() {
        assert!(errors(json!({"type": "integer"}), json!(2.0)).is_empty());
        assert!(!errors(json!({"type": "integer"}), json!(2.5)).is_empty());
        assert!(errors(json!({"type": "number"}), json!(2)).is_empty());
    }

    #[test]
    fn bounds_enum_pattern_and_combinators() {
        assert_eq!(
            errors(json!({"minimum": 1, "maximum": 3}), json!(5)),
            vec!["arguments: must be <= 3"]
        );
        assert!(!errors(json!({"enum": ["a", "b"]}), json!("c")).is_empty());
        assert!(errors(json!({"pattern": "^[a-z]+$"}), json!("abc")).is_empty());
        assert!(!errors(json!({"pattern": "^[a-z]+$"}), json!("ab1")).is_empty());
        assert!(
            errors(
                json!({"anyOf": [{"type": "string"}, {"type": "integer"}]}),
                json!(3)
            )
            .is_empty()
        );
        assert!(
            !errors(
                json!({"oneOf": [{"type": "number"}, {"type": "integer"}]}),
                json!(3)
            )
            .is_empty()
        );
    }

    #[test]
    fn rejects_unsupported_keywords_with_paths() {
        let e = Schema::compile(
            &json!({"type": "object", "properties": {"x": {"unevaluatedProperties": false}}, "minimum": "z"}),
        )
        .unwrap_err();
        assert!(
            e.contains(&"properties.x.unevaluatedProperties: unsupported JSON Schema keyword".to_owned()),
            "{e:?}"
        );
        assert!(e.contains(&"minimum: must be a number".to_owned()), "{e:?}");
    }

    #[test]
    fn local_refs_are_inlined_and_bounded() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "$defs": {
                "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                "a~b/c": {"type": "integer"},
            },
            "definitions": {"n": {"minimum": 0}},
            "properties": {
                "home": {"$ref": "#/$defs/address"},
                "count": {"$ref": "#/$defs/a~0b~1c", "maximum": 9},
                "legacy": {"$ref": "#/definitions/n"},
                "spaced": {"$ref": "#/%24defs/address"},
            },
            "additionalProperties": false,
        });
        assert!(
            errors(
                schema.clone(),
                json!({"home": {"city": "Oslo"}, "count": 3, "legacy": 1})
            )
            .is_empty()
        );
        let e = errors(
            schema,
            json!({"home": {}, "count": 12, "legacy": -1, "spaced": {"city": 1}}),
        );
        assert!(
            e.contains(&"arguments.home: missing required property `city`".to_owned()),
            "{e:?}"
        );
        assert!(e.contains(&"arguments.count: must be <= 9".to_owned()), "{e:?}");
        assert!(e.contains(&"arguments.legacy: must be >= 0".to_owned()), "{e:?}");
        assert!(
            e.contains(&"arguments.spaced.city: expected string, got integer".to_owned()),
            "{e:?}"
        );

        let refused = |schema: Value, needle: &str| {
            let e = Schema::compile(&schema).unwrap_err();
            assert!(e.iter().any(|m| m.contains(needle)), "{needle:?} not in {e:?}");
        };
        refused(
            json!({"$ref": "https://example.com/s.json"}),
            "only local references",
        );
        refused(json!({"$ref": "#/$defs/none"}), "points at nothing");
        refused(json!({"$ref": 3}), "$ref: must be a string");
        refused(json!({"$defs": {"a": {"$ref": "#/$defs/a"}}}), "refers to itself");
        refused(
            json!({"$defs": {"a": {"items": {"$ref": "#/$defs/b"}}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
            "refers to itself",
        );
        refused(json!({"$ref": "#"}), "refers to itself");
        // Each definition references the previous one twice: 2^40 expansions if unbounded.
        let mut defs = Map::new();
        defs.insert("d0".into(), json!({"type": "string"}));
        for i in 1..=40 {
            let prev = format!("#/$defs/d{}", i - 1);
            defs.insert(
                format!("d{i}"),
                json!({"anyOf": [{"$ref": prev}, {"items": {"$ref": prev}}]}),
            );
        }
        refused(
            json!({"$defs": defs, "$ref": "#/$defs/d40"}),
            "more than 10000 subschemas",
        );
        // A chain of references deeper than the limit.
        let mut defs = Map::new();
        defs.insert("c0".into(), json!({"type": "string"}));
        for i in 1..=40 {
            defs.insert(format!("c{i}"), json!({"$ref": format!("#/$defs/c{}", i - 1)}));
        }
        refused(json!({"$defs": defs}), "nest more than 16 deep");
    }

    /// The 2020-12 vocabulary tool authors write (the conformance suite's fixture among it):
    /// composition, conditionals, anchors, extension keywords; each enforced, not skipped.
    #[test]
    fn conditionals_anchors_and_composition_are_enforced() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "$defs": {"address": {"$anchor": "addressDef", "type": "object",
                "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}},
            "properties": {
                "name": {"type": "string", "x-mcp-header": "Name"},
                "address": {"$ref": "#/$defs/address"},
                "home": {"$ref": "#addressDef"},
                "contactMethod": {"type": "string", "enum": ["phone", "email"]},
                "phone": {"type": "string"},
                "email": {"type": "string"},
            },
            "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
            "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
            "then": {"required": ["phone"]},
            "else": {"required": ["email"]},
            "additionalProperties": false,
        });
        assert!(errors(schema.clone(), json!({"email": "a@b"})).is_empty());
        assert!(errors(schema.clone(), json!({"contactMethod": "phone", "phone": "1"})).is_empty());
        let e = errors(schema.clone(), json!({"contactMethod": "phone", "email": "a@b"}));
        assert_eq!(e, vec!["arguments: missing required property `phone`"]);
        let e = errors(schema.clone(), json!({"phone": "1"}));
        assert_eq!(e, vec!["arguments: missing required property `email`"]);
        let e = errors(schema, json!({"email": "a", "home": {"city": 3}}));
        assert_eq!(e, vec!["arguments.home.city: expected string, got integer"]);

        let checks = json!({"type": "object", "not": {"required": ["x"]}, "minProperties": 1,
            "maxProperties": 2, "dependentRequired": {"a": ["b"]},
            "properties": {"n": {"multipleOf": 0.5}, "l": {"uniqueItems": true}}});
        assert!(errors(checks.clone(), json!({"n": 1.5, "l": [1, 2]})).is_empty());
        for (bad, needle) in [
            (json!({"x": 1}), "must not match the `not` schema"),
            (json!({}), "fewer than 1 properties"),
            (json!({"n": 1, "l": [], "y": 1}), "more than 2 properties"),
            (json!({"a": 1}), "`b` is required when `a` is present"),
            (json!({"n": 1.25}), "must be a multiple of 0.5"),
            (json!({"l": [1, {"k": 2}, 1.0]}), "item 2 repeats an earlier one"),
        ] {
            let e = errors(checks.clone(), bad.clone());
            assert!(
                e.iter().any(|m| m.contains(needle)),
                "{bad}: {needle:?} not in {e:?}"
            );
        }

        let refused = |schema: Value, needle: &str| {
            let e = Schema::compile(&schema).unwrap_err();
            assert!(e.iter().any(|m| m.contains(needle)), "{needle:?} not in {e:?}");
        };
        refused(json!({"$ref": "#nowhere"}), "no `$anchor` named \"nowhere\"");
        refused(json!({"$anchor": "1st"}), "$anchor: must be a name");
        refused(json!({"$anchor": 3}), "$anchor: must be a name");
        refused(
            json!({"multipleOf": 0}),
            "multipleOf: must be a number greater than 0",
        );
        refused(
            json!({"dependentRequired": {"a": [1]}}),
            "dependentRequired: must be an object",
        );
        refused(json!({"if": 3}), "if: a schema must be an object or a boolean");
        // An anchor that refers to itself is a cycle like any other.
        refused(
            json!({"$defs": {"a": {"$anchor": "a", "items": {"$ref": "#a"}}}, "$ref": "#a"}),
            "refers to itself",
        );
    }

    #[test]
    fn param_headers_are_declared_on_primitive_root_properties() {
        let s = Schema::compile(&json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "n": {"type": "integer", "x-mcp-header": "Count_2"},
            "deep": {"type": "object", "properties": {"x": {"type": "string", "x-mcp-header": "X"}}},
        }}))
        .unwrap();
        let mut got: Vec<(&str, &str)> = s.param_headers().iter().map(|(a, b)| (&**a, &**b)).collect();
        got.sort_unstable();
        assert_eq!(
            got,
            vec![("n", "mcp-param-count_2"), ("region", "mcp-param-region")]
        );
        assert!(
            Schema::compile(&json!({"type": "object"}))
                .unwrap()
                .param_headers()
                .is_empty()
        );
        let long = "h".repeat(MAX_PARAM_HEADER_LEN + 1);
        for (bad, needle) in [
            (
                json!({"a": {"type": "string", "x-mcp-header": "Bad Name"}}),
                "must be a header name",
            ),
            (
                json!({"a": {"type": "string", "x-mcp-header": "A\r\nX-Evil: 1"}}),
                "must be a header name",
            ),
            (
                json!({"a": {"type": "string", "x-mcp-header": ""}}),
                "must be a header name",
            ),
            (
                json!({"a": {"type": "string", "x-mcp-header": long}}),
                "must be a header name",
            ),
            (
                json!({"a": {"type": "string", "x-mcp-header": 7}}),
                "must be a header name",
            ),
            (
                json!({"a": {"type": "array", "x-mcp-header": "A"}}),
                "only a property of type",
            ),
            (json!({"a": {"x-mcp-header": "A"}}), "only a property of type"),
            (
                json!({"a": {"type": "number", "x-mcp-header": "A"}}),
                "only a property of type",
            ),
            (
                json!({"a": {"type": "string", "x-mcp-header": "Dup"}, "b": {"type": "string", "x-mcp-header": "dUP"}}),
                "declared by another property",
            ),
        ] {
            let e = Schema::compile(&json!({"type": "object", "properties": bad})).unwrap_err();
            assert!(e.iter().any(|m| m.contains(needle)), "{needle:?} not in {e:?}");
        }
    }

    #[test]
    fn shorthand_expands_required_and_optional() {
        let mut m = BTreeMap::new();
        m.insert("a".to_owned(), json!("number"));
        m.insert("b".to_owned(), json!("string?"));
        let s = expand_shorthand(&m).unwrap();
        assert_eq!(s["required"], json!(["a"]));
        assert_eq!(s["properties"]["b"], json!({"type": "string"}));
        m.insert("c".to_owned(), json!("strnig"));
        assert!(expand_shorthand(&m).unwrap_err()[0].contains("unknown type `strnig`"));
    }
}
