// Command mizar-cni is mizar's CNI plugin: it forwards every call to the node
// agent (see pkg/cni).
package main

import "mizar.dev/pkg/cni"

func main() { cni.Main() }
