//! quiver-model: the ToolSet document and everything that turns it into typed, checked
//! values, with no runtime (no tokio, no hyper): what the operator links to validate what it
//! renders, and what the server compiles its registry from.
//!
//! - [`config`]: the document, its compile driver ([`config::compile()`]), the compiled
//!   form, access, governance, identity, upstream and OpenAPI specs, and policies;
//! - [`handlers`]: each handler kind's spec and compile step;
//! - [`schema`]: the JSON Schema subset arguments are checked against;
//! - [`template`]: `{{...}}` templates, made only from author text;
//! - [`search`]: the tool search index built at compile time;
//! - [`guard`]: secrets and personal data found in a tool's result (result guards);
//! - [`redact`]: how secrets and untrusted text are shown;
//! - [`published`]: one-line text and ETags of documents that describe a server (catalog
//!   entries, server cards).

pub mod config;
pub mod guard;
pub mod handlers;
pub mod published;
pub mod redact;
pub mod schema;
pub mod search;
pub mod slot;
pub mod spec;
pub mod template;
