// +k8s:deepcopy-gen=package
// +groupName=networking.mizar.dev

// Package networking is the internal (hub) version of the networking.mizar.dev API:
// VPCs, their subnets, the dividers and bouncers that route between them, the
// droplets (nodes) that host everything, and the endpoints (pod interfaces).
package networking
