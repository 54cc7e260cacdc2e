//! `{{ path | filter }}` text templates, compiled once into token lists and rendered
//! against JSON values without re-parsing.

use std::fmt::{self, Write as _};

use serde_json::Value;

/// The most bytes one rendering may produce. A template that names a caller's value many
/// times (`{{x}}{{x}}...`) would otherwise turn a 4 MiB request into gigabytes.
pub const MAX_RENDERED_BYTES: usize = 16 << 20;

/// A rendering stopped because it would have produced more than [`MAX_RENDERED_BYTES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLarge;

impl fmt::Display for TooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the rendered text would exceed {} MiB",
            MAX_RENDERED_BYTES >> 20
        )
    }
}

impl std::error::Error for TooLarge {}

/// Bytes left to render; shared by every template of one rendering (a JSON body, an argv).
#[derive(Debug)]
pub struct Budget(usize);

impl Budget {
    /// A fresh budget of [`MAX_RENDERED_BYTES`].
    pub const fn new() -> Self {
        Self(MAX_RENDERED_BYTES)
    }

    /// Takes `n` bytes from the budget.
    ///
    /// # Errors
    /// When fewer than `n` are left.
    pub fn take(&mut self, n: usize) -> Result<(), TooLarge> {
        self.0 = self.0.checked_sub(n).ok_or(TooLarge)?;
        Ok(())
    }
}

impl Default for Budget {
    fn default() -> Self {
        Self::new()
    }
}

/// About how many bytes a JSON value takes in memory (its strings, plus a word per node),
/// measured without recursion.
pub fn approx_size(v: &Value) -> usize {
    let mut total = 0usize;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        total = total.saturating_add(16);
        match v {
            Value::String(s) => total = total.saturating_add(s.len()),
            Value::Array(a) => stack.extend(a),
            Value::Object(o) => {
                for (k, x) in o {
                    total = total.saturating_add(k.len());
                    stack.push(x);
                }
            }
            _ => {}
        }
    }
    total
}

/// How deeply a JSON value nests (a scalar is 1), measured without recursion.
pub fn depth(v: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(v, 1usize)];
    while let Some((v, d)) = stack.pop() {
        deepest = deepest.max(d);
        match v {
            Value::Array(a) => stack.extend(a.iter().map(|x| (x, d + 1))),
            Value::Object(o) => stack.extend(o.values().map(|x| (x, d + 1))),
            _ => {}
        }
    }
    deepest
}

/// One segment of a dotted variable path: `steps.0.text` is `[steps, 0, text]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    key: Box<str>,
    index: Option<usize>,
}

/// A filter applied to a substituted value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// JSON-encode the value (strings get quotes).
    Json,
    /// Percent-encode for a URL component.
    Url,
    /// Upper-case.
    Upper,
    /// Lower-case.
    Lower,
    /// Trim surrounding whitespace.
    Trim,
    /// In URL templates: insert the value as is instead of percent-encoding it.
    Raw,
}

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Lit(Box<str>),
    Var {
        path: Box<[Segment]>,
        filters: Box<[Filter]>,
    },
}

/// A compiled text template.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    parts: Box<[Part]>,
    /// Bytes of literal text: a capacity hint for rendering.
    literal_len: usize,
}

impl Template {
    /// The template with each placeholder written `{}`: its literal text only, which holds
    /// no argument, claim or secret (for traces).
    pub fn shape(&self) -> String {
        let mut out = String::with_capacity(self.literal_len + 2 * self.parts.len());
        for p in &*self.parts {
            match p {
                Part::Lit(l) => out.push_str(l),
                Part::Var { .. } => out.push_str("{}"),
            }
        }
        out
    }
}

/// Template text as the ToolSet's author wrote it: the only text [`Template::compile`] and
/// [`JsonTemplate::compile`] parse. Text from anywhere else (an OpenAPI document, an
/// upstream's tool list, anything fetched or refreshed) is data: it enters a template only
/// through [`Template::literal`] or [`TemplateBuilder::lit`], never parsed, so a
/// `{{secret.NAME.KEY}}` in it stays those characters and reads nothing.
///
/// Construct one only from a field of the ToolSet document itself; the files allowed to
/// are listed in this module's tests (`authored_text_is_made_only_where_the_toolset_is_compiled`).
#[derive(Debug, Clone, Copy)]
pub struct Authored<'a, T: ?Sized = str>(&'a T);

impl<'a> Authored<'a> {
    /// Text of a ToolSet field, as its author wrote it.
    pub const fn new(text: &'a str) -> Self {
        Self(text)
    }
}

impl<'a> Authored<'a, Value> {
    /// A JSON value of a ToolSet field (a body, a pipeline step's input), as its author wrote it.
    pub const fn json(value: &'a Value) -> Self {
        Self(value)
    }
}

/// A template assembled from literal text and variables, for text that is not the author's:
/// nothing given to [`Self::lit`] is parsed.
#[derive(Debug, Default)]
pub struct TemplateBuilder {
    parts: Vec<Part>,
    literal_len: usize,
}

impl TemplateBuilder {
    /// Appends literal text (sent, shown or rendered as it is).
    #[must_use]
    pub fn lit(mut self, text: &str) -> Self {
        if text.is_empty() {
            return self;
        }
        self.literal_len += text.len();
        if let Some(Part::Lit(prev)) = self.parts.last_mut() {
            let mut joined = String::with_capacity(prev.len() + text.len());
            joined.push_str(prev);
            joined.push_str(text);
            *prev = joined.into();
        } else {
            self.parts.push(Part::Lit(text.into()));
        }
        self
    }

    /// Appends the parts of `t` (text and variables as they are in it).
    #[must_use]
    pub fn append(mut self, t: &Template) -> Self {
        for part in &*t.parts {
            match part {
                Part::Lit(text) => self = self.lit(text),
                var => self.parts.push(var.clone()),
            }
        }
        self
    }

    /// Appends a variable: `path` segment by segment (e.g. `["secret", "api", "token"]`),
    /// with `filters` applied in order.
    ///
    /// # Errors
    /// An empty path, or a segment that is not letters, digits, `_` and `-`.
    pub fn var(mut self, path: &[&str], filters: &[Filter]) -> Result<Self, String> {
        if path.is_empty() {
            return Err("an empty variable path".to_owned());
        }
        let mut segments = Vec::with_capacity(path.len());
        for seg in path {
            segments.push(segment(seg).ok_or_else(|| {
                format!(
                    "`{}` is not a variable name (letters, digits, `_`, `-`)",
                    seg.chars().take(64).collect::<String>()
                )
            })?);
        }
        self.parts.push(Part::Var {
            path: segments.into(),
            filters: filters.into(),
        });
        Ok(self)
    }

    /// The template.
    pub fn build(self) -> Template {
        Template {
            parts: self.parts.into(),
            literal_len: self.literal_len,
        }
    }
}

fn segment(seg: &str) -> Option<Segment> {
    let ok = !seg.is_empty()
        && seg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    ok.then(|| Segment {
        key: seg.into(),
        index: seg.parse().ok(),
    })
}

/// Where a template's variables are looked up.
pub trait Scope {
    /// The value bound to a top-level name, if any.
    fn get(&self, name: &str) -> Option<&Value>;
}

impl Scope for Value {
    fn get(&self, name: &str) -> Option<&Value> {
        self.as_object().and_then(|o| o.get(name))
    }
}

impl Template {
    /// Compiles the author's template text `src`.
    ///
    /// # Errors
    /// An unclosed `{{`, an empty or malformed path, or an unknown filter.
    pub fn compile(src: Authored<'_>) -> Result<Self, String> {
        let src = src.0;
        let mut parts = Vec::new();
        let mut rest = src;
        let mut literal_len = 0;
        while let Some(start) = rest.find("{{") {
            if start > 0 {
                literal_len += start;
                parts.push(Part::Lit(rest[..start].into()));
            }
            let after = &rest[start + 2..];
            let end = after
                .find("}}")
                .ok_or_else(|| format!("unclosed `{{{{` at byte {}", src.len() - rest.len() + start))?;
            parts.push(parse_var(after[..end].trim())?);
            rest = &after[end + 2..];
        }
        if !rest.is_empty() {
            literal_len += rest.len();
            parts.push(Part::Lit(rest.into()));
        }
        Ok(Self {
            parts: parts.into(),
            literal_len,
        })
    }

    /// A template of literal text only: `text` is not parsed, whatever it contains.
    pub fn literal(text: &str) -> Self {
        TemplateBuilder::default().lit(text).build()
    }

    /// A template to assemble from literal text and variables.
    pub fn builder() -> TemplateBuilder {
        TemplateBuilder::default()
    }

    /// The template of no text.
    pub fn empty() -> Self {
        Self {
            parts: Box::new([]),
            literal_len: 0,
        }
    }

    /// True when the template has no variables.
    pub fn is_literal(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Part::Lit(_)))
    }

    /// The path of the single variable when the template is exactly `{{path}}` with no filters.
    fn sole_variable(&self) -> Option<&[Segment]> {
        match &*self.parts {
            [Part::Var { path, filters }] if filters.is_empty() => Some(path),
            _ => None,
        }
    }

    /// The first segment of every variable path (the names a scope must bind).
    pub fn roots(&self) -> impl Iterator<Item = (&str, Option<usize>)> + '_ {
        self.parts.iter().filter_map(|p| match p {
            Part::Var { path, .. } => Some((&*path[0].key, path.get(1).and_then(|s| s.index))),
            Part::Lit(_) => None,
        })
    }

    /// Every variable path whose first segment is `root`, segment by segment (e.g. the
    /// `secret.NAME.KEY` references of a template).
    pub fn paths_under<'a>(&'a self, root: &'a str) -> impl Iterator<Item = Vec<&'a str>> + 'a {
        self.parts.iter().filter_map(move |p| match p {
            Part::Var { path, .. } if &*path[0].key == root => Some(path.iter().map(|s| &*s.key).collect()),
            _ => None,
        })
    }

    /// True when the template starts with a substituted value rather than literal text.
    pub fn starts_with_variable(&self) -> bool {
        matches!(self.parts.first(), Some(Part::Var { .. }))
    }

    /// The literal text before the first variable (all of it for a literal template).
    pub fn literal_prefix(&self) -> &str {
        match self.parts.first() {
            Some(Part::Lit(s)) => s,
            _ => "",
        }
    }

    /// Renders into `out`, taking what it appends from `budget`. Missing variables render
    /// as nothing.
    ///
    /// # Errors
    /// The budget ran out; `out` then holds a partial rendering.
    pub fn render_into(
        &self,
        scope: &dyn Scope,
        out: &mut String,
        budget: &mut Budget,
    ) -> Result<(), TooLarge> {
        for part in &*self.parts {
            let before = out.len();
            match part {
                Part::Lit(s) => out.push_str(s),
                Part::Var { path, filters } => {
                    if let Some(v) = resolve(scope, path) {
                        apply(v, filters, out);
                    }
                }
            }
            budget.take(out.len() - before)?;
        }
        Ok(())
    }

    /// Renders a URL: substituted values are percent-encoded unless filtered `url` or `raw`.
    ///
    /// # Errors
    /// The URL would exceed [`MAX_RENDERED_BYTES`].
    pub fn render_url(&self, scope: &dyn Scope) -> Result<String, TooLarge> {
        let mut budget = Budget::new();
        let mut out = String::with_capacity(self.literal_len + 16);
        for part in &*self.parts {
            let before = out.len();
            match part {
                Part::Lit(s) => out.push_str(s),
                Part::Var { path, filters } => {
                    let Some(v) = resolve(scope, path) else { continue };
                    if filters.iter().any(|f| matches!(f, Filter::Raw | Filter::Url)) {
                        apply(v, filters, &mut out);
                    } else {
                        let mut s = String::new();
                        apply(v, filters, &mut s);
                        out.push_str(&percent_encode(&s));
                    }
                }
            }
            budget.take(out.len() - before)?;
        }
        Ok(out)
    }

    /// Renders to a new string.
    ///
    /// # Errors
    /// The text would exceed [`MAX_RENDERED_BYTES`].
    pub fn render(&self, scope: &dyn Scope) -> Result<String, TooLarge> {
        self.render_with(scope, &mut Budget::new())
    }

    /// Renders to a new string, taking its bytes from a shared budget.
    ///
    /// # Errors
    /// The budget ran out.
    pub fn render_with(&self, scope: &dyn Scope, budget: &mut Budget) -> Result<String, TooLarge> {
        let mut out = String::with_capacity(self.literal_len + 16);
        self.render_into(scope, &mut out, budget)?;
        Ok(out)
    }
}

fn parse_var(expr: &str) -> Result<Part, String> {
    let mut pieces = expr.split('|');
    let path_src = pieces.next().unwrap_or_default().trim();
    if path_src.is_empty() {
        return Err("empty `{{ }}`".to_owned());
    }
    let mut path = Vec::new();
    for seg in path_src.split('.') {
        path.push(segment(seg).ok_or_else(|| {
            format!("`{path_src}` is not a variable path (letters, digits, `_`, `-`, joined by `.`)")
        })?);
    }
    let filters = pieces
        .map(|f| match f.trim() {
            "json" => Ok(Filter::Json),
            "url" => Ok(Filter::Url),
            "upper" => Ok(Filter::Upper),
            "lower" => Ok(Filter::Lower),
            "trim" => Ok(Filter::Trim),
            "raw" => Ok(Filter::Raw),
            other => Err(format!(
                "unknown filter `{other}` (json, url, upper, lower, trim, raw)"
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Part::Var {
        path: path.into(),
        filters: filters.into(),
    })
}

fn resolve<'a>(scope: &'a dyn Scope, path: &[Segment]) -> Option<&'a Value> {
    let mut v = scope.get(&path[0].key)?;
    for seg in &path[1..] {
        v = match v {
            Value::Object(o) => o.get(&*seg.key)?,
            Value::Array(a) => a.get(seg.index?)?,
            _ => return None,
        };
    }
    Some(v)
}

/// Appends the text form of a value: strings raw, null as nothing, the rest as JSON.
pub fn push_value(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => out.push_str(s),
        Value::Null => {}
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        other => out.push_str(&other.to_string()),
    }
}

fn apply(v: &Value, filters: &[Filter], out: &mut String) {
    if filters.is_empty() {
        return push_value(v, out);
    }
    let mut s = String::new();
    let mut first = true;
    for f in filters {
        if first {
            first = false;
            if *f == Filter::Json {
                s = v.to_string();
                continue;
            }
            push_value(v, &mut s);
        }
        s = match f {
            Filter::Json => Value::String(s).to_string(),
            Filter::Url => percent_encode(&s),
            Filter::Upper => s.to_uppercase(),
            Filter::Lower => s.to_lowercase(),
            Filter::Trim => s.trim().to_owned(),
            Filter::Raw => s,
        };
    }
    out.push_str(&s);
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A JSON value whose strings are templates. A string that is exactly `{{path}}`
/// substitutes the bound value with its JSON type intact.
#[derive(Debug, Clone, PartialEq)]
pub enum JsonTemplate {
    /// A value with no templates in it.
    Const(Value),
    /// A string template.
    Text(Template),
    /// Exactly one variable: the bound value, typed.
    Typed(Template),
    /// An array of templates.
    Array(Vec<JsonTemplate>),
    /// An object of templates (keys are literal).
    Object(Vec<(String, JsonTemplate)>),
}

impl JsonTemplate {
    /// Compiles every string inside `v`.
    ///
    /// # Errors
    /// The first malformed template, with its JSON path.
    pub fn compile(v: Authored<'_, Value>) -> Result<Self, String> {
        Self::compile_value(v.0)
    }

    fn compile_value(v: &Value) -> Result<Self, String> {
        Ok(match v {
            Value::String(s) => {
                let t = Template::compile(Authored::new(s))?;
                if t.is_literal() {
                    Self::Const(v.clone())
                } else if t.sole_variable().is_some() {
                    Self::Typed(t)
                } else {
                    Self::Text(t)
                }
            }
            Value::Array(a) => Self::Array(
                a.iter()
                    .enumerate()
                    .map(|(i, x)| Self::compile_value(x).map_err(|e| format!("[{i}]: {e}")))
                    .collect::<Result<_, _>>()?,
            ),
            Value::Object(o) => Self::Object(
                o.iter()
                    .map(|(k, x)| {
                        Ok((
                            k.clone(),
                            Self::compile_value(x).map_err(|e| format!(".{k}: {e}"))?,
                        ))
                    })
                    .collect::<Result<_, String>>()?,
            ),
            other => Self::Const(other.clone()),
        })
    }

    /// Every template inside, for checking the names they use.
    pub fn templates(&self) -> Vec<&Template> {
        let mut out = Vec::new();
        self.collect(&mut out);
        out
    }

    fn collect<'a>(&'a self, out: &mut Vec<&'a Template>) {
        match self {
            Self::Const(_) => {}
            Self::Text(t) | Self::Typed(t) => out.push(t),
            Self::Array(a) => a.iter().for_each(|x| x.collect(out)),
            Self::Object(o) => o.iter().for_each(|(_, x)| x.collect(out)),
        }
    }

    /// Renders to a JSON value.
    ///
    /// # Errors
    /// The value would take more than [`MAX_RENDERED_BYTES`] (a value substituted many
    /// times counts each time).
    pub fn render(&self, scope: &dyn Scope) -> Result<Value, TooLarge> {
        self.render_with(scope, &mut Budget::new())
    }

    fn render_with(&self, scope: &dyn Scope, budget: &mut Budget) -> Result<Value, TooLarge> {
        // Nesting is bounded when the ToolSet is compiled (config::MAX_VALUE_DEPTH), so
        // this recursion is too.
        Ok(match self {
            Self::Const(v) => {
                budget.take(approx_size(v))?;
                v.clone()
            }
            Self::Text(t) => Value::String(t.render_with(scope, budget)?),
            Self::Typed(t) => match t.sole_variable().and_then(|p| resolve(scope, p)) {
                Some(v) => {
                    budget.take(approx_size(v))?;
                    v.clone()
                }
                None => Value::Null,
            },
            Self::Array(a) => Value::Array(
                a.iter()
                    .map(|x| x.render_with(scope, budget))
                    .collect::<Result<_, _>>()?,
            ),
            Self::Object(o) => Value::Object(
                o.iter()
                    .map(|(k, x)| Ok((k.clone(), x.render_with(scope, budget)?)))
                    .collect::<Result<_, TooLarge>>()?,
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_literals_paths_and_filters() {
        let t = Template::compile(Authored::new(
            "Hi {{ name | upper }}, {{steps.1.text}}!{{missing}}",
        ))
        .unwrap();
        let scope = json!({"name": "ada", "steps": [{"text": "x"}, {"text": "y"}]});
        assert_eq!(t.render(&scope).unwrap(), "Hi ADA, y!");
        let roots: Vec<_> = t.roots().collect();
        assert_eq!(roots, vec![("name", None), ("steps", Some(1)), ("missing", None)]);
    }

    #[test]
    fn url_and_json_filters() {
        let scope = json!({"q": "a b&c", "n": 3});
        assert_eq!(
            Template::compile(Authored::new("{{q|url}}"))
                .unwrap()
                .render(&scope)
                .unwrap(),
            "a%20b%26c"
        );
        assert_eq!(
            Template::compile(Authored::new("{{q|json}}"))
                .unwrap()
                .render(&scope)
                .unwrap(),
            "\"a b&c\""
        );
        assert_eq!(
            Template::compile(Authored::new("{{n}}"))
                .unwrap()
                .render(&scope)
                .unwrap(),
            "3"
        );
    }

    #[test]
    fn url_rendering_encodes_unless_raw() {
        let scope = json!({"c": "São Paulo/x", "p": "a/b"});
        let t = Template::compile(Authored::new("http://h/w?c={{c}}&p={{p|raw}}")).unwrap();
        assert_eq!(
            t.render_url(&scope).unwrap(),
            "http://h/w?c=S%C3%A3o%20Paulo%2Fx&p=a/b"
        );
    }

    #[test]
    fn rejects_malformed_templates() {
        assert!(
            Template::compile(Authored::new("{{ open"))
                .unwrap_err()
                .contains("unclosed")
        );
        assert!(
            Template::compile(Authored::new("{{}}"))
                .unwrap_err()
                .contains("empty")
        );
        assert!(
            Template::compile(Authored::new("{{a|nope}}"))
                .unwrap_err()
                .contains("unknown filter")
        );
        assert!(
            Template::compile(Authored::new("{{a b}}"))
                .unwrap_err()
                .contains("not a variable path")
        );
    }

    #[test]
    fn json_templates_keep_types() {
        let t = JsonTemplate::compile(Authored::json(
            &json!({"n": "{{n}}", "s": "n={{n}}", "k": [1, "{{flag}}"]}),
        ))
        .unwrap();
        let out = t.render(&json!({"n": 2.5, "flag": true})).unwrap();
        assert_eq!(out, json!({"n": 2.5, "s": "n=2.5", "k": [1, true]}));
    }

    #[test]
    fn repeating_a_value_cannot_blow_up_a_rendering() {
        let big = "x".repeat(2 << 20);
        let scope = json!({ "x": big });
        let ten = "{{x}}".repeat(10);
        assert_eq!(
            Template::compile(Authored::new(&ten)).unwrap().render(&scope),
            Err(TooLarge)
        );
        assert_eq!(
            Template::compile(Authored::new(&format!("http://h/{ten}")))
                .unwrap()
                .render_url(&scope),
            Err(TooLarge)
        );
        let typed = JsonTemplate::compile(Authored::json(&Value::Array(vec![json!("{{x}}"); 10]))).unwrap();
        assert_eq!(typed.render(&scope), Err(TooLarge));
        // Under the budget the same templates render in full.
        let seven = "{{x}}".repeat(7);
        assert_eq!(
            Template::compile(Authored::new(&seven))
                .unwrap()
                .render(&scope)
                .unwrap()
                .len(),
            7 * (2 << 20)
        );
        assert_eq!(
            JsonTemplate::compile(Authored::json(&Value::Array(vec![json!("{{x}}"); 7])))
                .unwrap()
                .render(&scope)
                .unwrap()[6],
            scope["x"]
        );
    }

    #[test]
    fn depth_and_size_are_measured_without_recursion() {
        let mut v = json!(1);
        for _ in 0..100_000 {
            v = Value::Array(vec![v]);
        }
        assert_eq!(depth(&v), 100_001);
        assert!(approx_size(&v) > 100_000);
        assert_eq!(depth(&json!({"a": [1, {"b": 2}]})), 4);
        // Dropping such a value recurses in serde_json; leak it instead of testing that here.
        std::mem::forget(v);
    }

    /// Where [`Authored`] text is made: only where the ToolSet's own fields are compiled. A
    /// new site fails here on purpose; add it only if what it wraps is a field the ToolSet's
    /// author wrote, never text of a document, an upstream or anything fetched.
    #[test]
    fn authored_text_is_made_only_where_the_toolset_is_compiled() {
        let expected: &[(&str, usize)] = &[
            ("config/compile.rs", 3),
            ("config/openapi/mod.rs", 2),
            ("config/openapi/operation.rs", 1),
            ("config/upstream/mod.rs", 3),
            ("handlers/ask/mod.rs", 3),
            ("handlers/content/mod.rs", 1),
            ("handlers/exec/mod.rs", 3),
            ("handlers/http/mod.rs", 3),
            ("config/steps.rs", 2),
            ("handlers/template.rs", 1),
            // `identity.client.secret` of an upstream: one `{{secret.NAME.KEY}}` the author wrote.
            ("spec/identity.rs", 1),
        ];
        // In the importers, only these arguments: their own settings' values (`v`, `value`:
        // of `headers`, `fetch.headers`, `env`) and an upstream's literal `url`.
        let importer_args = ["v", "value", "&h.url"];
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut found = std::collections::BTreeMap::new();
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let rel = path
                    .strip_prefix(&root)
                    .unwrap()
                    .to_string_lossy()
                    .replace('\\', "/");
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                if rel == "template.rs"
                    || name.ends_with("_tests.rs")
                    || name == "tests.rs"
                    || !name.ends_with(".rs")
                {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                // Production code only: a file's unit tests follow its `#[cfg(test)]` module.
                let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
                for line in code
                    .lines()
                    .filter(|l| l.contains("Authored::new(") || l.contains("Authored::json("))
                {
                    *found.entry(rel.clone()).or_insert(0usize) += 1;
                    if rel.starts_with("config/openapi/")
                        || rel.starts_with("config/upstream/")
                        || rel.starts_with("upstream/")
                        || rel.starts_with("reload/")
                    {
                        let arg = line
                            .split_once("Authored::new(")
                            .or_else(|| line.split_once("Authored::json("))
                            .map_or("", |(_, rest)| rest.split(')').next().unwrap_or(""));
                        assert!(
                            importer_args.contains(&arg),
                            "{rel}: `{}` makes author template text in an importer: document and upstream text is literal (Template::literal, Template::builder)",
                            line.trim()
                        );
                    }
                }
            }
        }
        let expected: std::collections::BTreeMap<String, usize> =
            expected.iter().map(|(f, n)| ((*f).to_owned(), *n)).collect();
        assert_eq!(
            found, expected,
            "Authored text is made at other places than reviewed"
        );
    }
}
