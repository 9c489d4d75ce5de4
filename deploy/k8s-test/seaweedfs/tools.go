//go:build tools

// Package tools pins, through go.mod and go.sum, the SeaweedFS that scripts/seaweedfs-bin.sh builds
// for the artifact-store tests (docs/object-storage.md). It is never compiled.
package tools

import (
	_ "github.com/seaweedfs/seaweedfs/weed"
)
