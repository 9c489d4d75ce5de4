//go:build tools

// Package tools pins, through go.mod and go.sum, the helm that scripts/k8s-test-bins.sh builds for
// the tests (docs/k8s-testing.md). It is never compiled.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
