module quiver.dev/kind/etcd

go 1.24

require go.etcd.io/etcd/server/v3 v3.5.35
