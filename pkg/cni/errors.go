package cni

// Plugin-specific CNI error codes (the spec reserves 0-99).
const (
	// CodeInterfaceExists: CNI_IFNAME already exists in the pod's netns.
	CodeInterfaceExists uint = 100
	// CodeNotProvisioned: the endpoint did not become Provisioned in time,
	// or failed.
	CodeNotProvisioned uint = 101
	// CodeSubnetFull: the subnet has no free address.
	CodeSubnetFull uint = 102
	// CodeAPI: mizar-apiserver refused or could not be reached.
	CodeAPI uint = 103
	// CodeNetwork: setting up links, addresses, routes or programs failed.
	CodeNetwork uint = 104
	// CodeAddressOnNode: another pod of this node (of another VPC, whose
	// addresses overlap) holds the same IP; the node's own traffic to a
	// pod (probes, replies) could not tell them apart.
	CodeAddressOnNode uint = 105
)
