//! Tool search: a lexical index (BM25F over tool names, descriptions and parameter names)
//! built with each registry snapshot, and what `find_tools` needs of it.

mod index;
mod words;

use serde_json::Value;

pub use index::{Doc, Index, MAX_QUERY_BYTES, MAX_QUERY_TERMS, Scratch};

use crate::config::search::SearchSettings;

/// What a registry snapshot with tool search holds: the index over its tools (by position)
/// and which of them `tools/list` shows.
#[derive(Debug)]
pub struct Catalog {
    /// The index; a hit's position is the tool's.
    pub index: Index,
    listed: Box<[bool]>,
    /// Tools returned when a call names no limit.
    pub default_limit: usize,
    /// Most tools returned by one call.
    pub max_limit: usize,
}

impl Catalog {
    /// Indexes the tools' `tools/list` entries (name, title, description, the names of
    /// `inputSchema.properties`).
    pub fn build<'a>(descriptors: impl Iterator<Item = &'a Value>, settings: &SearchSettings) -> Self {
        let mut listed = Vec::new();
        let docs: Vec<(Doc<'a>, Vec<&'a str>)> = descriptors
            .map(|d| {
                let text = |k: &str| d.get(k).and_then(Value::as_str);
                let name = text("name").unwrap_or_default();
                listed.push(settings.listed(name));
                let params = d
                    .pointer("/inputSchema/properties")
                    .and_then(Value::as_object)
                    .map(|p| p.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                let doc = Doc {
                    name,
                    title: text("title"),
                    description: text("description").unwrap_or_default(),
                };
                (doc, params)
            })
            .collect();
        Self {
            index: Index::build(docs),
            listed: listed.into(),
            default_limit: settings.default_limit,
            max_limit: settings.max_limit,
        }
    }

    /// Whether `tools/list` shows the tool at `index`.
    pub fn listed(&self, index: usize) -> bool {
        self.listed.get(index).copied().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests;
