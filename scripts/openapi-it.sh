#!/usr/bin/env bash
# OpenAPI import against a real kube-apiserver: starts the local control plane, then runs
# server/tests/openapi_kube.rs (the `#[ignore = "needs cluster"]` test), which imports
# core/v1 and apps/v1 operations from the apiserver's own OpenAPI v3 documents and calls them
# through quiver-server with a ServiceAccount token; then server/tests/kube_search.rs ranks
# those operations for plain-language queries. Logs are printed on failure.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

workspace_build
control_plane_session openapi
cargo test --workspace --locked --test openapi_kube -- --ignored --nocapture
# Tool search's retrieval quality on the same documents: recall@5 of the labeled queries in
# tests/search/kube-queries.yaml (fails under 0.9; prints recall@3 and @5).
cargo test --workspace --locked --test kube_search -- --ignored --nocapture
