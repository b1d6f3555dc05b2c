package nodeagent

import (
	"net/netip"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
)

// learnedForgetter is what departures needs of the datapath.
type learnedForgetter interface {
	ForgetLearned(vni uint32, ip netip.Addr) error
	ForgetLearnedIn(vni uint32, prefix netip.Prefix) error
}

// departures makes this host forget what it learned about endpoints that
// left their hosts, within one watch event of their subnet: the Endpoint
// operator lists each departure in the subnet's status.departures
// (pkg/operators/endpoint, departure.go). Without it a host that only
// learned an endpoint's location (it holds no API entry for it) kept sending
// to, and accepting the address from, the former host for the learned
// lifetime.
type departures struct {
	dp  learnedForgetter
	vni func(vpc string) (uint32, bool)

	mu   sync.Mutex
	seen map[types.UID]int64 // subnet -> newest departure applied
}

func newDepartures(dp learnedForgetter, vni func(string) (uint32, bool)) *departures {
	return &departures{dp: dp, vni: vni, seen: map[types.UID]int64{}}
}

// handler follows the subnet informer. A subnet first seen is taken as it
// is: the agent forgets everything learned when it starts (Attach), since
// it cannot tell what left while it was away.
func (p *departures) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.apply(obj.(*v1alpha1.Subnet), true) },
		UpdateFunc: func(_, obj any) { p.apply(obj.(*v1alpha1.Subnet), false) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if s, ok := obj.(*v1alpha1.Subnet); ok {
				p.gone(s)
			}
		},
	}
}

func newest(deps []v1alpha1.EndpointDeparture) int64 {
	if len(deps) == 0 {
		return 0
	}
	return deps[len(deps)-1].Sequence
}

func (p *departures) apply(s *v1alpha1.Subnet, first bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	deps := s.Status.Departures
	last, known := p.seen[s.UID]
	p.seen[s.UID] = newest(deps)
	if first || !known || newest(deps) <= last {
		return
	}
	vni, ok := p.vni(s.Spec.VPC)
	if !ok {
		return // no VNI: nothing was learned under it
	}
	if deps[0].Sequence > last+1 {
		// Missed some: forget the whole subnet rather than guess.
		p.forgetSubnet(s, vni, "departures missed")
		return
	}
	for _, d := range deps {
		if d.Sequence <= last {
			continue
		}
		ip, err := netip.ParseAddr(d.IP)
		if err != nil {
			continue // validated by the API server; nothing to forget
		}
		if err := p.dp.ForgetLearned(vni, ip); err != nil {
			klog.ErrorS(err, "Forgetting a departed endpoint's learned path", "subnet", s.Name, "endpoint", d.Endpoint, "ip", d.IP)
			continue
		}
		klog.V(3).InfoS("Forgot a departed endpoint's learned path", "subnet", s.Name, "endpoint", d.Endpoint, "ip", d.IP, "droplet", d.Droplet)
	}
}

func (p *departures) gone(s *v1alpha1.Subnet) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.seen, s.UID)
	if vni, ok := p.vni(s.Spec.VPC); ok {
		p.forgetSubnet(s, vni, "subnet deleted")
	}
}

func (p *departures) forgetSubnet(s *v1alpha1.Subnet, vni uint32, why string) {
	prefix, err := netip.ParsePrefix(s.Spec.CIDR)
	if err != nil {
		return
	}
	if err := p.dp.ForgetLearnedIn(vni, prefix); err != nil {
		klog.ErrorS(err, "Forgetting the learned paths into a subnet", "subnet", s.Name, "reason", why)
		return
	}
	klog.V(2).InfoS("Forgot the learned paths into a subnet", "subnet", s.Name, "reason", why)
}
