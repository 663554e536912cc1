// Command etcd is upstream etcd's server, built from the go.etcd.io/etcd/server/v3 module
// that k8s.io/kubernetes already depends on (so its version is the one Kubernetes tests with).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
