package networking

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Phase is where an object is in the seed's lifecycle. Init and Provisioned are
// the two persisted states; each transition has exactly one writer (DESIGN.md).
type Phase string

const (
	PhaseInit        Phase = "Init"
	PhaseProvisioned Phase = "Provisioned"
	PhaseTerminating Phase = "Terminating"
	PhaseFailed      Phase = "Failed"
)

// ProvisioningStatus is the part of every status that the lifecycle contract needs.
type ProvisioningStatus struct {
	Phase              Phase
	ObservedGeneration int64
	Conditions         []metav1.Condition
}

// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// Vpc is a virtual private cloud: an isolated address space with its own VNI.
type Vpc struct {
	metav1.TypeMeta
	metav1.ObjectMeta

	Spec   VpcSpec
	Status VpcStatus
}

type VpcSpec struct {
	CIDR     string
	VNI      int32
	Dividers int32
}

type VpcStatus struct {
	ProvisioningStatus
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

type VpcList struct {
	metav1.TypeMeta
	metav1.ListMeta

	Items []Vpc
}

// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// Subnet is a range of a VPC's addresses, served by its own bouncers.
type Subnet struct {
	metav1.TypeMeta
	metav1.ObjectMeta

	Spec   SubnetSpec
	Status SubnetStatus
}

type SubnetSpec struct {
	VPC      string
	CIDR     string
	Bouncers int32
	Gateway  string
}

type SubnetStatus struct {
	ProvisioningStatus
	Departures []EndpointDeparture
}

// MaxSubnetDepartures bounds SubnetStatus.Departures (v1alpha1 says why).
const MaxSubnetDepartures = 32

// EndpointDeparture records that an endpoint left a host (deleted, or moved
// to another droplet); see the v1alpha1 type.
type EndpointDeparture struct {
	Sequence int64
	Endpoint string
	IP       string
	Droplet  string
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

type SubnetList struct {
	metav1.TypeMeta
	metav1.ListMeta

	Items []Subnet
}

// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// Divider routes a VPC's traffic between its subnets; placed on one droplet.
type Divider struct {
	metav1.TypeMeta
	metav1.ObjectMeta

	Spec   DividerSpec
	Status DividerStatus
}

type DividerSpec struct {
	VPC     string
	Droplet string
}

type DividerStatus struct {
	ProvisioningStatus
	// AppliedResourceVersions holds, per subnet of the divider's VPC, the
	// resourceVersion up to which the divider's agent has applied its endpoints.
	AppliedResourceVersions []SubnetWatermark
}

// SubnetWatermark is how far an agent has applied the endpoints of one subnet.
type SubnetWatermark struct {
	Subnet          string
	ResourceVersion string
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

type DividerList struct {
	metav1.TypeMeta
	metav1.ListMeta

	Items []Divider
}

// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// Bouncer holds every endpoint of one subnet and forwards to their hosts.
type Bouncer struct {
	metav1.TypeMeta
	metav1.ObjectMeta

	Spec   BouncerSpec
	Status BouncerStatus
}

type BouncerSpec struct {
	Subnet  string
	Droplet string
}

type BouncerStatus struct {
	ProvisioningStatus
	// AppliedResourceVersion is the resourceVersion up to which the bouncer's agent
	// has applied the endpoints of the bouncer's subnet.
	AppliedResourceVersion string
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

type BouncerList struct {
	metav1.TypeMeta
	metav1.ListMeta

	Items []Bouncer
}

// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// Endpoint is one pod interface attached to a subnet.
type Endpoint struct {
	metav1.TypeMeta
	metav1.ObjectMeta

	Spec   EndpointSpec
	Status EndpointStatus
}

type EndpointSpec struct {
	Subnet    string
	Pod       string
	Droplet   string
	Interface string
	MAC       string
	IP        string
}

type EndpointStatus struct {
	ProvisioningStatus
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

type EndpointList struct {
	metav1.TypeMeta
	metav1.ListMeta

	Items []Endpoint
}

// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// Droplet is a node that can host endpoints, bouncers and dividers.
type Droplet struct {
	metav1.TypeMeta
	metav1.ObjectMeta

	Spec   DropletSpec
	Status DropletStatus
}

type DropletSpec struct {
	Node      string
	IP        string
	MAC       string
	Interface string
}

type DropletStatus struct {
	ProvisioningStatus
	// AppliedResourceVersion is the resourceVersion up to which the droplet's agent
	// has applied the endpoints it hosts.
	AppliedResourceVersion string
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

type DropletList struct {
	metav1.TypeMeta
	metav1.ListMeta

	Items []Droplet
}
