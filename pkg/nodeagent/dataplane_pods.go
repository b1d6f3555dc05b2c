package nodeagent

import (
	"fmt"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/ns"

	"mizar.dev/pkg/dataplane"
)

// DatapathPods is the PodDataplane over the real eBPF datapath. Attaching
// names interfaces, so it enters the host netns (HostNetns, "" = the
// calling thread's) for those calls.
type DatapathPods struct {
	DP        *dataplane.Datapath
	HostNetns string
}

func (p *DatapathPods) inHost(f func() error) error {
	if p.HostNetns == "" {
		return f()
	}
	return ns.WithNetNSPath(p.HostNetns, func(ns.NetNS) error { return f() })
}

// AttachPod implements PodDataplane.
func (p *DatapathPods) AttachPod(hostIf string, pi dataplane.PodInterface) error {
	if err := p.DP.UpsertPodInterface(pi); err != nil {
		return err
	}
	if err := p.inHost(func() error { return p.DP.AttachPod(hostIf) }); err != nil {
		return fmt.Errorf("attach the pod program to %s: %w", hostIf, err)
	}
	return nil
}

// DetachPod implements PodDataplane.
func (p *DatapathPods) DetachPod(hostIf string, ifindex int) error {
	if err := p.DP.Detach(hostIf); err != nil {
		return fmt.Errorf("detach the pod program from %s: %w", hostIf, err)
	}
	if err := p.DP.DeletePodInterface(ifindex); err != nil {
		return err
	}
	return nil
}

// SetHostAddrs implements PodDataplane.
func (p *DatapathPods) SetHostAddrs(ips []netip.Addr) error { return p.DP.SetHostAddrs(ips) }

// PodAttached implements PodDataplane.
func (p *DatapathPods) PodAttached(hostIf string) (bool, error) {
	links, err := p.DP.Links()
	if err != nil {
		return false, err
	}
	for _, l := range links {
		if l.Ifname == hostIf && l.Program == "pod_tcx" && l.Ifindex != 0 {
			return true, nil
		}
	}
	return false, nil
}
