//! Answer projection: an http tool (or imported operation) that names field paths keeps only
//! those fields of its JSON answer, so a model reads `items[].metadata.name` instead of every
//! pod's whole manifest.
//!
//! A path is field names joined by `.`, where `[]` after a name (or at the start) stands for
//! every element of an array: `kind`, `items[].metadata.name`, `[].id`, `rows[][]`. The paths
//! are compiled once into a tree; a call walks the tree over the parsed answer, moving the
//! selected values out (no copies), so its cost is the answer's size, whatever its depth.

use serde_json::{Map, Value};

use crate::spec::context::Problems;

/// Most paths one tool may name.
pub const MAX_PROJECT_PATHS: usize = 64;
/// Longest path, in bytes.
pub const MAX_PATH_BYTES: usize = 256;
/// Most steps (names and `[]`) of one path.
pub const MAX_PATH_STEPS: usize = 16;
/// Most `$ref` hops followed while projecting an output schema.
const MAX_REF_HOPS: usize = 16;

/// Compiled field paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Projection {
    root: Node,
}

/// What is kept of one value: all of it, some of its fields, or something of each element.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Node {
    whole: bool,
    fields: Vec<(Box<str>, Node)>,
    each: Option<Box<Node>>,
}

/// One step of a path.
#[derive(Debug, PartialEq, Eq)]
enum Step<'a> {
    Field(&'a str),
    Each,
}

/// The steps of a path, or why it is not one.
fn parse(path: &str) -> Result<Vec<Step<'_>>, String> {
    if path.is_empty() {
        return Err("an empty path".to_owned());
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(format!("longer than {MAX_PATH_BYTES} bytes"));
    }
    let mut steps = Vec::new();
    for (i, part) in path.split('.').enumerate() {
        let name_end = part.find('[').unwrap_or(part.len());
        let (name, mut rest) = part.split_at(name_end);
        // Only the first part may be `[]` alone (an answer that is an array).
        if name.is_empty() && (i != 0 || rest.is_empty()) {
            return Err("an empty field name (two `.` in a row, or one at an end)".to_owned());
        }
        if let Some(c) = name
            .chars()
            .find(|c| matches!(c, ']' | '*') || c.is_whitespace() || c.is_control())
        {
            return Err(format!("`{}` in a field name", c.escape_debug()));
        }
        if !name.is_empty() {
            steps.push(Step::Field(name));
        }
        while !rest.is_empty() {
            rest = rest
                .strip_prefix("[]")
                .ok_or("`[` must be followed by `]` (`[]` is every element of an array)")?;
            steps.push(Step::Each);
        }
    }
    if steps.len() > MAX_PATH_STEPS {
        return Err(format!("more than {MAX_PATH_STEPS} steps"));
    }
    Ok(steps)
}

impl Node {
    fn insert(&mut self, steps: &[Step<'_>]) {
        let Some((first, rest)) = steps.split_first() else {
            self.whole = true;
            return;
        };
        let child = match first {
            Step::Each => &mut **self.each.get_or_insert_with(Box::default),
            Step::Field(name) => {
                let i = match self.fields.iter().position(|(k, _)| &**k == *name) {
                    Some(i) => i,
                    None => {
                        self.fields.push(((*name).into(), Node::default()));
                        self.fields.len() - 1
                    }
                };
                &mut self.fields[i].1
            }
        };
        child.insert(rest);
    }

    /// What is kept of `v`: `None` when it has not the shape the paths select from.
    fn pick(&self, v: Value) -> Option<Value> {
        if self.whole {
            return Some(v);
        }
        match v {
            Value::Object(mut m) if !self.fields.is_empty() => {
                let mut out = Map::new();
                for (k, child) in &self.fields {
                    if let Some(x) = m.remove(&**k).and_then(|x| child.pick(x)) {
                        out.insert(k.to_string(), x);
                    }
                }
                Some(Value::Object(out))
            }
            Value::Array(items) => {
                let each = self.each.as_deref()?;
                Some(Value::Array(
                    items.into_iter().filter_map(|x| each.pick(x)).collect(),
                ))
            }
            _ => None,
        }
    }
}

/// Compiles `paths` (the `project` list at `at`); `None` when empty. Bad paths are problems
/// at `at[i]`.
pub fn compile(paths: &[String], at: &str, p: &mut Problems) -> Option<Projection> {
    if paths.is_empty() {
        return None;
    }
    if paths.len() > MAX_PROJECT_PATHS {
        p.push(at, format!("at most {MAX_PROJECT_PATHS} paths"));
        return None;
    }
    let mut root = Node::default();
    let mut ok = true;
    for (i, path) in paths.iter().enumerate() {
        match parse(path) {
            Ok(steps) => root.insert(&steps),
            Err(e) => {
                p.push(format!("{at}[{i}]"), e);
                ok = false;
            }
        }
    }
    ok.then_some(Projection { root })
}

impl Projection {
    /// The projection of a parsed answer; `None` when its top has not the shape the paths
    /// select from (an object for field paths, an array for `[]` paths), and the answer is
    /// then kept as it came.
    pub fn apply(&self, answer: Value) -> Option<Value> {
        self.root.pick(answer)
    }

    /// The output schema of the projected answer, from the schema `s` of the whole answer
    /// (an object schema, its `$defs` at the top): the selected properties, none of them
    /// required (a missing field is left out). `None` when it cannot be told faithfully: a
    /// step under `allOf`/`anyOf`/`oneOf`/`not`/`if`, an unresolvable `$ref`, or a top that
    /// is an array.
    pub fn output_schema(&self, s: &Value) -> Option<Value> {
        if self.root.fields.is_empty() {
            return None;
        }
        let defs = s.get("$defs");
        let mut out = shape(&self.root, s, defs)?;
        if let Some(d) = defs.and_then(Value::as_object) {
            let kept = reached(&out, d);
            if !kept.is_empty()
                && let Some(o) = out.as_object_mut()
            {
                o.insert("$defs".into(), Value::Object(kept));
            }
        }
        Some(out)
    }
}

/// The `$defs` entries that `s` refers to, directly or through one another.
fn reached(s: &Value, defs: &Map<String, Value>) -> Map<String, Value> {
    let mut kept = Map::new();
    let mut todo = vec![s];
    while let Some(v) = todo.pop() {
        match v {
            Value::Object(o) => {
                if let Some(name) = o
                    .get("$ref")
                    .and_then(Value::as_str)
                    .and_then(|r| r.strip_prefix("#/$defs/"))
                    .map(|n| n.replace("~1", "/").replace("~0", "~"))
                    && !kept.contains_key(&name)
                    && let Some(d) = defs.get(&name)
                {
                    kept.insert(name, d.clone());
                    todo.push(d);
                }
                todo.extend(o.values());
            }
            Value::Array(a) => todo.extend(a),
            _ => {}
        }
    }
    kept
}

/// `s` with local references (`#/$defs/NAME`) followed.
fn resolve<'a>(mut s: &'a Value, defs: Option<&'a Value>) -> Option<&'a Value> {
    for _ in 0..MAX_REF_HOPS {
        let Some(r) = s.get("$ref").and_then(Value::as_str) else {
            return Some(s);
        };
        let name = r.strip_prefix("#/$defs/")?.replace("~1", "/").replace("~0", "~");
        s = defs?.get(&name)?;
    }
    None
}

/// The schema of what `node` keeps of a value of schema `s`.
fn shape(node: &Node, s: &Value, defs: Option<&Value>) -> Option<Value> {
    if node.whole {
        return Some(s.clone());
    }
    let s = resolve(s, defs)?;
    let Some(obj) = s.as_object() else {
        // `true` (anything) projects to anything; `false` stays nothing.
        return Some(s.clone());
    };
    if ["allOf", "anyOf", "oneOf", "not", "if", "$dynamicRef"]
        .iter()
        .any(|k| obj.contains_key(*k))
    {
        return None;
    }
    let mut out = Map::new();
    for k in ["type", "title", "description", "nullable"] {
        if let Some(v) = obj.get(k) {
            out.insert(k.into(), v.clone());
        }
    }
    if !node.fields.is_empty() {
        let mut props = Map::new();
        for (k, child) in &node.fields {
            let sub = obj
                .get("properties")
                .and_then(|p| p.get(&**k))
                .or_else(|| obj.get("additionalProperties"))
                .unwrap_or(&Value::Bool(true));
            if sub == &Value::Bool(false) {
                continue;
            }
            props.insert(k.to_string(), shape(child, sub, defs)?);
        }
        out.insert("properties".into(), Value::Object(props));
    }
    if let Some(each) = &node.each {
        if obj.contains_key("prefixItems") {
            return None;
        }
        let items = obj.get("items").unwrap_or(&Value::Bool(true));
        out.insert("items".into(), shape(each, items, defs)?);
    }
    Some(Value::Object(out))
}

#[cfg(test)]
#[path = "project_tests.rs"]
mod tests;
