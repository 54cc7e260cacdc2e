module quiver.dev/kind/coredns

go 1.24

require github.com/coredns/coredns v1.12.0
