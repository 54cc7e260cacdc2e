# Shared helpers for the scripts in this directory (sourced, not run).
# Caches live outside the clone so reruns are fast and clean clones stay clean.
QUIVER_CACHE="${QUIVER_CACHE:-$HOME/.cache/quiver}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$QUIVER_CACHE"

log() { printf '\n\033[1m==> %s\033[0m\n' "$*" >&2; }

# A Python virtualenv in the cache with the SDK-test requirements installed.
# Reinstalls only when requirements.txt changes.
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
