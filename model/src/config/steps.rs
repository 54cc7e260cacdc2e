//! A pipeline's steps, compiled: what each runs (a tool, or a value built from earlier
//! steps), the steps it needs (in order, or a graph checked for cycles), its condition, its
//! `forEach` and its retries. A step's templates may read only the steps it needs, directly
//! or through others, so what they see never depends on which branch finished first.

use std::time::Duration;

use rustc_hash::FxHashMap;
use serde_json::Value;

use crate::config::policy::Condition;
use crate::handlers::pipeline::{
    DEFAULT_FOR_EACH_ITEMS, MAX_ATTEMPTS, MAX_BACKOFF, MAX_FOR_EACH_ITEMS, MAX_PARALLEL,
    MAX_STEPS_PER_PIPELINE, OnAnswer, PipelineStep,
};
use crate::spec::checks::shallow;
use crate::spec::context::{Cx, Names, Problems, check_template, checked_template};
use crate::spec::shared::LogLevel;
use crate::template::{Authored, JsonTemplate, Template};

/// What a step runs.
#[derive(Debug)]
pub enum StepRun {
    /// A tool, by its index in [`crate::config::CompiledToolSet::tools`].
    Tool(usize),
    /// A value built from the arguments and earlier steps.
    Result(JsonTemplate),
}

/// A step run once per element of an array.
#[derive(Debug)]
pub struct ForEach {
    /// The array (a template of exactly one value).
    pub items: JsonTemplate,
    /// Runs at the same time.
    pub max_parallel: usize,
    /// Most elements.
    pub max_items: usize,
}

/// Retries of a failing step.
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    /// Attempts in all.
    pub attempts: u32,
    /// Wait before the first retry, doubled before each next one.
    pub backoff: Duration,
}

/// A compiled pipeline step.
#[derive(Debug)]
pub struct Step {
    /// What it runs.
    pub run: StepRun,
    /// Argument template; `None` passes the pipeline's arguments.
    pub input: Option<JsonTemplate>,
    /// A log message sent to the client as the step starts, and its level.
    pub log: Option<(LogLevel, Template)>,
    /// Its `id`: its result is `steps.ID` as well as `steps.N`.
    pub id: Option<Box<str>>,
    /// The steps that finish before it starts (the one before it, unless the pipeline is a
    /// graph).
    pub needs: Box<[usize]>,
    /// Every step it needs, directly or through others (sorted): what its condition sees.
    pub ancestors: Box<[usize]>,
    /// It runs only when this holds.
    pub when: Option<Condition>,
    /// It runs once per element of an array.
    pub for_each: Option<ForEach>,
    /// Its retries.
    pub retry: Option<Retry>,
    /// What a declined form does.
    pub on_decline: OnAnswer,
    /// What a cancelled form does.
    pub on_cancel: OnAnswer,
}

impl Step {
    /// The tool it runs, if it runs one.
    pub fn tool(&self) -> Option<usize> {
        match self.run {
            StepRun::Tool(t) => Some(t),
            StepRun::Result(_) => None,
        }
    }

    /// How many times one call may run its tool at most: elements times attempts.
    pub fn runs(&self) -> usize {
        let items = self.for_each.as_ref().map_or(1, |f| f.max_items);
        let attempts = self.retry.map_or(1, |r| r.attempts as usize);
        items.saturating_mul(attempts)
    }
}

/// Whether the steps run one after the other, in order (no `needs`, no `forEach`): a
/// chain, which may be run part by part.
pub fn is_chain(steps: &[Step]) -> bool {
    steps.iter().enumerate().all(|(i, s)| {
        s.for_each.is_none()
            && (if i == 0 {
                s.needs.is_empty()
            } else {
                *s.needs == [i - 1]
            })
    })
}

fn valid_id(id: &str) -> bool {
    (1..=63).contains(&id.len())
        && id.starts_with(|c: char| c.is_ascii_lowercase())
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-'))
}

/// Compiles a `pipeline` spec (steps name tools by `cx.index`).
pub fn compile(specs: &[PipelineStep], cx: &mut Cx<'_>) -> Vec<Step> {
    let at = cx.at.clone();
    if specs.is_empty() {
        cx.p.push(&at, "must have at least one step");
    }
    if specs.len() > MAX_STEPS_PER_PIPELINE {
        cx.p.push(
            &at,
            format!("{} steps; at most {MAX_STEPS_PER_PIPELINE}", specs.len()),
        );
        return Vec::new();
    }
    let ids = step_ids(specs, &at, cx.p);
    let graph = specs.iter().any(|s| !s.needs.is_empty());
    let needs: Vec<Vec<usize>> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| match (graph, i) {
            (true, _) => resolve_needs(s, i, &ids, &format!("{at}[{i}]"), cx.p),
            (false, 0) => Vec::new(),
            (false, _) => vec![i - 1],
        })
        .collect();
    let Some(ancestors) = ancestors(specs, &needs, &at, cx.p) else {
        return Vec::new();
    };
    let mut out = Vec::with_capacity(specs.len());
    for (i, s) in specs.iter().enumerate() {
        let sp = format!("{at}[{i}]");
        let refs = StepRefs {
            ids: &ids,
            ancestors: &ancestors[i],
            this: i,
        };
        if let Some(step) = compile_step(s, &sp, &refs, needs[i].clone(), cx) {
            out.push(step);
        }
    }
    out
}

/// The steps' ids by index, checked (valid, not repeated).
fn step_ids<'a>(specs: &'a [PipelineStep], at: &str, p: &mut Problems) -> FxHashMap<&'a str, usize> {
    let mut ids = FxHashMap::default();
    for (i, s) in specs.iter().enumerate() {
        let Some(id) = s.id.as_deref() else { continue };
        if !valid_id(id) {
            p.push(
                format!("{at}[{i}].id"),
                "1-63 of a-z 0-9 _ -, starting with a letter",
            );
        } else if ids.insert(id, i).is_some() {
            p.push(format!("{at}[{i}].id"), format!("another step is `{id}` too"));
        }
    }
    ids
}

fn resolve_needs(
    s: &PipelineStep,
    i: usize,
    ids: &FxHashMap<&str, usize>,
    sp: &str,
    p: &mut Problems,
) -> Vec<usize> {
    let mut out = Vec::with_capacity(s.needs.len());
    for n in &s.needs {
        match ids.get(n.as_str()) {
            Some(&j) if j == i => p.push(format!("{sp}.needs"), "a step cannot need itself"),
            Some(&j) if out.contains(&j) => p.push(format!("{sp}.needs"), format!("`{n}` is named twice")),
            Some(&j) => out.push(j),
            None => p.push(
                format!("{sp}.needs"),
                format!("no step has the id `{}`", n.chars().take(64).collect::<String>()),
            ),
        }
    }
    out
}

/// Each step's ancestors (sorted), or `None` after reporting a cycle, named by the steps'
/// ids (or numbers).
fn ancestors(
    specs: &[PipelineStep],
    needs: &[Vec<usize>],
    at: &str,
    p: &mut Problems,
) -> Option<Vec<Vec<usize>>> {
    let n = needs.len();
    // Kahn's order: a step after every step it needs.
    let mut waiting: Vec<usize> = needs.iter().map(Vec::len).collect();
    let mut dependents = vec![Vec::new(); n];
    for (i, ns) in needs.iter().enumerate() {
        for &j in ns {
            dependents[j].push(i);
        }
    }
    let mut order: Vec<usize> = (0..n).filter(|&i| waiting[i] == 0).collect();
    let mut next = 0;
    while let Some(&i) = order.get(next) {
        next += 1;
        for &d in &dependents[i] {
            waiting[d] -= 1;
            if waiting[d] == 0 {
                order.push(d);
            }
        }
    }
    if order.len() < n {
        let name = |i: usize| specs[i].id.clone().unwrap_or_else(|| format!("#{i}"));
        // Follow `needs` among the steps left until one repeats: that is a cycle.
        let mut path = vec![(0..n).find(|&i| waiting[i] > 0).unwrap_or(0)];
        loop {
            let last = path[path.len() - 1];
            let Some(&j) = needs[last].iter().find(|&&j| waiting[j] > 0) else {
                break;
            };
            if let Some(from) = path.iter().position(|&x| x == j) {
                let mut names: Vec<String> = path[from..].iter().rev().map(|&x| name(x)).collect();
                names.push(name(path[path.len() - 1]));
                p.push(
                    format!("{at}[{}].needs", path[from]),
                    format!("the steps' needs form a cycle: {}", names.join(" -> ")),
                );
                return None;
            }
            path.push(j);
        }
        p.push(at, "the steps' needs form a cycle");
        return None;
    }
    let mut anc: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &i in &order {
        let mut mine: Vec<usize> = needs[i].clone();
        for &j in &needs[i] {
            mine.extend_from_slice(&anc[j]);
        }
        mine.sort_unstable();
        mine.dedup();
        anc[i] = mine;
    }
    Some(anc)
}

/// What a step's templates may read of the other steps.
struct StepRefs<'a> {
    ids: &'a FxHashMap<&'a str, usize>,
    ancestors: &'a [usize],
    this: usize,
}

impl StepRefs<'_> {
    /// Problems of the `steps.X...` paths of `t`: X must be a step this one needs, directly
    /// or through others; what follows, `text`, `structured` or `skipped`.
    fn check(&self, t: &Template, path: &str, p: &mut Problems) {
        for segments in t.paths_under("steps") {
            let Some(target) = segments.get(1) else {
                p.push(
                    path,
                    "use `steps.N.text`, `steps.ID.structured`, ...: name a step",
                );
                continue;
            };
            self.check_step(target, path, p);
            if let Some(field) = segments.get(2)
                && !matches!(*field, "text" | "structured" | "skipped")
            {
                p.push(
                    path,
                    format!("`steps.{target}.{field}`: a step has `text`, `structured` and `skipped`"),
                );
            }
        }
    }

    /// Problems of a reference to step `target` (its number or id): it must be a step this
    /// one needs, directly or through others.
    fn check_step(&self, target: &str, path: &str, p: &mut Problems) {
        // A number as written, once: `steps.01` would name nothing at run time.
        let index = target
            .parse::<usize>()
            .ok()
            .filter(|j| j.to_string() == target)
            .or_else(|| self.ids.get(target).copied());
        match index {
            Some(j) if self.ancestors.binary_search(&j).is_ok() => {}
            Some(j) if j >= self.this => p.push(
                path,
                format!(
                    "`steps.{target}` refers to a step that has not run yet (this is step {}; name it in `needs`)",
                    self.this
                ),
            ),
            Some(_) => p.push(
                path,
                format!("`steps.{target}` is not a step this one needs (directly or through others): add it to `needs`"),
            ),
            None => p.push(path, format!("`steps.{target}`: no such step")),
        }
    }

    fn json(&self, v: &Value, names: &Names<'_>, path: &str, p: &mut Problems) -> Option<JsonTemplate> {
        if !shallow(v, path, p) {
            return None;
        }
        let jt = JsonTemplate::compile(Authored::json(v))
            .map_err(|e| p.push(path, e))
            .ok()?;
        for t in jt.templates() {
            check_template(t, names, path, p);
            self.check(t, path, p);
        }
        Some(jt)
    }
}

/// The names a step's templates may read: the arguments, `steps`, and under `forEach`
/// `item` and `index`.
fn step_names<'a>(names: &Names<'a>, each: bool) -> Names<'a> {
    Names {
        props: names.props.clone().map(|mut props| {
            props.push("steps");
            if each {
                props.extend(["item", "index"]);
            }
            props
        }),
        steps: None,
    }
}

fn compile_step(
    s: &PipelineStep,
    sp: &str,
    refs: &StepRefs<'_>,
    needs: Vec<usize>,
    cx: &mut Cx<'_>,
) -> Option<Step> {
    let (index, p) = (cx.index, &mut *cx.p);
    let plain = step_names(cx.names, false);
    let each = step_names(cx.names, s.for_each.is_some());
    let run = match (&s.tool, &s.result) {
        (Some(tool), None) => match index.get(tool.as_str()) {
            Some(&t) => Some(StepRun::Tool(t)),
            None => {
                p.push(
                    format!("{sp}.tool"),
                    format!("no tool named `{tool}` in this ToolSet"),
                );
                None
            }
        },
        (None, Some(v)) => {
            if s.input.is_some() || s.for_each.is_some() || s.retry.is_some() {
                p.push(
                    sp,
                    "a `result` step builds a value: `input`, `forEach` and `retry` are for tool steps",
                );
            }
            refs.json(v, &plain, &format!("{sp}.result"), p)
                .map(StepRun::Result)
        }
        _ => {
            p.push(sp, "set exactly one of `tool` and `result`");
            None
        }
    };
    let input = s
        .input
        .as_ref()
        .and_then(|v| refs.json(v, &each, &format!("{sp}.input"), p));
    let log = s.log.as_ref().and_then(|src| {
        let path = format!("{sp}.log");
        let t = checked_template(Authored::new(src), &path, &plain, p)?;
        refs.check(&t, &path, p);
        Some((s.log_level.unwrap_or_default(), t))
    });
    if s.log.is_none() && s.log_level.is_some() {
        p.push(format!("{sp}.logLevel"), "is set but `log` is not");
    }
    let when = s.when.as_ref().and_then(|src| {
        let path = format!("{sp}.when");
        let cond = Condition::compile(src).map_err(|e| p.push(&path, e)).ok()?;
        // Like a template, a condition reads only the steps this one needs: what it
        // decides never depends on which branch finished first.
        match cond.steps_read() {
            Ok(names) => names.iter().for_each(|n| refs.check_step(n, &path, p)),
            Err(how) => p.push(&path, how),
        }
        Some(cond)
    });
    let for_each = s
        .for_each
        .as_ref()
        .and_then(|f| compile_for_each(f, refs, &plain, &format!("{sp}.forEach"), p));
    let retry = s
        .retry
        .as_ref()
        .and_then(|r| compile_retry(r, &format!("{sp}.retry"), p));
    Some(Step {
        run: run?,
        input,
        log,
        id: s.id.as_deref().map(Into::into),
        needs: needs.into(),
        ancestors: refs.ancestors.into(),
        when,
        for_each,
        retry,
        on_decline: s.on_decline.unwrap_or_default(),
        on_cancel: s.on_cancel.unwrap_or_default(),
    })
}

fn compile_for_each(
    f: &crate::handlers::pipeline::ForEachSpec,
    refs: &StepRefs<'_>,
    names: &Names<'_>,
    path: &str,
    p: &mut Problems,
) -> Option<ForEach> {
    let items = refs.json(
        &Value::String(f.items.clone()),
        names,
        &format!("{path}.items"),
        p,
    )?;
    if !matches!(items, JsonTemplate::Typed(_)) {
        p.push(
            format!("{path}.items"),
            "must be exactly one value, e.g. \"{{steps.list.structured.items}}\"",
        );
    }
    let max_parallel = f.max_parallel.unwrap_or(1);
    if !(1..=MAX_PARALLEL).contains(&max_parallel) {
        p.push(format!("{path}.maxParallel"), format!("1 to {MAX_PARALLEL}"));
    }
    let max_items = f.max_items.unwrap_or(DEFAULT_FOR_EACH_ITEMS);
    if !(1..=MAX_FOR_EACH_ITEMS).contains(&max_items) {
        p.push(format!("{path}.maxItems"), format!("1 to {MAX_FOR_EACH_ITEMS}"));
    }
    Some(ForEach {
        items,
        max_parallel: max_parallel.clamp(1, MAX_PARALLEL) as usize,
        max_items: max_items.clamp(1, MAX_FOR_EACH_ITEMS) as usize,
    })
}

fn compile_retry(r: &crate::handlers::pipeline::RetrySpec, path: &str, p: &mut Problems) -> Option<Retry> {
    if !(2..=MAX_ATTEMPTS).contains(&r.attempts) {
        p.push(format!("{path}.attempts"), format!("2 to {MAX_ATTEMPTS}"));
    }
    let backoff = match r.backoff.as_deref().map(crate::spec::checks::parse_duration) {
        None => Duration::from_millis(200),
        Some(Ok(d)) if d <= MAX_BACKOFF => d,
        Some(Ok(_)) => {
            p.push(format!("{path}.backoff"), "at most 30s");
            MAX_BACKOFF
        }
        Some(Err(e)) => {
            p.push(format!("{path}.backoff"), e);
            return None;
        }
    };
    Some(Retry {
        attempts: r.attempts.clamp(2, MAX_ATTEMPTS),
        backoff,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{CompiledHandler, CompiledToolSet, compile, parse};

    const TOOLS: &str = "tools:\n  - {name: list, handler: {template: '[1,2]'}}\n  - {name: one, input: {id: string}, handler: {template: 'item {{id}}'}}\n  - {name: confirm, handler: {elicit: {message: sure?, schema: {type: object, properties: {ok: {type: boolean}}}}}}\n  - {name: fetch, input: {id: string}, handler: {http: {url: 'https://h.example/{{id}}'}}}\n";

    fn with(pipeline: &str) -> Result<CompiledToolSet, Vec<String>> {
        let yaml = format!(
            "{TOOLS}  - name: p\n    input: {{q: string}}\n    handler:\n      pipeline: {pipeline}\n"
        );
        compile(&parse("t", &yaml).unwrap()).map_err(|e| e.problems.iter().map(ToString::to_string).collect())
    }

    fn steps(c: &CompiledToolSet) -> &[Step] {
        match &c.tools.iter().find(|t| t.name == "p").unwrap().handler {
            CompiledHandler::Pipeline(s) => s,
            other => panic!("{other:?}"),
        }
    }

    fn refused(pipeline: &str) -> String {
        with(pipeline).err().unwrap_or_default().join("\n")
    }

    #[test]
    fn steps_without_needs_are_a_chain_and_with_needs_a_graph() {
        let c = with("[{tool: list}, {tool: one, input: {id: '{{steps.0.text}}'}}]").unwrap();
        let s = steps(&c);
        assert!(is_chain(s));
        assert_eq!(*s[1].needs, [0]);
        let c = with(
            "[{id: a, tool: list}, {id: b, tool: one, needs: [a], input: {id: '{{steps.a.text}}'}}, \
             {id: c, tool: one, needs: [a], input: {id: '{{steps.0.text}}'}}, \
             {id: d, needs: [b, c], result: {b: '{{steps.b.text}}', c: '{{steps.c.structured}}', a: '{{steps.a.skipped}}'}}]",
        )
        .unwrap();
        let s = steps(&c);
        assert!(!is_chain(s));
        assert_eq!(
            (&*s[1].needs, &*s[2].needs, &*s[3].needs),
            (&[0][..], &[0][..], &[1, 2][..])
        );
        assert_eq!(*s[3].ancestors, [0, 1, 2]);
        assert!(s[0].needs.is_empty() && s[3].tool().is_none());
    }

    #[test]
    fn a_cycle_is_refused_naming_its_steps() {
        let e = refused(
            "[{id: a, tool: list, needs: [c]}, {id: b, tool: list, needs: [a]}, {id: c, tool: list, needs: [b]}, {id: z, tool: list}]",
        );
        assert!(e.contains("form a cycle"), "{e}");
        for step in ["a", "b", "c"] {
            assert!(e.contains(&format!("{step} ->")) || e.ends_with(step), "{e}");
        }
        assert!(!e.contains('z'), "{e}");
        assert!(refused("[{id: a, tool: list, needs: [a]}]").contains("cannot need itself"));
        assert!(refused("[{id: a, tool: list, needs: [nope]}]").contains("no step has the id `nope`"));
        assert!(
            refused("[{id: a, tool: list}, {id: a, tool: list, needs: [a]}]").contains("another step is `a`")
        );
        assert!(refused("[{id: A, tool: list, needs: []}]").contains("1-63 of a-z"));
    }

    #[test]
    fn a_step_reads_only_the_steps_it_needs() {
        // A sibling may finish first or not: reading it would depend on timing.
        let e = refused(
            "[{id: a, tool: list}, {id: b, tool: list, needs: [a]}, {id: c, tool: one, needs: [a], input: {id: '{{steps.b.text}}'}}]",
        );
        assert!(e.contains("`steps.b` is not a step this one needs"), "{e}");
        let e = refused("[{tool: one, input: {id: '{{steps.1.text}}'}}, {tool: list}]");
        assert!(e.contains("has not run yet"), "{e}");
        assert!(
            refused("[{tool: list}, {tool: one, input: {id: '{{steps.0.body}}'}}]")
                .contains("`text`, `structured` and `skipped`")
        );
        assert!(
            refused("[{tool: list}, {tool: one, input: {id: '{{steps.x.text}}'}}]").contains("no such step")
        );
        assert!(refused("[{tool: list}, {tool: one, input: {id: '{{item}}'}}]").contains("`item`"));
        assert!(
            refused("[{tool: list}, {tool: one, input: {id: '{{steps.00.text}}'}}]").contains("no such step")
        );
        // Conditions alike: by id, number or index, and nothing computed.
        let e = refused(
            "[{id: a, tool: list}, {id: b, tool: list, needs: [a]}, {id: c, tool: list, needs: [a], when: 'has(steps.b) || steps.a.skipped'}]",
        );
        assert!(e.contains("`steps.b` is not a step this one needs"), "{e}");
        assert_eq!(
            refused(
                "[{id: a, tool: list}, {id: b, tool: list, needs: [a], when: 'steps[\"0\"].text != \"\" && !steps.a.skipped && steps[\"a\"].text != \"\"'}]"
            ),
            ""
        );
        assert!(
            refused("[{id: a, tool: list}, {tool: list, when: 'size(steps) > 0'}]")
                .contains("read a step as")
        );
        assert!(
            refused("[{id: a, tool: list}, {tool: list, when: 'steps[args.q].skipped'}]")
                .contains("read a step as")
        );
    }

    #[test]
    fn for_each_retry_and_when_are_checked_and_counted() {
        let c = with(
            "[{id: l, tool: list}, {tool: fetch, needs: [l], when: 'size(steps.l.text) > 0 && args.q != \"\"', \
              forEach: {items: '{{steps.l.structured}}', maxParallel: 8, maxItems: 50}, \
              input: {id: '{{item}}-{{index}}'}, retry: {attempts: 3, backoff: 10ms}}]",
        )
        .unwrap();
        let s = &steps(&c)[1];
        let f = s.for_each.as_ref().unwrap();
        assert_eq!((f.max_parallel, f.max_items), (8, 50));
        assert_eq!(
            s.retry.map(|r| (r.attempts, r.backoff)),
            Some((3, Duration::from_millis(10)))
        );
        assert_eq!(s.runs(), 150);
        assert!(s.when.is_some());
        for (bad, says) in [
            ("[{tool: one, forEach: {items: 'a {{q}}'}}]", "exactly one value"),
            (
                "[{tool: one, forEach: {items: '{{q}}', maxParallel: 0}}]",
                "1 to 64",
            ),
            (
                "[{tool: one, forEach: {items: '{{q}}', maxItems: 5000}}]",
                "1 to 1000",
            ),
            ("[{tool: one, retry: {attempts: 1}}]", "2 to 10"),
            ("[{tool: one, retry: {attempts: 2, backoff: 1h}}]", "at most 30s"),
            ("[{tool: one, when: 'secrets.x'}]", "unknown variable `secrets`"),
            ("[{tool: one, when: '1 + 2'}]", "bool"),
            (
                "[{tool: one, result: {a: 1}}]",
                "exactly one of `tool` and `result`",
            ),
            ("[{}]", "exactly one of `tool` and `result`"),
            ("[{result: {a: 1}, retry: {attempts: 2}}]", "for tool steps"),
            (
                "[{tool: list, retry: {attempts: 2}}]",
                "only a step of an http or exec tool is retried",
            ),
        ] {
            let e = refused(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
        // Fan-out multiplies what one call may run: 1000 elements, 10 attempts each, of a
        // pipeline of two steps is over the bound of one call.
        let yaml = format!(
            "{TOOLS}  - {{name: inner, input: {{id: string}}, handler: {{pipeline: [{{tool: fetch, retry: {{attempts: 5}}}}, {{tool: fetch, retry: {{attempts: 5}}}}]}}}}\n  - name: outer\n    handler:\n      pipeline: [{{tool: inner, forEach: {{items: '{{{{xs}}}}', maxItems: 1000}}}}]\n"
        );
        let e = compile(&parse("t", &yaml).unwrap()).unwrap_err().to_string();
        assert!(e.contains("would run 11000 steps"), "{e}");
        // A step that asks the client runs alone: its answers are matched by order.
        assert!(with("[{tool: confirm}, {tool: list}]").is_ok());
        assert!(with("[{tool: confirm, forEach: {items: '{{q}}'}}]").is_ok());
        for parallel in [
            "[{id: a, tool: confirm}, {id: b, tool: list}, {id: c, tool: list, needs: [a, b]}]",
            "[{tool: confirm, forEach: {items: '{{q}}', maxParallel: 2}}]",
        ] {
            assert!(
                refused(parallel).contains("`confirm` asks the client"),
                "{parallel}"
            );
        }
    }
}
