package nodeagent

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// Host <-> pod traffic (kubelet probes) does not go through the overlay: the
// pod program hands what a pod sends to the node's own addresses to the host
// stack (see dataplane.SetHostAddrs), and the host reaches a pod through a
// /32 route over the pod's host-side veth, with the node's underlay address
// as the preferred source and a permanent neighbour entry (no ARP toward a
// pod). Overlapping VPCs could give two pods of this node the same IP, and
// the host stack, which has one routing table, would send the node's replies
// and probes for both to one of them: the second such ADD is refused
// (errAddressOnNode), naming the pod that holds the address.

// hostAddrs lists the IPv4 addresses of the host netns, loopback aside.
func hostAddrs(h *netlink.Handle) ([]netip.Addr, error) {
	addrs, err := h.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("list the host's addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if ok && !ip.IsLoopback() {
			out = append(out, ip)
		}
	}
	return out, nil
}

// followHostAddrs keeps the pod dataplane's host addresses in step with the
// host netns (a node renumbered or given a second address keeps answering
// its pods' probes) until the server closes. It subscribes to the changes
// before it reads the addresses, so none is missed, and returns once both are
// done.
func (s *CNIServer) followHostAddrs() error {
	updates, err := s.subscribeHostAddrs()
	if err != nil {
		return err
	}
	go func() {
		for {
			select {
			case <-s.stop:
				return
			case u, ok := <-updates:
				if ok {
					if u.LinkAddress.IP.To4() != nil {
						if err := s.syncHostAddrs(); err != nil {
							klog.ErrorS(err, "Updating the node's addresses for host<->pod traffic")
						}
					}
					continue
				}
			}
			// The subscription ended with an error (logged): without
			// updates the map would go stale silently, so resubscribe.
			for {
				select {
				case <-s.stop:
					return
				case <-time.After(time.Second):
				}
				if updates, err = s.subscribeHostAddrs(); updates != nil {
					if err != nil {
						klog.ErrorS(err, "Updating the node's addresses for host<->pod traffic")
					}
					break
				}
				klog.ErrorS(err, "Resubscribing to the node's address changes")
			}
		}
	}()
	return nil
}

// subscribeHostAddrs opens a subscription to the host netns's address
// changes (ended by the server's stop), then reads the addresses once for the
// changes made before it opened. updates is nil if the subscription failed;
// err may also be the read's.
func (s *CNIServer) subscribeHostAddrs() (updates chan netlink.AddrUpdate, err error) {
	var nsh *netns.NsHandle
	if s.o.HostNetns != "" {
		ns, err := netns.GetFromPath(s.o.HostNetns)
		if err != nil {
			return nil, fmt.Errorf("open netns %s: %w", s.o.HostNetns, err)
		}
		defer ns.Close() // the subscription keeps its own socket in it
		nsh = &ns
	}
	updates = make(chan netlink.AddrUpdate, 16)
	err = netlink.AddrSubscribeWithOptions(updates, s.stop, netlink.AddrSubscribeOptions{
		Namespace:     nsh,
		ErrorCallback: func(err error) { klog.ErrorS(err, "Watching the node's addresses") },
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe to the host's address changes: %w", err)
	}
	return updates, s.syncHostAddrs()
}

// syncHostAddrs tells the pod dataplane the host's current addresses.
func (s *CNIServer) syncHostAddrs() error {
	h, err := handleAt(s.o.HostNetns)
	if err != nil {
		return fmt.Errorf("host netns: %w", err)
	}
	defer h.Close()
	addrs, err := hostAddrs(h)
	if err != nil {
		return err
	}
	if err := s.o.Pods.SetHostAddrs(addrs); err != nil {
		return fmt.Errorf("the node's addresses: %w", err)
	}
	return nil
}

// errAddressOnNode is addHostRoute's refusal: another attachment of this
// node holds the IP.
type errAddressOnNode struct {
	ip    netip.Addr
	other *attachment
}

func (e *errAddressOnNode) Error() string {
	return fmt.Sprintf("%s is already the address of endpoint %s/%s (container %s, interface %s) on this node",
		e.ip, e.other.Namespace, e.other.Endpoint, e.other.ContainerID, e.other.IfName)
}

// addHostRoute points the host's route to ip at hostIfindex (attachment id).
// If another attachment of this node holds ip it refuses (errAddressOnNode)
// and changes nothing; a route left by no attachment is replaced. Callers
// hold the IP's lock (withIP).
func (s *CNIServer) addHostRoute(h *netlink.Handle, id string, hostIfindex int, ip netip.Addr, podMAC net.HardwareAddr) error {
	if other := s.holderOf(id, ip); other != nil {
		return &errAddressOnNode{ip: ip, other: other}
	}
	if err := h.NeighSet(&netlink.Neigh{LinkIndex: hostIfindex, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
		IP: ip.AsSlice(), HardwareAddr: podMAC}); err != nil {
		return fmt.Errorf("neighbour entry for %s: %w", ip, err)
	}
	// Replace: a route no attachment holds is a leftover (say, of a crash
	// between a veth's deletion and its state's).
	if err := h.RouteReplace(s.hostRoute(hostIfindex, ip)); err != nil {
		return fmt.Errorf("route to %s: %w", ip, err)
	}
	return nil
}

// holderOf is the attachment other than id that holds ip, if any.
func (s *CNIServer) holderOf(id string, ip netip.Addr) *attachment {
	entries, err := os.ReadDir(s.o.StateDir)
	if err != nil {
		return nil
	}
	for _, e := range entries {
		other, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || other == id {
			continue
		}
		if st, err := s.readState(other); err == nil && st.IP == ip.String() {
			return st
		}
	}
	return nil
}

func (s *CNIServer) hostRoute(ifindex int, ip netip.Addr) *netlink.Route {
	return &netlink.Route{LinkIndex: ifindex, Dst: ipnet(netip.PrefixFrom(ip, 32)), Src: s.o.HostIP.AsSlice(),
		Scope: netlink.SCOPE_LINK, Protocol: routeProtocol}
}

// routeProtocol marks mizar's host routes (rtnetlink's "static" range).
const routeProtocol = netlink.RouteProtocol(0x6d) // 'm'

// handOverHostRoute runs once the attachment gone (id) no longer needs the
// route to ip: if no route is left (its veth took it along), another
// attachment of this node with the same IP gets it.
func (s *CNIServer) handOverHostRoute(h *netlink.Handle, id string, ip netip.Addr) error {
	routes, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: ipnet(netip.PrefixFrom(ip, 32)), Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Errorf("list routes to %s: %w", ip, err)
	}
	if len(routes) > 0 {
		return nil
	}
	entries, err := os.ReadDir(s.o.StateDir)
	if err != nil {
		return fmt.Errorf("read the attachment state: %w", err)
	}
	for _, e := range entries {
		other, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || other == id {
			continue
		}
		st, err := s.readState(other)
		if err != nil || st.IP != ip.String() {
			continue
		}
		mac, err := net.ParseMAC(st.PodMAC)
		if err != nil {
			continue
		}
		l, err := h.LinkByName(st.HostIf)
		if err != nil {
			continue // being torn down too
		}
		return s.addHostRoute(h, other, l.Attrs().Index, ip, mac)
	}
	return nil
}
