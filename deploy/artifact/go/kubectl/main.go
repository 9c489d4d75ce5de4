// Command kubectl is Kubernetes' cmd/kubectl (the same three calls), built from the published
// k8s.io/kubectl module at the artifact's Kubernetes version rather than from k8s.io/kubernetes,
// whose staging replaces a dependant cannot resolve (docs/artifact.md).
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"

	// The client auth plugins (exec, OIDC) as upstream's kubectl has them.
	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

func main() {
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		util.CheckErr(err)
	}
}
