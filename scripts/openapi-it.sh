#!/usr/bin/env bash
# OpenAPI import against a real kube-apiserver: starts the local control plane, then runs
# server/tests/openapi_kube.rs (the `#[ignore = "needs cluster"]` test), which imports
# core/v1 and apps/v1 operations from the apiserver's own OpenAPI v3 documents and calls them
# through quiver-server with a ServiceAccount token. Logs are printed on failure.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

cargo test -p quiver-server --locked --test openapi_kube --no-run
control_plane_session openapi
cargo test -p quiver-server --locked --test openapi_kube -- --ignored --nocapture
