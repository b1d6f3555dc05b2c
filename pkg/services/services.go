// Package services turns a Kubernetes cluster's Services and
// EndpointSlices into what mizar's fast path translates (the node agent
// programs the result with pkg/dataplane's SetServices): for every IPv4
// ClusterIP and port of a Service, the endpoints behind that port. Pure:
// objects in, frontends out, as pkg/netpol is for NetworkPolicies.
//
// Covered so far: ClusterIP (also the ClusterIP of NodePort and
// LoadBalancer Services), TCP and UDP, named ports (matched by name in the
// EndpointSlices, which already resolved targetPort per pod), ready
// endpoints, or serving terminating ones when a port has no ready one (as
// kube-proxy does), internalTrafficPolicy Local, sessionAffinity ClientIP
// and its timeout. Left out: headless and
// ExternalName Services (nothing to translate), SCTP, IPv6, NodePort,
// externalIPs and load balancer addresses, topology hints.
package services

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Protocol is the IP protocol number of a frontend.
type Protocol uint8

// The protocols translated.
const (
	TCP Protocol = 6
	UDP Protocol = 17
)

// Frontend is what clients dial: a ClusterIP and one port.
type Frontend struct {
	VIP   netip.Addr
	Port  uint16
	Proto Protocol
}

// Service is one frontend and the endpoints behind it, sorted.
type Service struct {
	Frontend
	Backends []netip.AddrPort
	// AffinityTimeout is sessionAffinity ClientIP's timeout, 0 without.
	AffinityTimeout time.Duration
	// Name is namespace/name:port, for logs.
	Name string
}

// Input is what Build reads: the cluster's Services and EndpointSlices
// and the node the result is for.
type Input struct {
	Services       []*corev1.Service
	EndpointSlices []*discoveryv1.EndpointSlice
	// NodeName decides internalTrafficPolicy Local.
	NodeName string
}

// Build returns the frontends of in, sorted by VIP, port and protocol.
// Frontends claimed by two Services (which the API server prevents) keep
// the first in namespace/name order.
func Build(in Input) []Service {
	bySvc := slicesByService(in.EndpointSlices)
	var out []Service
	seen := map[Frontend]bool{}
	svcs := sortedServices(in.Services)
	for _, s := range svcs {
		if s.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		var affinity time.Duration
		if s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
			affinity = time.Duration(corev1.DefaultClientIPServiceAffinitySeconds) * time.Second
			if c := s.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
				affinity = time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second
			}
		}
		local := s.Spec.InternalTrafficPolicy != nil && *s.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
		for _, vip := range clusterIPs(s) {
			for _, p := range s.Spec.Ports {
				proto, ok := protocol(p.Protocol)
				if !ok || p.Port <= 0 || p.Port > 65535 {
					continue
				}
				f := Frontend{VIP: vip, Port: uint16(p.Port), Proto: proto}
				if seen[f] {
					continue
				}
				seen[f] = true
				out = append(out, Service{Frontend: f, AffinityTimeout: affinity,
					Backends: backends(bySvc[s.Namespace+"/"+s.Name], p, local, in.NodeName),
					Name:     fmt.Sprintf("%s/%s:%s", s.Namespace, s.Name, portName(p))})
			}
		}
	}
	sortServices(out)
	return out
}

func portName(p corev1.ServicePort) string {
	if p.Name != "" {
		return p.Name
	}
	return fmt.Sprint(p.Port)
}

func sortedServices(in []*corev1.Service) []*corev1.Service {
	out := slices.Clone(in)
	slices.SortFunc(out, func(a, b *corev1.Service) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return out
}

func sortServices(out []Service) {
	slices.SortFunc(out, func(a, b Service) int {
		if c := a.VIP.Compare(b.VIP); c != 0 {
			return c
		}
		if a.Port != b.Port {
			return int(a.Port) - int(b.Port)
		}
		return int(a.Proto) - int(b.Proto)
	})
}

// clusterIPs are the Service's IPv4 ClusterIPs; none for a headless one.
func clusterIPs(s *corev1.Service) []netip.Addr {
	ips := s.Spec.ClusterIPs
	if len(ips) == 0 && s.Spec.ClusterIP != "" {
		ips = []string{s.Spec.ClusterIP}
	}
	var out []netip.Addr
	for _, ip := range ips {
		a, err := netip.ParseAddr(ip)
		if err != nil || !a.Is4() || a.IsUnspecified() {
			continue // "None" (headless), IPv6
		}
		out = append(out, a)
	}
	return out
}

func protocol(p corev1.Protocol) (Protocol, bool) {
	switch p {
	case corev1.ProtocolTCP, "":
		return TCP, true
	case corev1.ProtocolUDP:
		return UDP, true
	}
	return 0, false
}

func slicesByService(in []*discoveryv1.EndpointSlice) map[string][]*discoveryv1.EndpointSlice {
	out := map[string][]*discoveryv1.EndpointSlice{}
	for _, es := range in {
		svc := es.Labels[discoveryv1.LabelServiceName]
		if svc == "" || es.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		out[es.Namespace+"/"+svc] = append(out[es.Namespace+"/"+svc], es)
	}
	return out
}

// backends are the endpoints serving Service port p: the ready ones, or,
// when none is, the serving terminating ones (so connections drain rather
// than drop while a rollout replaces every pod). Local keeps only this
// node's.
func backends(ess []*discoveryv1.EndpointSlice, p corev1.ServicePort, local bool, node string) []netip.AddrPort {
	var ready, terminating []netip.AddrPort
	for _, es := range ess {
		port, ok := slicePort(es, p)
		if !ok {
			continue
		}
		for _, ep := range es.Endpoints {
			if local && (ep.NodeName == nil || *ep.NodeName != node) {
				continue
			}
			c := ep.Conditions
			isReady := c.Ready == nil || *c.Ready // nil: ready (the API's rule)
			serving := c.Serving == nil && isReady || c.Serving != nil && *c.Serving
			isTerminating := c.Terminating != nil && *c.Terminating
			for _, a := range ep.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil || !ip.Is4() {
					continue
				}
				ap := netip.AddrPortFrom(ip, port)
				switch {
				case isReady && !isTerminating:
					ready = append(ready, ap)
				case serving && isTerminating:
					terminating = append(terminating, ap)
				}
			}
		}
	}
	out := ready
	if len(out) == 0 {
		out = terminating
	}
	slicesSortCompact(&out)
	return out
}

func slicesSortCompact(s *[]netip.AddrPort) {
	slices.SortFunc(*s, func(a, b netip.AddrPort) int { return a.Compare(b) })
	*s = slices.Compact(*s)
}

// slicePort is the port the slice's endpoints serve Service port p on:
// the slice port of the same name and protocol.
func slicePort(es *discoveryv1.EndpointSlice, p corev1.ServicePort) (uint16, bool) {
	proto := p.Protocol
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	for _, sp := range es.Ports {
		name := ""
		if sp.Name != nil {
			name = *sp.Name
		}
		spProto := corev1.ProtocolTCP
		if sp.Protocol != nil {
			spProto = *sp.Protocol
		}
		if name != p.Name || spProto != proto || sp.Port == nil || *sp.Port <= 0 || *sp.Port > 65535 {
			continue
		}
		return uint16(*sp.Port), true
	}
	return 0, false
}
