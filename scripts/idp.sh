#!/usr/bin/env bash
# The OpenID provider of the identity tests: Keycloak, from its distribution on Maven Central
# (org.keycloak:keycloak-quarkus-dist), on the machine's JDK, with standard token exchange
# (RFC 8693). Cached under ~/.cache/quiver/keycloak; each start gets a data directory of its
# own, so runs never share state.
#
#   scripts/idp.sh install        download, unpack and build once (kc.sh build), and import
#                                 the realms into a template database
#   scripts/idp.sh start DIR      start on 127.0.0.1 and a free port with the realms of
#                                 scripts/idp/*.json; writes DIR/env (KEY=VALUE lines:
#                                 QUIVER_IDP_ISSUER, QUIVER_IDP_UPSTREAM_ISSUER,
#                                 QUIVER_IDP_PID, ...) once it answers.
#                                 QUIVER_IDP_HOST=ADDR listens on that address of this
#                                 machine instead (the kind network's gateway, for the e2e
#                                 suite: the pods and the tests then name the same issuer)
#   scripts/idp.sh stop DIR       stop the instance started in DIR
#
# The realm `quiver`: users alice and bob; client `quiver` (confidential, standard token
# exchange on, may exchange for the audience `notes-upstream`); public clients `agent`
# (tokens addressed to `quiver`) and `agent-forward` (to `quiver` and `notes-upstream`).
#
# The realm `upstream` (scripts/idp/upstream-realm.json): the authorization server of a
# third-party MCP server whose users sign in themselves (`identity: {mode: user}`). Users carol
# and dave. Quiver registers itself (RFC 7591), anonymously, which the realm allows only
# from 127.0.0.1 and for redirect URIs on 127.0.0.1 (the "Trusted Hosts" policy), without a
# consent screen. One pre-registered client, `loopback-app` (public, PKCE S256 required, a
# consent screen, redirect URI http://127.0.0.1/callback on any port), is the browser
# tests' (tests/browser). `notes-registered` (confidential, redirect URIs on 127.0.0.1,
# access tokens of 30 s for the audience `notes-upstream`) is Quiver registered beforehand
# (`identity.client`); `notes-lister` (client credentials, tokens of an hour for
# `notes-upstream`) is the server's own credential at an upstream that lists its tools only
# to a token of the realm (tests/e2e/test_user_sign_in.py). One instance serves both realms.
# `quiver-console` (public, PKCE S256, redirect URIs on 127.0.0.1, access tokens for the
# audience `quiver`) is the operator console's (tests/browser/test_console.py).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

KC_VERSION=26.5.6
KC_CACHE="$QUIVER_CACHE/keycloak"
KC_HOME="$KC_CACHE/keycloak-$KC_VERSION"
REALM="$ROOT/scripts/idp/realm.json"
UPSTREAM_REALM="$ROOT/scripts/idp/upstream-realm.json"

install() {
  local start=$SECONDS
  if [ ! -f "$KC_HOME/.built-file-local" ]; then
    log "installing Keycloak $KC_VERSION from Maven Central into $KC_CACHE"
    mkdir -p "$KC_CACHE"
    mvn -q -B -Dmaven.repo.local="$KC_CACHE/m2" dependency:get \
      -Dartifact="org.keycloak:keycloak-quarkus-dist:$KC_VERSION:tar.gz" -Dtransitive=false >&2
    rm -rf "$KC_HOME"
    tar xzf "$KC_CACHE/m2/org/keycloak/keycloak-quarkus-dist/$KC_VERSION/keycloak-quarkus-dist-$KC_VERSION.tar.gz" \
      -C "$KC_CACHE"
    # The build-time option: an embedded file database; `start --optimized` then skips the
    # build on every start.
    "$KC_HOME/bin/kc.sh" build --db=dev-file >&2
    touch "$KC_HOME/.built-file-local"
  fi
  # The database with the realms imported, made once per version of the realm files: each
  # start copies it instead of creating the schema and importing again.
  local template="$KC_CACHE/data-$(cat "$REALM" "$UPSTREAM_REALM" | sha256sum | cut -c1-16)"
  if [ ! -d "$template" ]; then
    log "importing scripts/idp/realm.json and upstream-realm.json into a template database"
    local work="$KC_CACHE/import-work"
    rm -rf "$work" "$KC_HOME/data"
    mkdir -p "$work"
    cp "$REALM" "$work/quiver-realm.json"
    cp "$UPSTREAM_REALM" "$work/upstream-realm.json"
    "$KC_HOME/bin/kc.sh" import --optimized --cache=local --dir "$work" >"$KC_CACHE/import.log" 2>&1 \
      || { tail -n 40 "$KC_CACHE/import.log" >&2; exit 1; }
    mv "$KC_HOME/data" "$template.tmp"
    mv "$template.tmp" "$template"
    rm -rf "$work"
  fi
  DATA_TEMPLATE="$template"
  if [ $((SECONDS - start)) -gt 0 ]; then
    log "Keycloak installed in $((SECONDS - start)) s"
  fi
}

free_port() {
  python3 -c 'import socket, sys; s = socket.socket(); s.bind((sys.argv[1], 0)); print(s.getsockname()[1])' "${1:-127.0.0.1}"
}

start() {
  local dir="$1"
  install
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  # An instance of its own: the install linked (read-only parts), its data directory new.
  local home="$dir/keycloak"
  rm -rf "$home"
  mkdir -p "$home"
  for part in bin lib conf providers themes version.txt; do
    [ -e "$KC_HOME/$part" ] && cp -al "$KC_HOME/$part" "$home/$part"
  done
  cp -r "$DATA_TEMPLATE" "$home/data"
  local port started=$SECONDS host="${QUIVER_IDP_HOST:-127.0.0.1}"
  port="$(free_port "$host")"
  # A local cache: no clustering (JGroups would listen on every interface).
  setsid "$home/bin/kc.sh" start --optimized --cache=local \
    --http-enabled=true --http-host="$host" --http-port="$port" --hostname-strict=false \
    --http-management-port="$(free_port "$host")" \
    >"$dir/keycloak.log" 2>&1 &
  local pid=$!
  local issuer="http://$host:$port/realms/quiver"
  for _ in $(seq 1 600); do
    if curl -sf -o /dev/null "$issuer/.well-known/openid-configuration"; then
      cat >"$dir/env" <<EOF
QUIVER_IDP_ISSUER=$issuer
QUIVER_IDP_TOKEN_ENDPOINT=$issuer/protocol/openid-connect/token
QUIVER_IDP_UPSTREAM_ISSUER=http://$host:$port/realms/upstream
QUIVER_IDP_PID=$pid
QUIVER_IDP_START_SECONDS=$((SECONDS - started))
EOF
      log "Keycloak answers at $issuer after $((SECONDS - started)) s"
      return
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 40 "$dir/keycloak.log" >&2
      echo "Keycloak exited before it answered (log: $dir/keycloak.log)" >&2
      exit 1
    fi
    sleep 0.5
  done
  tail -n 40 "$dir/keycloak.log" >&2
  kill -- "-$pid" 2>/dev/null || true
  echo "Keycloak did not answer within 300 s (log: $dir/keycloak.log)" >&2
  exit 1
}

stop() {
  local dir="$1" pid
  pid="$(sed -n 's/^QUIVER_IDP_PID=//p' "$dir/env" 2>/dev/null || true)"
  if [ -n "$pid" ]; then
    # setsid made it a process group of its own: kc.sh and its JVM end together.
    kill -- "-$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
  fi
  rm -rf "$dir/keycloak"
}

case "${1:-}" in
  install) install ;;
  start) start "${2:?usage: idp.sh start DIR}" ;;
  stop) stop "${2:?usage: idp.sh stop DIR}" ;;
  *) echo "usage: $0 install | start DIR | stop DIR" >&2; exit 2 ;;
esac
