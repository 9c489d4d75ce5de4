//go:build tools

// Pins SeaweedFS (the S3-compatible server of the artifact-store tests, docs/object-storage.md) in this module.
package tools

import _ "github.com/seaweedfs/seaweedfs/weed"
