module sxwl.ai/k8s-test/pause

go 1.26.0
