#!/usr/bin/env bash
# The layering checks of make test: no import cycle between the modules of a crate nor
# between its top-level folders, no non-test function over 100 lines that does not say why. Each check first proves on a small
# synthetic crate that it fails when it should, so a broken check cannot pass silently.
set -euo pipefail
cd "$(dirname "$0")/.."

fixture="$(mktemp -d)"
trap 'rm -rf "$fixture"' EXIT
mkdir -p "$fixture/bad/src/a" "$fixture/good/src/a"
cat > "$fixture/bad/src/lib.rs" <<'RS'
mod a;
mod b;
RS
printf 'use crate::b::Thing;\npub struct Other;\n' > "$fixture/bad/src/a/mod.rs"
printf 'pub struct Thing(crate::a::Other);\n' > "$fixture/bad/src/b.rs"
cp "$fixture/bad/src/lib.rs" "$fixture/good/src/lib.rs"
printf 'use crate::b::Thing;\npub struct Other;\n' > "$fixture/good/src/a/mod.rs"
printf 'pub struct Thing;\n#[cfg(test)]\nmod tests {\n    use crate::a::Other;\n}\n' > "$fixture/good/src/b.rs"
{ echo 'fn long() {'; for _ in $(seq 1 120); do echo '    let _ = "{";'; done; echo '}'; } > "$fixture/bad/src/c.rs"
{ echo '// Long: a flat table reads best in one place.'; cat "$fixture/bad/src/c.rs"; } > "$fixture/good/src/c.rs"

if python3 scripts/check-cycles.py "$fixture/bad/src" > /dev/null; then
  echo "check-cycles.py passed a crate with a cycle (a -> b -> a)" >&2; exit 1
fi
python3 scripts/check-cycles.py "$fixture/good/src" > /dev/null \
  || { echo "check-cycles.py failed an acyclic crate" >&2; exit 1; }
# Folders: a::x -> b -> a::y is no cycle between modules, but one between folders `a` and `b`;
# the same edge back from a `b_tests.rs` file is test code, no cycle.
mkdir -p "$fixture/folders/src/a" "$fixture/tests-only/src/a"
printf 'mod a;\nmod b;\n' > "$fixture/folders/src/lib.rs"
printf 'pub mod x;\npub mod y;\n' > "$fixture/folders/src/a/mod.rs"
printf 'use crate::b::Thing;\n' > "$fixture/folders/src/a/x.rs"
printf 'pub struct Other;\n' > "$fixture/folders/src/a/y.rs"
printf 'pub struct Thing(crate::a::y::Other);\n' > "$fixture/folders/src/b.rs"
if python3 scripts/check-cycles.py "$fixture/folders/src" > /dev/null; then
  echo "check-cycles.py passed a crate whose folders form a cycle (a -> b -> a)" >&2; exit 1
fi
printf 'mod a;\nmod b;\n#[cfg(test)]\n#[path = "b_tests.rs"]\nmod b_tests;\n' > "$fixture/tests-only/src/lib.rs"
cp "$fixture/folders/src/a/mod.rs" "$fixture/folders/src/a/x.rs" "$fixture/folders/src/a/y.rs" "$fixture/tests-only/src/a/"
printf 'pub struct Thing;\n' > "$fixture/tests-only/src/b.rs"
printf 'use crate::a::y::Other;\n' > "$fixture/tests-only/src/b_tests.rs"
python3 scripts/check-cycles.py "$fixture/tests-only/src" > /dev/null \
  || { echo "check-cycles.py counted a *_tests.rs file as production code" >&2; exit 1; }
if python3 scripts/check-fn-length.py "$fixture/bad/src" > /dev/null; then
  echo "check-fn-length.py passed a 122-line function" >&2; exit 1
fi
python3 scripts/check-fn-length.py "$fixture/good/src" > /dev/null \
  || { echo "check-fn-length.py failed a long function that says why" >&2; exit 1; }

# The architecture map: a module it does not name, and a test file out of the layout.
mkdir -p "$fixture/doc/model/src" "$fixture/doc/otel/src" "$fixture/doc/flags/src" "$fixture/doc/server/src/a" "$fixture/doc/operator/src" "$fixture/doc/docs"
for c in model otel flags server operator; do echo '//! x' > "$fixture/doc/$c/src/lib.rs"; done
echo '//! y' > "$fixture/doc/server/src/a/b.rs"
printf '# `quiver-model`\n`lib.rs`\n# `quiver-otel`\n`lib.rs`\n# `quiver-flags`\n`lib.rs`\n# `quiver-server`\n`lib.rs`\n# `quiver-operator`\n`lib.rs`\n' > "$fixture/doc/docs/architecture.md"
if (cd "$fixture/doc" && python3 "$OLDPWD/scripts/check-architecture.py") > /dev/null; then
  echo "check-architecture.py passed a map that does not name server/src/a/b.rs" >&2; exit 1
fi
sed -i 's/^# `quiver-server`$/# `quiver-server`\n`a\/b.rs`/' "$fixture/doc/docs/architecture.md"
(cd "$fixture/doc" && python3 "$OLDPWD/scripts/check-architecture.py") > /dev/null \
  || { echo "check-architecture.py failed a map that names every module" >&2; exit 1; }
mkdir -p "$fixture/doc/server/src/a/tests"
if (cd "$fixture/doc" && python3 "$OLDPWD/scripts/check-architecture.py") > /dev/null; then
  echo "check-architecture.py passed a tests/ folder under src/" >&2; exit 1
fi

crates=(model/src otel/src flags/src server/src operator/src)
python3 scripts/check-cycles.py "${crates[@]}"
python3 scripts/check-fn-length.py "${crates[@]}"
python3 scripts/check-architecture.py
