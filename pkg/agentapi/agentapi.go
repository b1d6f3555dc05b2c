// Package agentapi holds what mizar-nodeagent serves on its health address
// besides /metrics and /healthz (drop events, traces), as JSON: the types
// both the agent and mizarctl use, with no dependency on either.
package agentapi

import (
	"net/netip"
	"time"
)

// Paths the agent serves.
const (
	// PathDrops serves DropsResponse; ?since=<RFC 3339> keeps later events,
	// ?wait=<seconds> waits up to that long for one.
	PathDrops = "/drops"
	// PathTracePod serves TraceResponse for ?vni=&ip=&dst=[&src=][&proto=
	// tcp|udp|icmp][&sport=][&dport=]: a packet the pod (vni, ip) of the node
	// sends to dst, from src (its own address by default).
	PathTracePod = "/trace/pod"
	// PathState serves the node's datapath as text: programs, counters,
	// and every entry of its maps (mizarctl sysdump).
	PathState = "/state"
	// PathProbe serves ProbeResponse for ?vni=&ip=&dst=[&count=]: real ICMP
	// echoes from inside the pod (vni, ip) of the node to dst.
	PathProbe = "/probe"
	// PathTraceUnderlay serves TraceResponse for a frame POSTed as the body,
	// as if it arrived on the node's underlay.
	PathTraceUnderlay = "/trace/underlay"
)

// DropEvent is one dropped packet a program reported.
type DropEvent struct {
	Time time.Time `json:"time"`
	// Program is "underlay" (XDP) or "pod" (TC on a pod's veth); Reason the
	// drop counter (mizar_dataplane_packets_total's reason; NetworkPolicy's
	// prefixed "policy_").
	Program string `json:"program"`
	Reason  string `json:"reason"`
	Ifindex uint32 `json:"ifindex"`
	Len     uint32 `json:"len"`
	// Suppressed counts the drops on the same CPU not reported before it.
	Suppressed uint32 `json:"suppressed,omitempty"`
	// Outer addresses and VNI of a Geneve frame.
	OuterSrc netip.Addr `json:"outerSrc,omitzero"`
	OuterDst netip.Addr `json:"outerDst,omitzero"`
	VNI      uint32     `json:"vni,omitempty"`
	// The (inner) IPv4 packet.
	Src     netip.Addr `json:"src,omitzero"`
	Dst     netip.Addr `json:"dst,omitzero"`
	Proto   uint8      `json:"proto,omitempty"`
	SrcPort uint16     `json:"srcPort,omitempty"`
	DstPort uint16     `json:"dstPort,omitempty"`
}

// DropsResponse is what PathDrops serves.
type DropsResponse struct {
	Droplet string `json:"droplet"`
	// Total counts every event the agent has received since it started;
	// Events are the latest it keeps, oldest first.
	Total  uint64      `json:"total"`
	Events []DropEvent `json:"events"`
}

// TraceResponse is one node's part of a trace.
type TraceResponse struct {
	Droplet  string   `json:"droplet"`
	Program  string   `json:"program"`
	Verdict  string   `json:"verdict"`
	Counters []string `json:"counters"`
	// Drop is the drop reason when Next is NextDrop.
	Drop string `json:"drop,omitempty"`
	Next string `json:"next"`
	// Host is the underlay address the packet goes to (NextUnderlay).
	Host string `json:"host,omitempty"`
	// Out is the frame as the program left it: what Host receives.
	Out []byte `json:"out,omitempty"`
}

// Where a traced packet goes after a node (TraceResponse.Next).
const (
	NextDrop     = "drop"
	NextUnderlay = "underlay"
	NextPod      = "pod"
	NextHost     = "host"
	NextReply    = "reply"
)

// ProbeResponse is the outcome of a probe from a pod.
type ProbeResponse struct {
	Droplet  string        `json:"droplet"`
	Sent     int           `json:"sent"`
	Received int           `json:"received"`
	RTT      time.Duration `json:"rtt"`
	// Error says why the probe could not be sent (no such pod, ...).
	Error string `json:"error,omitempty"`
}

// HeartbeatLabel marks the agents' heartbeat Leases (coordination.k8s.io,
// in the workload cluster); its value is the droplet.
const HeartbeatLabel = "mizar.dev/agent-heartbeat"

// HeartbeatLeaseName is the name of droplet's heartbeat Lease.
func HeartbeatLeaseName(droplet string) string { return "mizar-agent-" + droplet }
