#!/usr/bin/env bash
# Builds a kind node image for Kubernetes v$K8S_VERSION without pulling anything: a
# debootstrapped base following kind's base-image contract, every component image
# (apiserver, controller-manager, scheduler, proxy, etcd, coredns, pause, kindnetd,
# local-path-provisioner and its helper) built from Go modules, Debian packages and C, and
# all of them preloaded into the node's containerd. Prints the node image name.
#
# Everything lands in the Docker engine's data root under ~/.cache/quiver/docker, tagged
# with a key made of the versions and of the files that go into the images: a warm run checks one
# tag and returns. See deploy/kind/README.md for the layout and the reasons behind it.
set -euo pipefail
source "$(dirname "$0")/../../scripts/lib.sh"

K8S_VERSION="${K8S_VERSION:-1.33.13}"
KIND_VERSION="${KIND_VERSION:-v0.27.0}"
ETCD_VERSION=3.5.35      # served under the tag kubeadm v1.33 expects (3.5.24-0)
COREDNS_VERSION=v1.12.0
LPP_VERSION=v0.0.30      # rancher/local-path-provisioner (v0.0.31 is not on the Go proxy)
SUITE=bookworm
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
here="$ROOT/deploy/kind"
DOCKER="${DOCKER:-docker}"

key="$( (echo "$K8S_VERSION $KIND_VERSION $ETCD_VERSION $COREDNS_VERSION $LPP_VERSION $SUITE"
         cd "$here" && find build-node-image.sh go images manifests -type f | LC_ALL=C sort | xargs sha256sum) \
       | sha256sum | cut -c1-12)"
NODE_IMAGE="quiver.dev/kind-node:v$K8S_VERSION-$key"
if "$DOCKER" image inspect "$NODE_IMAGE" >/dev/null 2>&1; then
  echo "$NODE_IMAGE"
  exit 0
fi

k8s_bin="$("$ROOT/scripts/k8s-binaries.sh" --node)"
kind_src="$(go env GOMODCACHE)/sigs.k8s.io/kind@$KIND_VERSION"
[ -d "$kind_src/images/base/files" ] || { echo "kind $KIND_VERSION sources missing from the Go module cache" >&2; exit 1; }
work="$QUIVER_CACHE/kind/work"
out="$QUIVER_CACHE/kind/bin"
mkdir -p "$work" "$out"
command -v debootstrap >/dev/null || { log "installing debootstrap and busybox-static"; apt_install debootstrap busybox-static; }
[ -x /bin/busybox ] || apt_install busybox-static

# ---- Go-built components (cached by version) -------------------------------------------
gobuild() { # name version-stamp dir-with-go.mod
  local name="$1" stamp="$out/$1.version"
  [ -x "$out/$name" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$2" ] && return
  log "building $name $2 from Go modules"
  rm -rf "$work/go-$name" && cp -r "$3" "$work/go-$name"
  (cd "$work/go-$name" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/$name" .)
  echo "$2" > "$stamp"
}
gobuild etcd "$ETCD_VERSION" "$here/go/etcd"
gobuild coredns "$COREDNS_VERSION" "$here/go/coredns"
if [ ! -x "$out/local-path-provisioner" ] || [ "$(cat "$out/local-path-provisioner.version" 2>/dev/null)" != "$LPP_VERSION" ]; then
  log "building local-path-provisioner $LPP_VERSION"
  GOBIN="$out" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "github.com/rancher/local-path-provisioner@$LPP_VERSION"
  echo "$LPP_VERSION" > "$out/local-path-provisioner.version"
fi
pause_src="$(go env GOMODCACHE)/k8s.io/kubernetes@v$K8S_VERSION/build/pause/linux/pause.c"
if [ ! -x "$out/pause" ] || [ "$pause_src" -nt "$out/pause" ]; then
  log "compiling pause (gcc -static)"
  gcc -Os -static -o "$out/pause" -DVERSION="v3.10-quiver" "$pause_src"
  strip "$out/pause"
fi

# ---- root filesystems from Debian ------------------------------------------------------
rootfs_image() { # image-name packages
  local name="$1" pkgs="$2"
  "$DOCKER" image inspect "$name" >/dev/null 2>&1 && return
  log "debootstrap $SUITE for $name"
  local dir="$work/rootfs-${name//[:\/]/-}"
  rm -rf "$dir"
  debootstrap --variant=minbase --include="$pkgs" "$SUITE" "$dir" "$MIRROR" > "$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/* "$dir"/usr/share/doc "$dir"/usr/share/man
  tar -C "$dir" -c . | "$DOCKER" import - "$name" >/dev/null
  rm -rf "$dir"
}
rootfs_image "quiver.dev/kind-rootfs-node:$SUITE" \
  systemd,systemd-sysv,dbus,containerd,runc,iptables,nftables,conntrack,socat,ethtool,mount,util-linux,iproute2,kmod,pigz,ca-certificates,jq,procps,containernetworking-plugins,libseccomp2,bash,curl
rootfs_image "quiver.dev/kind-rootfs-net:$SUITE" iptables,nftables,iproute2,conntrack,kmod,ca-certificates

# ---- images ------------------------------------------------------------------------------
ctx="$work/ctx"
build() { # tag dockerfile-text (context: $ctx)
  printf '%s\n' "$2" > "$ctx/Dockerfile"
  quiet_build "$1" "$ctx"
}
fresh_ctx() { rm -rf "$ctx" && mkdir -p "$ctx"; }
scratch_files() { # passwd, group, CA bundle for FROM scratch images
  mkdir -p "$ctx/etc/ssl/certs"
  cp /etc/ssl/certs/ca-certificates.crt "$ctx/etc/ssl/certs/"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n' > "$ctx/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\n' > "$ctx/etc/group"
}

log "component images"
images=()
for c in kube-apiserver kube-controller-manager kube-scheduler; do
  fresh_ctx; scratch_files; cp "$k8s_bin/$c" "$ctx/"
  build "registry.k8s.io/$c:v$K8S_VERSION" "FROM scratch
COPY etc /etc
COPY $c /usr/local/bin/$c
ENV PATH=/usr/local/bin:/usr/bin:/bin
ENTRYPOINT [\"/usr/local/bin/$c\"]"
  images+=("registry.k8s.io/$c:v$K8S_VERSION")
done

etcd_tag="$("$k8s_bin/kubeadm" config images list --kubernetes-version "v$K8S_VERSION" | grep /etcd:)"
fresh_ctx; scratch_files; cp "$out/etcd" "$ctx/"; mkdir -p "$ctx/var/lib/etcd"
build "$etcd_tag" 'FROM scratch
COPY etc /etc
COPY var /var
COPY etcd /usr/local/bin/etcd
ENV PATH=/usr/local/bin:/usr/bin:/bin
ENTRYPOINT ["/usr/local/bin/etcd"]'
images+=("$etcd_tag")

coredns_tag="$("$k8s_bin/kubeadm" config images list --kubernetes-version "v$K8S_VERSION" | grep /coredns:)"
fresh_ctx; scratch_files; cp "$out/coredns" "$ctx/"
build "$coredns_tag" 'FROM scratch
COPY etc /etc
COPY coredns /coredns
EXPOSE 53 53/udp
ENTRYPOINT ["/coredns"]'
images+=("$coredns_tag")

pause_tag="$("$k8s_bin/kubeadm" config images list --kubernetes-version "v$K8S_VERSION" | grep /pause:)"
fresh_ctx; cp "$out/pause" "$ctx/"
build "$pause_tag" 'FROM scratch
COPY pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]'
images+=("$pause_tag")

fresh_ctx; cp "$k8s_bin/kube-proxy" "$here/images/kube-proxy/iptables-wrapper" "$ctx/"
build "registry.k8s.io/kube-proxy:v$K8S_VERSION" "FROM quiver.dev/kind-rootfs-net:$SUITE
COPY kube-proxy /usr/local/bin/kube-proxy
COPY iptables-wrapper /usr/sbin/iptables-wrapper
RUN for t in iptables ip6tables; do \\
      update-alternatives --install /usr/sbin/\$t \$t /usr/sbin/iptables-wrapper 100 \\
        --slave /usr/sbin/\$t-restore \$t-restore /usr/sbin/iptables-wrapper \\
        --slave /usr/sbin/\$t-save \$t-save /usr/sbin/iptables-wrapper \\
      && update-alternatives --set \$t /usr/sbin/iptables-wrapper; done
ENTRYPOINT [\"/usr/local/bin/kube-proxy\"]"
images+=("registry.k8s.io/kube-proxy:v$K8S_VERSION")

KINDNET_IMAGE="quiver.dev/kindnetd:$key"
fresh_ctx; cp "$k8s_bin/kubectl" "$here/images/kindnet/kindnetd" "$ctx/"
build "$KINDNET_IMAGE" "FROM quiver.dev/kind-rootfs-net:$SUITE
COPY kubectl /usr/local/bin/kubectl
COPY kindnetd /usr/local/bin/kindnetd
ENTRYPOINT [\"/usr/local/bin/kindnetd\"]"
images+=("$KINDNET_IMAGE")

# local-path-provisioner and its helper, under the names kind's storage manifest uses.
storage_go="$kind_src/pkg/build/nodeimage/const_storage.go"
lpp_tag="$(sed -n 's/^const storageProvisionerImage = "\(.*\)"$/\1/p' "$storage_go")"
helper_tag="$(sed -n 's/^const storageHelperImage = "\(.*\)"$/\1/p' "$storage_go")"
[ -n "$lpp_tag" ] && [ -n "$helper_tag" ] || { echo "cannot read the storage image names from $storage_go" >&2; exit 1; }
fresh_ctx; scratch_files; cp "$out/local-path-provisioner" "$ctx/"
build "$lpp_tag" 'FROM scratch
COPY etc /etc
COPY local-path-provisioner /usr/bin/local-path-provisioner
ENV PATH=/usr/bin:/bin
ENTRYPOINT ["/usr/bin/local-path-provisioner"]'
fresh_ctx; mkdir -p "$ctx/bin"; cp /bin/busybox "$ctx/bin/"
for a in sh mkdir rm ls cat chmod; do ln -s busybox "$ctx/bin/$a"; done
build "$helper_tag" 'FROM scratch
COPY bin /bin
ENV PATH=/bin'
images+=("$lpp_tag" "$helper_tag")

# ---- the base image: kind's base-image contract on the debootstrapped rootfs -------------
BASE_IMAGE="quiver.dev/kind-base:$key"
log "base image $BASE_IMAGE"
fresh_ctx
kf="$kind_src/images/base/files"
mkdir -p "$ctx/usr/local/bin" "$ctx/kind/bin" "$ctx/etc/containerd" "$ctx/etc/default" "$ctx/etc/sysctl.d" \
  "$ctx/etc/systemd/system/kubelet.service.d"
cp "$kf/usr/local/bin/entrypoint" "$ctx/usr/local/bin/"
cp "$kf"/kind/bin/* "$ctx/kind/bin/"
cp "$kf/etc/crictl.yaml" "$ctx/etc/"
cp "$kf/etc/default/kubelet" "$ctx/etc/default/"
cp "$kf"/etc/sysctl.d/* "$ctx/etc/sysctl.d/"
for u in containerd.service kubelet.service kubelet.slice undo-mount-hacks.service; do
  cp "$kf/etc/systemd/system/$u" "$ctx/etc/systemd/system/"
done
cp "$kf"/etc/systemd/system/kubelet.service.d/* "$ctx/etc/systemd/system/kubelet.service.d/"
# Debian ships containerd in /usr/bin. kind's config: drop the fuse-overlayfs proxy plugin
# (rootless only), and restrict oom_score_adj so pods start where the host withholds
# CAP_SYS_RESOURCE (runc otherwise fails: "can't get final child's PID from pipe: EOF").
sed -i 's|^ExecStart=/usr/local/bin/containerd|ExecStart=/usr/bin/containerd|' "$ctx/etc/systemd/system/containerd.service"
python3 - "$kf/etc/containerd/config.toml" "$ctx/etc/containerd/config.toml" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
text = re.sub(r'\[proxy_plugins\][^\[]*\[proxy_plugins\."fuse-overlayfs"\][^\[]*', '', text)
text, n = re.subn(r'restrict_oom_score_adj = false', 'restrict_oom_score_adj = true', text)
assert n == 1 and 'fuse-overlayfs' not in text, "kind's containerd config changed shape"
open(sys.argv[2], 'w').write(text)
PY
build "$BASE_IMAGE" "FROM quiver.dev/kind-rootfs-node:$SUITE
COPY usr /usr
COPY kind /kind
COPY etc /etc
RUN chmod 0755 /usr/local/bin/entrypoint /kind/bin/*.sh \\
 && mkdir -p /opt/cni/bin /etc/kubernetes/manifests \\
 && ln -sf /usr/lib/cni/* /opt/cni/bin/ \\
 && ctr oci spec \\
    | jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {\"path\": \"/kind/bin/mount-product-files.sh\"}' \\
    | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json \\
 && find /lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete \\
 && rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \\
      /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \\
      /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/* \\
 && echo ReadKMsg=no >> /etc/systemd/journald.conf \\
 && systemctl enable kubelet.service containerd.service undo-mount-hacks.service \\
 && systemctl mask systemd-binfmt.service
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT [\"/usr/local/bin/entrypoint\", \"/sbin/init\"]"

# ---- the node image: binaries, manifests and preloaded images, as kind's builder does ----
log "node image $NODE_IMAGE (preloading ${#images[@]} images)"
fresh_ctx
mkdir -p "$ctx/images" "$ctx/manifests"
for i in "${images[@]}"; do "$DOCKER" save "$i" -o "$ctx/images/$(echo "$i" | tr '/:' '__').tar"; done
sed "s|@KINDNET_IMAGE@|$KINDNET_IMAGE|" "$here/manifests/default-cni.yaml" > "$ctx/manifests/default-cni.yaml"
python3 - "$storage_go" "$lpp_tag" "$helper_tag" > "$ctx/manifests/default-storage.yaml" <<'PY'
import re, sys
src, lpp, helper = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
# The manifest is one Go string expression: raw strings joined with the image constants.
expr = re.search(r'^const defaultStorageManifest = (`.*?\n`)$', src, re.S | re.M).group(1)
expr = expr.replace('` + storageProvisionerImage + `', lpp).replace('` + storageHelperImage + `', helper)
assert expr.count('`') == 2, "kind's storage manifest changed shape"
print(expr.strip('`'))
PY
builder="quiver-kind-build-$$"
trap '"$DOCKER" rm -f "$builder" >/dev/null 2>&1 || true' EXIT
"$DOCKER" run -d --name "$builder" --privileged --entrypoint=sleep "$BASE_IMAGE" infinity >/dev/null
for b in kubeadm kubelet kubectl; do "$DOCKER" cp "$k8s_bin/$b" "$builder:/usr/bin/$b"; done
"$DOCKER" cp "$ctx/manifests" "$builder:/kind/manifests"
"$DOCKER" cp "$ctx/images" "$builder:/kind/images"
"$DOCKER" exec "$builder" sh -c "echo v$K8S_VERSION > /kind/version"
"$DOCKER" exec "$builder" sh -c 'containerd > /var/log/containerd-build.log 2>&1 &
  for i in $(seq 1 100); do ctr version >/dev/null 2>&1 && break; sleep 0.1; done
  for t in /kind/images/*.tar; do ctr --namespace=k8s.io images import --all-platforms --no-unpack --digests "$t" >/dev/null || exit 1; done
  echo "$(ctr --namespace=k8s.io images ls -q | grep -vc ^sha256:) image references preloaded" >&2
  pkill containerd; while pgrep -x containerd >/dev/null; do sleep 0.1; done
  rm -rf /kind/images /var/log/containerd-build.log'
"$DOCKER" commit --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' --change 'CMD []' \
  "$builder" "$NODE_IMAGE" >/dev/null
# Older builds of these images (other keys) only take disk; images in use stay.
"$DOCKER" images --format '{{.Repository}}:{{.Tag}}' \
  | grep -E '^quiver\.dev/(kind-node|kind-base|kindnetd):' | grep -v -- "$key\$" \
  | xargs -r "$DOCKER" rmi >/dev/null 2>&1 || true
echo "$NODE_IMAGE"
