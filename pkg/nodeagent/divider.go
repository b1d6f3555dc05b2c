package nodeagent

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
)

// divider is a divider served by this agent. It relays for every endpoint of
// its VPC, but endpoints carry no VPC to select them by: so it follows the
// VPC's subnets and runs one endpoint stream per subnet. A stream's position
// says nothing about another subnet's endpoints, so each subnet has its own
// watermark (status.appliedResourceVersions); one watermark for the divider
// would be held at the quietest subnet's last event.
type divider struct {
	a    *Agent
	name string
	vpc  string

	mu          sync.Mutex
	streams     map[string]*sub            // subnet -> its endpoint stream
	applied     map[string]string          // subnet -> watermark
	held        map[string]map[string]bool // subnet -> endpoint keys handed to the dataplane
	listed      bool                       // the VPC's subnets have been listed
	provisioned bool                       // Provisioned was written by this run

	// writeMu orders the status writes: each carries every subnet's
	// watermark, so one made from older values must not land after a newer one.
	writeMu sync.Mutex
}

// startDivider serves a divider placed here.
func (a *Agent) startDivider(d *v1alpha1.Divider) error {
	if err := a.dp.SetDivider(d); err != nil {
		return err
	}
	dv := &divider{a: a, name: d.Name, vpc: d.Spec.VPC, streams: map[string]*sub{}, applied: map[string]string{}, held: map[string]map[string]bool{}}
	a.start("divider/"+d.Name, d.UID, dv.run)
	return nil
}

// run follows the VPC's subnets until ctx ends, then waits for the subnets'
// endpoint streams (they end with ctx).
func (dv *divider) run(ctx context.Context) {
	n := dv.a.client.NetworkingV1alpha1()
	s := &stream[*v1alpha1.Subnet]{
		name:     "subnets of VPC " + dv.vpc + " for divider " + dv.name,
		selector: fields.OneTermEqualSelector("spec.vpc", dv.vpc).String(),
		list:     lister(n.Subnets().List, func(l *v1alpha1.SubnetList) []v1alpha1.Subnet { return l.Items }),
		watch:    n.Subnets().Watch,
		set:      func(s *v1alpha1.Subnet) error { return dv.setSubnet(ctx, s) },
		del:      func(key string) error { return dv.deleteSubnet(ctx, key) },
		synced: func(ctx context.Context, _ string) error {
			dv.mu.Lock()
			dv.listed = true
			dv.mu.Unlock()
			return dv.publish(ctx)
		},
		events: &dv.a.otherEvents,
		// A subnet's endpoints are drained after it is marked for deletion,
		// and their removals are awaited from the divider as well.
		keepDeleting: true,
	}
	s.run(ctx)
	dv.mu.Lock()
	subs := dv.streams
	dv.streams = map[string]*sub{}
	dv.mu.Unlock()
	for _, sb := range subs {
		sb.cancel()
		<-sb.done
	}
}

// setSubnet programs a subnet of the VPC and starts following its endpoints
// (again, for a subnet re-created under the same name).
func (dv *divider) setSubnet(ctx context.Context, s *v1alpha1.Subnet) error {
	if err := dv.a.dp.SetDividerSubnet(dv.name, s); err != nil {
		return err
	}
	dv.mu.Lock()
	old := dv.streams[s.Name]
	dv.mu.Unlock()
	if old != nil {
		if old.uid == s.UID {
			return nil
		}
		if err := dv.stopSubnet(s.Name); err != nil {
			return err
		}
	}
	sctx, cancel := context.WithCancel(ctx)
	sb := &sub{uid: s.UID, cancel: cancel, done: make(chan struct{})}
	es := dv.endpointStream(s.Name)
	dv.mu.Lock()
	dv.streams[s.Name] = sb
	dv.mu.Unlock()
	go func() { defer close(sb.done); es.run(sctx) }()
	return nil
}

// deleteSubnet stops following a subnet that left the VPC, forgets the
// endpoints its stream had not seen go, and withdraws its watermark.
func (dv *divider) deleteSubnet(ctx context.Context, subnet string) error {
	if err := dv.stopSubnet(subnet); err != nil {
		return err
	}
	if err := dv.a.dp.DeleteDividerSubnet(dv.name, subnet); err != nil {
		return err
	}
	return dv.publish(ctx)
}

// stopSubnet ends a subnet's endpoint stream, forgets its watermark and
// removes the endpoints the stream had not seen go.
func (dv *divider) stopSubnet(subnet string) error {
	dv.mu.Lock()
	sb := dv.streams[subnet]
	delete(dv.streams, subnet)
	dv.mu.Unlock()
	if sb != nil {
		sb.cancel()
		<-sb.done // its last acknowledgement is made or abandoned
	}
	dv.mu.Lock()
	delete(dv.applied, subnet)
	var keys []string
	for k := range dv.held[subnet] {
		keys = append(keys, k)
	}
	dv.mu.Unlock()
	for _, key := range keys {
		if err := dv.a.dp.DeleteDividerEndpoint(dv.name, key); err != nil {
			return fmt.Errorf("divider %s: removing %s of subnet %s: %w", dv.name, key, subnet, err)
		}
		dv.hold(subnet, key, false)
	}
	return nil
}

func (dv *divider) endpointStream(subnet string) *stream[*v1alpha1.Endpoint] {
	n := dv.a.client.NetworkingV1alpha1()
	return &stream[*v1alpha1.Endpoint]{
		name:     "endpoints of subnet " + subnet + " for divider " + dv.name,
		selector: fields.OneTermEqualSelector("spec.subnet", subnet).String(),
		list:     lister(n.Endpoints(metav1.NamespaceAll).List, endpointItems),
		watch:    n.Endpoints(metav1.NamespaceAll).Watch,
		set: func(ep *v1alpha1.Endpoint) error {
			dv.hold(subnet, ep.Namespace+"/"+ep.Name, true)
			return dv.a.dp.SetDividerEndpoint(dv.name, ep)
		},
		del: func(key string) error {
			if err := dv.a.dp.DeleteDividerEndpoint(dv.name, key); err != nil {
				return err
			}
			dv.hold(subnet, key, false)
			return nil
		},
		synced: func(ctx context.Context, rv string) error {
			dv.mu.Lock()
			dv.applied[subnet] = rv
			dv.mu.Unlock()
			return dv.publish(ctx)
		},
		awaited:     (*v1alpha1.Endpoint).AwaitsAcknowledgement,
		ackInterval: dv.a.ack,
		events:      &dv.a.endpointEvents,
	}
}

// hold records whether the dataplane may hold endpoint key of subnet.
func (dv *divider) hold(subnet, key string, held bool) {
	dv.mu.Lock()
	defer dv.mu.Unlock()
	if !held {
		delete(dv.held[subnet], key)
		return
	}
	if dv.held[subnet] == nil {
		dv.held[subnet] = map[string]bool{}
	}
	dv.held[subnet][key] = true
}

// publish writes every subnet's watermark, and Provisioned once the subnets
// are listed and each one's endpoints are: only then does the divider hold
// every endpoint of its VPC.
func (dv *divider) publish(ctx context.Context) error {
	dv.writeMu.Lock()
	defer dv.writeMu.Unlock()
	dv.mu.Lock()
	marks := make([]v1alpha1.SubnetWatermark, 0, len(dv.applied))
	for s, rv := range dv.applied {
		marks = append(marks, v1alpha1.SubnetWatermark{Subnet: s, ResourceVersion: rv})
	}
	ready := dv.listed && !dv.provisioned
	for s := range dv.streams {
		if _, ok := dv.applied[s]; !ok {
			ready = false
		}
	}
	dv.mu.Unlock()
	slices.SortFunc(marks, func(a, b v1alpha1.SubnetWatermark) int { return cmp.Compare(a.Subnet, b.Subnet) })
	st := map[string]any{"appliedResourceVersions": marks}
	if ready {
		st["phase"] = v1alpha1.PhaseProvisioned
	}
	if err := dv.a.patchStatus(ctx, "divider", dv.name, dv.a.name, st); err != nil {
		return err
	}
	if ready {
		dv.mu.Lock()
		dv.provisioned = true
		dv.mu.Unlock()
	}
	return nil
}
