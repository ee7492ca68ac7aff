// Command etcd is etcd's server, built from the go.etcd.io/etcd/server/v3 module this go.mod pins.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
