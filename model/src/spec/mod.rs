//! The pieces every part of a ToolSet is written and compiled with, below the handler kinds
//! and the document: the compile context and its problems ([`context`]), field checks
//! ([`checks`]), JSON-valued fields ([`json_field`]), the spec parts several kinds share
//! ([`shared`]), the caller and access rules ([`caller`], [`access`]) and the credential a
//! request carries ([`identity`]).

pub mod access;
pub mod caller;
pub mod checks;
pub mod context;
pub mod identity;
pub mod json_field;
pub mod shared;
