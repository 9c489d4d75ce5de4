// Command pause is the sandbox ("pause") container of the tests' real nodes (docs/k8s-testing.md):
// it holds a pod's namespaces open until the kubelet stops the pod, and, being PID 1 of a pod that
// shares its PID namespace, reaps the zombies handed to it. Static, so its image is one file.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
