package nodeagent

import (
	"context"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
)

// Dataplane is what the agent asks of its node's packet programs. Declared here,
// by its one consumer, so tests drive the real agent over a Recorder; the eBPF
// implementation (pkg/dataplane) comes with the node agent binary. Every call is
// idempotent: the agent repeats them after a relist.
type Dataplane interface {
	// Attach loads and attaches the droplet's programs; the droplet becomes
	// Provisioned once it returns nil.
	Attach(ctx context.Context) error

	// SetHostEndpoint programs an endpoint hosted on this droplet.
	SetHostEndpoint(ep *v1alpha1.Endpoint) error
	// DeleteHostEndpoint removes a hosted endpoint ("namespace/name").
	DeleteHostEndpoint(key string) error

	// SetBouncer starts serving as one of a subnet's bouncers.
	SetBouncer(b *v1alpha1.Bouncer) error
	// DeleteBouncer stops serving as a bouncer and drops its endpoints.
	DeleteBouncer(name string) error
	// SetBouncerEndpoint teaches a bouncer where an endpoint of its subnet lives.
	SetBouncerEndpoint(bouncer string, ep *v1alpha1.Endpoint) error
	// DeleteBouncerEndpoint forgets an endpoint ("namespace/name") in a bouncer.
	DeleteBouncerEndpoint(bouncer, key string) error

	// SetDivider starts serving as one of a VPC's dividers.
	SetDivider(d *v1alpha1.Divider) error
	// DeleteDivider stops serving as a divider and drops its subnets.
	DeleteDivider(name string) error
	// SetDividerSubnet teaches a divider a subnet of its VPC.
	SetDividerSubnet(divider string, s *v1alpha1.Subnet) error
	// DeleteDividerSubnet forgets a subnet in a divider.
	DeleteDividerSubnet(divider, subnet string) error
	// SetDividerEndpoint teaches a divider where an endpoint of its VPC lives.
	SetDividerEndpoint(divider string, ep *v1alpha1.Endpoint) error
	// DeleteDividerEndpoint forgets an endpoint ("namespace/name") in a divider.
	DeleteDividerEndpoint(divider, key string) error
}
