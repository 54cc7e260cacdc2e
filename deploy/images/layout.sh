#!/bin/sh
# The file layout of the Quiver images, shared by the local build (scripts/images.sh) and
# the multi-stage Dockerfile so both produce the same trees:
#   /usr/local/bin/<binaries>   static (glibc crt-static) release builds
#   /etc/passwd, /etc/group     a non-root user quiver (65532)
#   /etc/ssl/certs/ca-certificates.crt   for the http handler and the API server client
#   /tmp                        world-writable, sticky (mounted as emptyDir where the root fs is read-only)
# usage: layout.sh DEST CA_BUNDLE BINARY...
set -eu
dest="$1" ca="$2"; shift 2
rm -rf "$dest"
mkdir -p "$dest/usr/local/bin" "$dest/etc/ssl/certs" "$dest/tmp"
chmod 1777 "$dest/tmp"
for b in "$@"; do cp "$b" "$dest/usr/local/bin/"; done
cp "$ca" "$dest/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nquiver:x:65532:65532:quiver:/tmp:/sbin/nologin\n' > "$dest/etc/passwd"
printf 'root:x:0:\nquiver:x:65532:\n' > "$dest/etc/group"
