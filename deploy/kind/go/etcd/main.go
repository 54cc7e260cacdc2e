// etcd for the locally built kind node image: the upstream server entry point, built
// through this module because etcd's own main module carries replace directives that keep
// `go install` from working.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
