#!/usr/bin/env python3
"""Writes a one-layer OCI image layout from a root file system tree, byte for byte the same
for the same tree and arguments (what `make release` needs for reproducible digests):

    oci-image.py --rootfs DIR --out LAYOUT --tag TAG --created EPOCH \
        --entrypoint /usr/local/bin/quiver-server --port 8080 --port 9090 \
        [--arch amd64 [--variant v8]] [--user 65532:65532] [--env PATH=/usr/local/bin] [--annotation K=V]...

    oci-image.py index --out LAYOUT --tag TAG --image LAYOUT... [--annotation K=V]...

Every entry of the layer is written in name order with mtime EPOCH, owner 0:0 and no user or
group names, files 0644 or 0755 (by their executable bit), directories 0755 (1777 where the
tree's directory is sticky, as /tmp is); the layer is gzip-compressed with no name and
time in its header. The annotations go on the manifest and, as labels, in the image config
(where `docker inspect` shows them); `created` is EPOCH. Prints the manifest's digest.

`index` gathers images written that way (one platform each) into one multi-platform image:
an OCI image index over their manifests, in the order given, each with its platform, the
annotations on the index, tagged TAG, with every blob in LAYOUT. Prints the index's digest.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import io
import json
import os
import stat
import sys
import tarfile
from pathlib import Path

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
INDEX = "application/vnd.oci.image.index.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"


def layer_tar(rootfs: Path, epoch: int) -> bytes:
    """The uncompressed layer: every path under rootfs, sorted, with normalised metadata."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        paths = sorted(p for p in rootfs.rglob("*"))
        for path in paths:
            rel = path.relative_to(rootfs).as_posix()
            st = path.lstat()
            info = tarfile.TarInfo(rel)
            info.mtime = epoch
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
                info.mode = 0o1777 if st.st_mode & stat.S_ISVTX else 0o755
                tar.addfile(info)
            elif stat.S_ISREG(st.st_mode):
                info.mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
                info.size = st.st_size
                with path.open("rb") as f:
                    tar.addfile(info, f)
            elif stat.S_ISLNK(st.st_mode):
                info.type = tarfile.SYMTYPE
                info.linkname = os.readlink(path)
                info.mode = 0o777
                tar.addfile(info)
            else:
                raise SystemExit(f"{rel}: only files, directories and symlinks go in an image")
    return buf.getvalue()


def gzip_bytes(data: bytes) -> bytes:
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as gz:
        gz.write(data)
    return out.getvalue()


def canonical(obj: dict) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


class Layout:
    def __init__(self, out: Path):
        self.blobs = out / "blobs" / "sha256"
        self.blobs.mkdir(parents=True, exist_ok=True)
        (out / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')

    def put(self, data: bytes, media_type: str) -> dict:
        digest = hashlib.sha256(data).hexdigest()
        (self.blobs / digest).write_bytes(data)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}

    def tag(self, desc: dict, tag: str) -> None:
        """Writes index.json: the layout holds one tagged artifact, `desc`."""
        desc = dict(desc, annotations={REF_NAME: tag})
        index = {"schemaVersion": 2, "mediaType": INDEX, "manifests": [desc]}
        (self.blobs.parent.parent / "index.json").write_bytes(canonical(index))


def platform_image(layout: Path) -> dict:
    """The descriptor of the one image a single-platform layout holds, without its tag."""
    manifests = json.loads((layout / "index.json").read_text())["manifests"]
    if len(manifests) != 1 or manifests[0].get("mediaType") != MANIFEST or "platform" not in manifests[0]:
        raise SystemExit(f"{layout}: not a layout of one single-platform image")
    return {k: v for k, v in manifests[0].items() if k != "annotations"}


def index_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="oci-image.py index")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--image", type=Path, action="append", required=True)
    ap.add_argument("--annotation", action="append", default=[])
    args = ap.parse_args(argv)

    layout = Layout(args.out)
    manifests, platforms = [], set()
    for image in args.image:
        desc = platform_image(image)
        platform = json.dumps(desc["platform"], sort_keys=True)
        if platform in platforms:
            raise SystemExit(f"{image}: a second image for platform {platform}")
        platforms.add(platform)
        for blob in sorted((image / "blobs" / "sha256").iterdir()):
            layout.put(blob.read_bytes(), "")
        manifests.append(desc)
    index = {
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": manifests,
        "annotations": dict(a.split("=", 1) for a in args.annotation),
    }
    desc = layout.put(canonical(index), INDEX)
    layout.tag(desc, args.tag)
    print(desc["digest"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rootfs", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--created", type=int, required=True, help="SOURCE_DATE_EPOCH")
    ap.add_argument("--entrypoint", required=True)
    ap.add_argument("--port", action="append", default=[])
    ap.add_argument("--arch", default="amd64")
    ap.add_argument("--variant")
    ap.add_argument("--user", default="65532:65532")
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--annotation", action="append", default=[])
    args = ap.parse_args()

    annotations = dict(a.split("=", 1) for a in args.annotation)
    created = datetime.datetime.fromtimestamp(args.created, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    platform = {"architecture": args.arch, "os": "linux"}
    if args.variant:
        platform["variant"] = args.variant
    tar = layer_tar(args.rootfs, args.created)
    layout = Layout(args.out)
    layer = layout.put(gzip_bytes(tar), LAYER)
    config = {
        "created": created,
        **platform,
        "config": {
            "User": args.user,
            "Env": args.env,
            "Entrypoint": [args.entrypoint],
            "ExposedPorts": {f"{p}/tcp": {} for p in args.port},
            "Labels": annotations,
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(tar).hexdigest()}"]},
        "history": [{"created": created, "created_by": "scripts/oci-image.py (deploy/images/layout.sh tree)"}],
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": layout.put(canonical(config), CONFIG),
        "layers": [layer],
        "annotations": annotations,
    }
    desc = layout.put(canonical(manifest), MANIFEST)
    desc["platform"] = platform
    layout.tag(desc, args.tag)
    print(desc["digest"])


if __name__ == "__main__":
    if sys.argv[1:2] == ["index"]:
        index_main(sys.argv[2:])
    else:
        main()
