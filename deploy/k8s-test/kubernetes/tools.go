//go:build tools

// Package tools pins, through go.mod and go.sum, the Kubernetes control plane and etcd that
// scripts/k8s-test-bins.sh builds for the tests (docs/k8s-testing.md). It is never compiled.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
