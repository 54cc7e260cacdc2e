# Shared helpers for the scripts in this directory (sourced, not run).
# Caches live outside the clone so reruns are fast and clean clones stay clean.
QUIVER_CACHE="${QUIVER_CACHE:-$HOME/.cache/quiver}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$QUIVER_CACHE"

# cargo's target directory: CARGO_TARGET_DIR (or a build.target-dir setting) if set, else
# the workspace's target/. Built binaries are under "$(target_dir)/debug" or ".../release".
target_dir() {
  cargo metadata --format-version 1 --no-deps --manifest-path "$ROOT/Cargo.toml" \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])'
}

# workspace_build: the workspace's binaries and test binaries as the test command builds
# them (`cargo test --workspace`), into "$(target_dir)/debug". Every cargo call of the test
# command selects the whole workspace, so dependencies' features resolve once: with `-p`,
# Cargo resolves them for that package alone and recompiles syn and everything above it.
workspace_build() { cargo test --workspace --locked --no-run --quiet; }

# server_bin: the quiver-server a suite runs, printed: QUIVER_SERVER_BIN (the test command
# exports the one cargo test built) or else a debug build made here.
server_bin() {
  if [ -n "${QUIVER_SERVER_BIN:-}" ]; then echo "$QUIVER_SERVER_BIN"; return; fi
  log "building quiver-server"
  cargo build -p quiver-server --locked --quiet
  echo "$(target_dir)/debug/quiver-server"
}

# How the images' binaries are built (scripts/images.sh, scripts/pgo.sh): static glibc for
# FROM-scratch images, and the PGO profile the server image is built with.
IMAGE_TRIPLE=x86_64-unknown-linux-gnu
IMAGE_RUSTFLAGS="-C target-feature=+crt-static"
PGO_PROFILE="$ROOT/deploy/images/pgo/quiver-server.profdata"

# Each step's line carries the wall-clock time, so a CI log shows where the minutes go.
log() { printf '\n\033[1m==> [%s] %s\033[0m\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# The platforms a release is built for (QUIVER_RELEASE_PLATFORMS narrows them), in the order
# their manifests appear in each image index.
RELEASE_PLATFORMS="linux/amd64 linux/arm64"

# platform_triple linux/ARCH: the Rust target the binaries of that image platform are built for.
platform_triple() {
  case "$1" in
    linux/amd64) echo x86_64-unknown-linux-gnu ;;
    linux/arm64) echo aarch64-unknown-linux-gnu ;;
    *) echo "unknown platform '$1': linux/amd64 or linux/arm64" >&2; return 1 ;;
  esac
}

# cross_toolchain TRIPLE: what a static build for TRIPLE needs on this (amd64) machine,
# installed once: the target's standard library (rustup) and, for aarch64, Debian's cross
# gcc and static glibc, named to cargo, cc and jemalloc through the environment only (no
# .cargo/config, so native builds are untouched). Sets STRIP to the strip for TRIPLE.
# jemalloc is built for pages of up to 64 KiB (lg-page 16): arm64 kernels use 4, 16 or
# 64 KiB pages, and a jemalloc built for smaller pages than the kernel's cannot start.
cross_toolchain() {
  local triple="$1"
  STRIP=strip
  [ "$triple" = "$IMAGE_TRIPLE" ] && return 0
  [ "$triple" = aarch64-unknown-linux-gnu ] || { echo "no cross toolchain for $triple" >&2; return 1; }
  if ! rustup target list --installed | grep -qx "$triple"; then
    log "rustup target add $triple (once)"
    rustup target add "$triple" >&2
  fi
  if ! command -v aarch64-linux-gnu-gcc >/dev/null || [ ! -f /usr/aarch64-linux-gnu/lib/libc.a ]; then
    log "installing Debian's aarch64 cross compiler and static glibc (once)"
    apt_install --no-install-recommends gcc-aarch64-linux-gnu libc6-dev-arm64-cross
  fi
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
    AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar \
    AARCH64_UNKNOWN_LINUX_GNU_JEMALLOC_SYS_WITH_LG_PAGE=16
  STRIP=aarch64-linux-gnu-strip
}

# check_static BINARY TRIPLE: fails unless BINARY is an ELF executable for TRIPLE's machine
# with no program interpreter and no shared library (what a FROM-scratch image can run).
check_static() {
  local bin="$1" want headers
  case "$2" in
    x86_64-*) want="Advanced Micro Devices X86-64" ;;
    aarch64-*) want="AArch64" ;;
    *) echo "check_static: unknown target $2" >&2; return 1 ;;
  esac
  headers="$(readelf -h -l -d "$bin")"
  grep -qE "^ +Machine: +$want\$" <<<"$headers" \
    || { echo "$bin is not a $2 binary: $(grep Machine: <<<"$headers")" >&2; return 1; }
  if grep -qE 'NEEDED|INTERP' <<<"$headers"; then
    echo "$bin links shared libraries or names an interpreter: not a static binary" >&2; return 1
  fi
}

# A Python virtualenv in the cache with the SDK-test requirements installed.
# Reinstalls only when requirements.txt changes.
# apt_install PKG... : Debian packages, as root or through sudo.
apt_install() {
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq >/dev/null
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

python_env() {
  local venv="$QUIVER_CACHE/venv" req="$ROOT/tests/requirements.txt"
  local stamp="$venv/.req-$(sha256sum "$req" | cut -c1-16)"
  if [ ! -f "$stamp" ]; then
    log "installing Python packages into $venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
    touch "$stamp"
  fi
  PY="$venv/bin/python"
}

# node_modules for the TypeScript SDK tests, installed from the lockfile.
node_env() {
  local dir="$ROOT/tests/sdk/typescript"
  if [ ! -d "$dir/node_modules/@modelcontextprotocol/sdk" ]; then
    log "installing npm packages for tests/sdk/typescript"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error --cache "$QUIVER_CACHE/npm")
  fi
}

# Installs the McpServer CRD and waits until it is Established. (`kubectl wait` fails at
# once, instead of waiting, while a just-created CRD has no status conditions yet.)
install_crd() {
  kubectl apply --server-side -f "$ROOT/crds/mcpservers.quiver.dev.yaml" >/dev/null
  for _ in $(seq 1 300); do
    [ "$(kubectl get crd mcpservers.quiver.dev -o jsonpath='{.status.conditions[?(@.type=="Established")].status}' 2>/dev/null)" = True ] && return 0
    sleep 0.1
  done
  echo "CRD mcpservers.quiver.dev not Established after 30 s" >&2
  return 1
}

# wait_condition NAMESPACE CONDITION STATUS SECONDS MCPSERVER...: polls each McpServer until
# its condition has STATUS (kubectl wait errors out while .status is still empty).
wait_condition() {
  local ns="$1" cond="$2" want="$3" secs="$4"; shift 4
  local name got
  for name in "$@"; do
    for _ in $(seq 1 $((secs * 10))); do
      got="$(kubectl get qmcp "$name" -n "$ns" -o jsonpath="{.status.conditions[?(@.type==\"$cond\")].status}" 2>/dev/null || true)"
      [ "$got" = "$want" ] && break
      sleep 0.1
    done
    [ "$got" = "$want" ] || { echo "qmcp/$name: $cond is '${got}', not $want, after ${secs}s" >&2; kubectl get qmcp "$name" -n "$ns" -o yaml >&2 || true; return 1; }
    echo "qmcp/$name $cond=$want"
  done
}

# kind_env: the kind cluster's name and a kubeconfig of its own (never ~/.kube/config).
kind_env() {
  QUIVER_CLUSTER="${QUIVER_CLUSTER:-quiver}"
  mkdir -p "$QUIVER_CACHE/kind"
  export KUBECONFIG="$QUIVER_CACHE/kind/$QUIVER_CLUSTER.kubeconfig"
}

# quiet_build TAG DIR: a no-pull image build (the classic builder: BuildKit is not in
# Debian's docker.io) that prints only when it fails.
quiet_build() {
  local out
  out="$(DOCKER_BUILDKIT=0 "${DOCKER:-docker}" build -q -t "$1" "$2" 2>&1)" || { echo "$out" >&2; return 1; }
}

# control_plane_session NAME: a state directory ($STATE) holding a local control plane
# ($STATE/cp, scripts/control-plane.sh) whose env is sourced, and one EXIT trap for the
# session: kill the processes listed in BG_PIDS, print the tail of every log under $STATE
# when the script fails (then the failing line, and $STATE/failure.txt, which a step may tee
# its output into), stop the control plane, remove $STATE.
BG_PIDS=()
control_plane_session() {
  STATE="$(mktemp -d "${TMPDIR:-/tmp}/quiver-$1.XXXXXX")"
  SESSION_FAILED_AT=""
  # The failing line and command, printed after the logs so that the end of the output
  # (all a CI summary may show) says what failed.
  set -o errtrace
  trap 'SESSION_FAILED_AT="${BASH_SOURCE[0]##*/}:$LINENO: $BASH_COMMAND"' ERR
  trap _control_plane_session_end EXIT
  "$ROOT/scripts/control-plane.sh" up "$STATE/cp"
  source "$STATE/cp/env"
}
_control_plane_session_end() {
  local status=$? p f
  for p in "${BG_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  if [ "$status" != 0 ]; then
    while read -r f; do echo "--- ${f#"$STATE"/} (last 40 lines)"; tail -40 "$f"; done < <(find "$STATE" -name '*.log' | sort)
    echo "=== failed (exit $status) at ${SESSION_FAILED_AT:-an unknown line}" >&2
    [ ! -s "$STATE/failure.txt" ] || { echo "=== output of the last step that saves it (failure.txt):" >&2; tail -30 "$STATE/failure.txt" >&2; }
  fi
  "$ROOT/scripts/control-plane.sh" down "$STATE/cp" || true
  rm -rf "$STATE"
  exit "$status"
}

