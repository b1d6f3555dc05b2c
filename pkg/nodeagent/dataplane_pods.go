package nodeagent

import (
	"fmt"
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"

	"mizar.dev/pkg/dataplane"
)

// DatapathPods is the PodDataplane over the real eBPF datapath. Its calls
// name interfaces through the host netns handle they are given; inHost
// enters the host netns (HostNetns, "" = the calling thread's) for the
// datapath calls that have no handle variant.
type DatapathPods struct {
	DP        *dataplane.Datapath
	HostNetns string

	// attached are the host-side veths with the pod program, kept so a
	// scrape counts them without walking the pod_ifaces map.
	mu       sync.Mutex
	attached map[string]bool
}

func (p *DatapathPods) track(hostIf string, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.attached == nil {
		p.attached = map[string]bool{}
	}
	if on {
		p.attached[hostIf] = true
	} else {
		delete(p.attached, hostIf)
	}
}

// Attached is how many pods have the pod program attached.
func (p *DatapathPods) Attached() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.attached)
}

func (p *DatapathPods) inHost(f func() error) error { return inHostNetns(p.HostNetns, f) }

// AttachPod implements PodDataplane.
func (p *DatapathPods) AttachPod(host *netlink.Handle, hostIf string, pi dataplane.PodInterface) error {
	if err := p.DP.UpsertPodInterface(pi); err != nil {
		return err
	}
	return p.AdoptPod(host, hostIf)
}

// AdoptPod implements PodDataplane.
func (p *DatapathPods) AdoptPod(host *netlink.Handle, hostIf string) error {
	if err := p.DP.AttachPodAt(host, hostIf); err != nil {
		return fmt.Errorf("attach the pod program to %s: %w", hostIf, err)
	}
	p.track(hostIf, true)
	return nil
}

// DetachPod implements PodDataplane.
func (p *DatapathPods) DetachPod(host *netlink.Handle, hostIf string, ifindex int) error {
	if err := p.DP.DetachPodAt(host, hostIf); err != nil {
		return fmt.Errorf("detach the pod program from %s: %w", hostIf, err)
	}
	p.track(hostIf, false)
	if err := p.DP.DeletePodInterface(ifindex); err != nil {
		return err
	}
	return nil
}

// PodAttached implements PodDataplane: this datapath's program is on hostIf.
func (p *DatapathPods) PodAttached(host *netlink.Handle, hostIf string) (bool, error) {
	id, ok, err := p.DP.PodProgramOn(host, hostIf)
	if err != nil || !ok {
		return false, err
	}
	info, err := p.DP.PodProgram().Info()
	if err != nil {
		return false, fmt.Errorf("pod program info: %w", err)
	}
	want, _ := info.ID()
	return id == uint32(want), nil
}

// SetHostAddrs implements PodDataplane.
func (p *DatapathPods) SetHostAddrs(ips []netip.Addr) error { return p.DP.SetHostAddrs(ips) }
