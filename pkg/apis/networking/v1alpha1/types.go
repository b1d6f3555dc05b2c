package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"mizar.dev/pkg/apis/networking"
)

// Phase is where an object is in its lifecycle. Init and Provisioned are the two
// persisted states; exactly one component writes each transition.
// +enum
type Phase string

const (
	// PhaseInit: stored, not yet serving traffic.
	PhaseInit Phase = "Init"
	// PhaseProvisioned: the dataplane serves the object.
	PhaseProvisioned Phase = "Provisioned"
	// PhaseTerminating: deletion requested, dependants are being drained.
	PhaseTerminating Phase = "Terminating"
	// PhaseFailed: provisioning failed permanently; conditions say why.
	PhaseFailed Phase = "Failed"
)

// ProvisioningStatus is the part of every status that the lifecycle contract needs.
type ProvisioningStatus struct {
	// phase is the lifecycle state: Init, Provisioned, Terminating or Failed.
	// +optional
	Phase Phase `json:"phase,omitempty" protobuf:"bytes,1,opt,name=phase,casttype=Phase"`
	// observedGeneration is the metadata.generation the last phase change acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty" protobuf:"varint,2,opt,name=observedGeneration"`
	// conditions are the latest observations of the object's state.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchMergeKey=type
	// +patchStrategy=merge
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type" protobuf:"bytes,3,rep,name=conditions"`
}

// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// Vpc is a virtual private cloud: an isolated IPv4 address space carried on the
// underlay under its own Geneve VNI. Packets never cross from one VPC to another,
// even when their CIDRs overlap.
type Vpc struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty" protobuf:"bytes,1,opt,name=metadata"`

	// +optional
	Spec VpcSpec `json:"spec,omitempty" protobuf:"bytes,2,opt,name=spec"`
	// +optional
	Status VpcStatus `json:"status,omitempty" protobuf:"bytes,3,opt,name=status"`
}

// VpcSpec is the desired state of a VPC.
type VpcSpec struct {
	// cidr is the VPC's IPv4 address range in canonical form, e.g. 10.0.0.0/16. Immutable.
	CIDR string `json:"cidr" protobuf:"bytes,1,opt,name=cidr"`
	// vni is the Geneve virtual network identifier, 1..16777215, unique across VPCs.
	// Leave it 0 (unset) to have the server allocate a free one. Immutable once set.
	// +optional
	VNI int32 `json:"vni,omitempty" protobuf:"varint,2,opt,name=vni"`
	// dividers is how many dividers route this VPC's traffic between its subnets. Defaults to 1.
	// +optional
	Dividers int32 `json:"dividers,omitempty" protobuf:"varint,3,opt,name=dividers"`
}

// VpcStatus is the observed state of a VPC.
type VpcStatus struct {
	ProvisioningStatus `json:",inline" protobuf:"bytes,1,opt,name=provisioningStatus"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// VpcList is a list of VPCs.
type VpcList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty" protobuf:"bytes,1,opt,name=metadata"`

	Items []Vpc `json:"items" protobuf:"bytes,2,rep,name=items"`
}

// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// Subnet is a range of a VPC's addresses. Its bouncers hold every endpoint of the
// subnet and forward traffic to the endpoint's host.
type Subnet struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty" protobuf:"bytes,1,opt,name=metadata"`

	// +optional
	Spec SubnetSpec `json:"spec,omitempty" protobuf:"bytes,2,opt,name=spec"`
	// +optional
	Status SubnetStatus `json:"status,omitempty" protobuf:"bytes,3,opt,name=status"`
}

// SubnetSpec is the desired state of a subnet.
type SubnetSpec struct {
	// vpc is the name of the VPC this subnet belongs to. Immutable.
	VPC string `json:"vpc" protobuf:"bytes,1,opt,name=vpc"`
	// cidr is the subnet's IPv4 range in canonical form. It must lie inside the VPC's
	// cidr and overlap no other subnet of the VPC. Immutable.
	CIDR string `json:"cidr" protobuf:"bytes,2,opt,name=cidr"`
	// bouncers is how many bouncers serve this subnet. Defaults to 1.
	// +optional
	Bouncers int32 `json:"bouncers,omitempty" protobuf:"varint,3,opt,name=bouncers"`
	// gateway is the address pods use as their default gateway; answered by the
	// dataplane, never assigned to an endpoint. Defaults to the first address of cidr.
	// +optional
	Gateway string `json:"gateway,omitempty" protobuf:"bytes,4,opt,name=gateway"`
}

// SubnetStatus is the observed state of a subnet.
type SubnetStatus struct {
	ProvisioningStatus `json:",inline" protobuf:"bytes,1,opt,name=provisioningStatus"`
	// departures are the subnet's most recent endpoint departures, oldest
	// first, at most MaxSubnetDepartures: an endpoint deleted, or moved to
	// another droplet. Every node agent follows subnets, so a host that only
	// learned where an endpoint lives (from a relay, without an entry of its
	// own in the API) forgets it, for delivery and for trust, within one
	// watch event of this list. Written by the Endpoint operator once the
	// endpoint's former host and relays have let it go.
	// +listType=map
	// +listMapKey=sequence
	// +optional
	Departures []EndpointDeparture `json:"departures,omitempty" protobuf:"bytes,2,rep,name=departures"`
}

// MaxSubnetDepartures bounds status.departures of a subnet. An agent that
// finds a gap in the sequence numbers (it missed more than this many
// departures) forgets every learned path into the subnet.
const MaxSubnetDepartures = networking.MaxSubnetDepartures

// EndpointDeparture records that an endpoint left a host.
type EndpointDeparture struct {
	// sequence numbers the subnet's departures: 1, 2, ... without gaps, so a
	// reader can tell whether it missed some.
	Sequence int64 `json:"sequence" protobuf:"varint,1,opt,name=sequence"`
	// endpoint is the endpoint's namespace/name.
	Endpoint string `json:"endpoint" protobuf:"bytes,2,opt,name=endpoint"`
	// ip is the endpoint's address.
	IP string `json:"ip" protobuf:"bytes,3,opt,name=ip"`
	// droplet is the droplet the endpoint left.
	Droplet string `json:"droplet" protobuf:"bytes,4,opt,name=droplet"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// SubnetList is a list of subnets.
type SubnetList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty" protobuf:"bytes,1,opt,name=metadata"`

	Items []Subnet `json:"items" protobuf:"bytes,2,rep,name=items"`
}

// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// Divider routes a VPC's traffic between its subnets: it looks up the destination
// subnet and forwards to one of that subnet's bouncers. Created by the VPC operator.
type Divider struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty" protobuf:"bytes,1,opt,name=metadata"`

	// +optional
	Spec DividerSpec `json:"spec,omitempty" protobuf:"bytes,2,opt,name=spec"`
	// +optional
	Status DividerStatus `json:"status,omitempty" protobuf:"bytes,3,opt,name=status"`
}

// DividerSpec is the desired state of a divider.
type DividerSpec struct {
	// vpc is the name of the VPC this divider serves. Immutable.
	VPC string `json:"vpc" protobuf:"bytes,1,opt,name=vpc"`
	// droplet is the name of the droplet the divider is placed on; empty until placed.
	// +optional
	Droplet string `json:"droplet,omitempty" protobuf:"bytes,2,opt,name=droplet"`
}

// DividerStatus is the observed state of a divider.
type DividerStatus struct {
	ProvisioningStatus `json:",inline" protobuf:"bytes,1,opt,name=provisioningStatus"`
	// appliedResourceVersions holds, per subnet of the divider's VPC, the
	// resourceVersion up to which the agent of the divider's droplet has applied
	// the subnet's endpoints: every endpoint of the subnet whose resourceVersion is
	// not greater is programmed. One entry per subnet because the agent follows
	// each subnet with its own watch stream, and a stream's position says nothing
	// about the others'. A subnet without an entry is not applied yet. Written by
	// that agent once per batch of a stream.
	// +listType=map
	// +listMapKey=subnet
	// +optional
	AppliedResourceVersions []SubnetWatermark `json:"appliedResourceVersions,omitempty" protobuf:"bytes,2,rep,name=appliedResourceVersions"`
}

// SubnetWatermark is the resourceVersion up to which an agent has applied the
// endpoints of one subnet.
type SubnetWatermark struct {
	// subnet is the subnet's name.
	Subnet string `json:"subnet" protobuf:"bytes,1,opt,name=subnet"`
	// resourceVersion is the watermark.
	ResourceVersion string `json:"resourceVersion" protobuf:"bytes,2,opt,name=resourceVersion"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// DividerList is a list of dividers.
type DividerList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty" protobuf:"bytes,1,opt,name=metadata"`

	Items []Divider `json:"items" protobuf:"bytes,2,rep,name=items"`
}

// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// Bouncer holds every endpoint of one subnet and forwards packets to the host of
// their destination. Created by the subnet operator.
type Bouncer struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty" protobuf:"bytes,1,opt,name=metadata"`

	// +optional
	Spec BouncerSpec `json:"spec,omitempty" protobuf:"bytes,2,opt,name=spec"`
	// +optional
	Status BouncerStatus `json:"status,omitempty" protobuf:"bytes,3,opt,name=status"`
}

// BouncerSpec is the desired state of a bouncer.
type BouncerSpec struct {
	// subnet is the name of the subnet this bouncer serves. Immutable.
	Subnet string `json:"subnet" protobuf:"bytes,1,opt,name=subnet"`
	// droplet is the name of the droplet the bouncer is placed on; empty until placed.
	// +optional
	Droplet string `json:"droplet,omitempty" protobuf:"bytes,2,opt,name=droplet"`
}

// BouncerStatus is the observed state of a bouncer.
type BouncerStatus struct {
	ProvisioningStatus `json:",inline" protobuf:"bytes,1,opt,name=provisioningStatus"`
	// appliedResourceVersion is the resourceVersion up to which the agent of the
	// bouncer's droplet has applied the endpoints of the bouncer's subnet: every
	// endpoint of the subnet whose resourceVersion is not greater is programmed.
	// Written by that agent once per batch of its watch stream.
	// +optional
	AppliedResourceVersion string `json:"appliedResourceVersion,omitempty" protobuf:"bytes,2,opt,name=appliedResourceVersion"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// BouncerList is a list of bouncers.
type BouncerList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty" protobuf:"bytes,1,opt,name=metadata"`

	Items []Bouncer `json:"items" protobuf:"bytes,2,rep,name=items"`
}

// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// Endpoint is one pod interface attached to a subnet; it lives in the pod's namespace.
// (It is endpoints.networking.mizar.dev, short name mep; the core endpoints kind is unrelated.)
type Endpoint struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty" protobuf:"bytes,1,opt,name=metadata"`

	// +optional
	Spec EndpointSpec `json:"spec,omitempty" protobuf:"bytes,2,opt,name=spec"`
	// +optional
	Status EndpointStatus `json:"status,omitempty" protobuf:"bytes,3,opt,name=status"`
}

// EndpointSpec is the desired state of an endpoint.
type EndpointSpec struct {
	// subnet is the name of the subnet the endpoint is attached to. Immutable.
	Subnet string `json:"subnet" protobuf:"bytes,1,opt,name=subnet"`
	// pod is the name of the pod (in the endpoint's namespace) that owns the interface.
	// +optional
	Pod string `json:"pod,omitempty" protobuf:"bytes,2,opt,name=pod"`
	// droplet is the name of the droplet hosting the pod.
	Droplet string `json:"droplet" protobuf:"bytes,3,opt,name=droplet"`
	// interface is the interface name inside the pod. Defaults to eth0.
	// +optional
	Interface string `json:"interface,omitempty" protobuf:"bytes,4,opt,name=interface"`
	// mac is the interface's unicast MAC address, e.g. 02:42:0a:00:00:05.
	MAC string `json:"mac" protobuf:"bytes,5,opt,name=mac"`
	// ip is the endpoint's IPv4 address inside the subnet. Leave it empty to have the
	// server allocate a free one. Never the subnet's network, broadcast or gateway
	// address. Immutable once set.
	// +optional
	IP string `json:"ip,omitempty" protobuf:"bytes,6,opt,name=ip"`
}

// EndpointStatus is the observed state of an endpoint.
type EndpointStatus struct {
	ProvisioningStatus `json:",inline" protobuf:"bytes,1,opt,name=provisioningStatus"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// EndpointList is a list of endpoints.
type EndpointList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty" protobuf:"bytes,1,opt,name=metadata"`

	Items []Endpoint `json:"items" protobuf:"bytes,2,rep,name=items"`
}

// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// Droplet is a node that runs mizar's dataplane; it can host endpoints, bouncers
// and dividers. Registered by the node agent at start.
type Droplet struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty" protobuf:"bytes,1,opt,name=metadata"`

	// +optional
	Spec DropletSpec `json:"spec,omitempty" protobuf:"bytes,2,opt,name=spec"`
	// +optional
	Status DropletStatus `json:"status,omitempty" protobuf:"bytes,3,opt,name=status"`
}

// DropletSpec is the desired state of a droplet.
type DropletSpec struct {
	// node is the name of the Kubernetes node this droplet runs on.
	Node string `json:"node" protobuf:"bytes,1,opt,name=node"`
	// ip is the droplet's IPv4 address on the underlay network.
	IP string `json:"ip" protobuf:"bytes,2,opt,name=ip"`
	// mac is the MAC address of the underlay interface.
	MAC string `json:"mac" protobuf:"bytes,3,opt,name=mac"`
	// interface is the name of the underlay interface, e.g. eth0.
	Interface string `json:"interface" protobuf:"bytes,4,opt,name=interface"`
}

// DropletStatus is the observed state of a droplet.
type DropletStatus struct {
	ProvisioningStatus `json:",inline" protobuf:"bytes,1,opt,name=provisioningStatus"`
	// appliedResourceVersion is the resourceVersion up to which the droplet's agent
	// has applied the endpoints it hosts: every endpoint on the droplet whose
	// resourceVersion is not greater is programmed. Written once per batch.
	// +optional
	AppliedResourceVersion string `json:"appliedResourceVersion,omitempty" protobuf:"bytes,2,opt,name=appliedResourceVersion"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// DropletList is a list of droplets.
type DropletList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty" protobuf:"bytes,1,opt,name=metadata"`

	Items []Droplet `json:"items" protobuf:"bytes,2,rep,name=items"`
}
