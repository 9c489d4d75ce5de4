// Command coredns is CoreDNS with only the plugins the tests' cluster DNS uses (docs/k8s-testing.md):
// the kubernetes plugin answers <pod>.<headless-service>.<ns>.svc.cluster.local from the API server.
// CoreDNS's own main compiles in every plugin, and with them the cloud SDKs and tracers they import;
// this one links the same coremain with a handful, pinned through go.mod at the version in
// scripts/k8s-test-bins.sh.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

var plugins = map[string]bool{
	"bind": true, "cache": true, "errors": true, "health": true, "kubernetes": true, "log": true, "ready": true,
}

func init() {
	// Keep upstream's execution order (the order of dnsserver.Directives matters), less what is not linked.
	kept := dnsserver.Directives[:0:0]
	for _, name := range dnsserver.Directives {
		if plugins[name] {
			kept = append(kept, name)
		}
	}
	dnsserver.Directives = kept
}

func main() {
	coremain.Run()
}
