//go:build tools

// Package tools pins, through go.mod and go.sum, the helm that `make artifact` builds into the
// offline artifact's bin/ (docs/artifact.md). It is never compiled.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
