package nodeagent

import (
	"context"
	"fmt"
	"net/netip"

	"k8s.io/klog/v2"

	"mizar.dev/pkg/dataplane"
)

// The host path (see pkg/dataplane SetHostPath) makes the host VPC, named by
// --host-vpc, the network of the cluster's pods: Services through kube-proxy,
// egress through the node, the node to any of the VPC's pods. It follows the
// VPC in the API: set once the VPC has its VNI, updated if it is recreated,
// removed when it goes. Without --host-vpc the agent removes whatever an
// earlier run installed.

// hostPathWanted is what the host VPC in the API asks for; the zero value
// means no host path (no such VPC, or no VNI allocated yet).
func (d *Datapath) hostPathWanted() (dataplane.HostPath, error) {
	v, err := d.vpcs.Get(d.hostVPC)
	if err != nil || v.Spec.VNI <= 0 {
		return dataplane.HostPath{}, nil //nolint:nilerr // not there yet: the informer brings it
	}
	cidr, err := netip.ParsePrefix(v.Spec.CIDR)
	if err != nil {
		return dataplane.HostPath{}, fmt.Errorf("host VPC %s: CIDR %q: %w", d.hostVPC, v.Spec.CIDR, err)
	}
	return dataplane.HostPath{VNI: uint32(v.Spec.VNI), CIDR: cidr.Masked(), HostIP: d.hostIP, MTU: d.podMTU}, nil
}

// syncHostPath brings the host path in line with the host VPC; called with
// the topology, on every change of the VPCs.
func (d *Datapath) syncHostPath(ctx context.Context) error {
	if d.hostVPC == "" {
		return nil
	}
	want, err := d.hostPathWanted()
	if err != nil {
		return err
	}
	d.hpMu.Lock()
	defer d.hpMu.Unlock()
	if d.hostPath == want && d.hostPathSet {
		return nil
	}
	if want.VNI == 0 {
		if err := d.pods.inHost(func() error { return d.dp.RemoveHostPath(ctx) }); err != nil {
			return fmt.Errorf("remove the host path: %w", err)
		}
		klog.InfoS("No host path: the host VPC is not there or has no VNI yet", "vpc", d.hostVPC)
	} else {
		if err := d.pods.inHost(func() error { return d.dp.SetHostPath(ctx, want) }); err != nil {
			return fmt.Errorf("host path for VPC %s: %w", d.hostVPC, err)
		}
		klog.InfoS("Host path set", "vpc", d.hostVPC, "vni", want.VNI, "cidr", want.CIDR, "device", dataplane.HostDevice)
	}
	d.hostPath, d.hostPathSet = want, true
	return nil
}

// removeStaleHostPath removes what an earlier run with --host-vpc left,
// when this one runs without.
func (d *Datapath) removeStaleHostPath(ctx context.Context) {
	if d.hostVPC != "" {
		return
	}
	if err := d.pods.inHost(func() error { return d.dp.RemoveHostPath(ctx) }); err != nil {
		klog.ErrorS(err, "Removing the host path of an earlier run")
	}
}
