package cni

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
)

// NetConf is mizar's plugin configuration in a conflist.
type NetConf struct {
	types.PluginConf
	// VPC and Subnet place the pod's endpoint; K8S_POD_NAMESPACE and
	// K8S_POD_NAME in CNI_ARGS name it.
	VPC    string `json:"vpc"`
	Subnet string `json:"subnet"`
	// AgentSocket is the node agent's socket (DefaultSocket if empty).
	AgentSocket string `json:"agentSocket,omitempty"`
	// DeleteQueue is where DELs wait while the agent is down
	// (DefaultDeleteQueue if empty).
	DeleteQueue string `json:"deleteQueue,omitempty"`
	// MTU, when set, is the pods' interface MTU; the agent refuses one above
	// what its underlay carries (underlay MTU minus Geneve's overhead). 0: that maximum.
	MTU int `json:"mtu,omitempty"`
}

// MinMTU is the least MTU an IPv4 interface may have (RFC 791).
const MinMTU = 68

// ParseConf decodes and checks a configuration; errors are CNI errors with
// the spec's codes (6 undecodable, 7 invalid).
func ParseConf(data []byte) (*NetConf, *types.Error) {
	var c NetConf
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "mizar: the network configuration is not valid JSON", err.Error())
	}
	if c.MTU != 0 && c.MTU < MinMTU {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("mizar: network %q: \"mtu\": %d is below IPv4's minimum of %d (leave it out for the node's largest)", c.Name, c.MTU, MinMTU), "")
	}
	if c.AgentSocket == "" {
		c.AgentSocket = DefaultSocket
	}
	if c.DeleteQueue == "" {
		c.DeleteQueue = DefaultDeleteQueue
	}
	return &c, nil
}

// CheckPlacement is what ADD needs beyond ParseConf: a subnet to place the pod in.
func (c *NetConf) CheckPlacement() *types.Error {
	var missing []string
	if c.VPC == "" {
		missing = append(missing, `"vpc"`)
	}
	if c.Subnet == "" {
		missing = append(missing, `"subnet"`)
	}
	if len(missing) > 0 {
		return types.NewError(types.ErrInvalidNetworkConfig,
			fmt.Sprintf("mizar: network %q: set %s in the mizar plugin's entry of the conflist", c.Name, strings.Join(missing, " and ")), "")
	}
	return nil
}

// PodArgs are the CNI_ARGS the agent reads.
type PodArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE types.UnmarshallableString //nolint:revive // the names are CNI_ARGS keys
	K8S_POD_NAME      types.UnmarshallableString //nolint:revive
	// K8S_POD_UID (set by containerd and CRI-O) names the pod an Event about
	// a refused ADD is attached to.
	K8S_POD_UID types.UnmarshallableString //nolint:revive
}

// ParseArgs decodes CNI_ARGS; unknown keys are ignored, as the spec asks.
func ParseArgs(args string) (*PodArgs, *types.Error) {
	var a PodArgs
	a.IgnoreUnknown = true
	if err := types.LoadArgs(args, &a); err != nil {
		return nil, types.NewError(types.ErrInvalidEnvironmentVariables, "mizar: CNI_ARGS cannot be parsed", err.Error())
	}
	return &a, nil
}
