package services

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func svc(ns, name string, ips []string, ports ...corev1.ServicePort) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIPs: ips, Ports: ports}}
	if len(ips) > 0 {
		s.Spec.ClusterIP = ips[0]
	}
	return s
}

func port(name string, proto corev1.Protocol, p int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: proto, Port: p}
}

type ep struct {
	ip                          string
	node                        string
	ready, serving, terminating *bool
}

func slice(ns, svcName, name string, ports map[string]int32, eps ...ep) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
		Labels: map[string]string{discoveryv1.LabelServiceName: svcName}}, AddressType: discoveryv1.AddressTypeIPv4}
	for n, p := range ports {
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: ptr.To(n), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(p)})
	}
	for _, e := range eps {
		x := discoveryv1.Endpoint{Addresses: []string{e.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: e.ready, Serving: e.serving, Terminating: e.terminating}}
		if e.node != "" {
			x.NodeName = ptr.To(e.node)
		}
		es.Endpoints = append(es.Endpoints, x)
	}
	return es
}

func aps(ss ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, s := range ss {
		out = append(out, netip.MustParseAddrPort(s))
	}
	return out
}

func find(t *testing.T, out []Service, f string) Service {
	t.Helper()
	for _, s := range out {
		if fmt.Sprintf("%s/%d", netip.AddrPortFrom(s.VIP, s.Port), s.Proto) == f {
			return s
		}
	}
	t.Fatalf("no frontend %s in %+v", f, out)
	return Service{}
}

func TestNamedPortsAndReadiness(t *testing.T) {
	web := svc("default", "web", []string{"10.96.0.10"}, port("http", corev1.ProtocolTCP, 80), port("metrics", corev1.ProtocolTCP, 9090))
	out := Build(Input{Services: []*corev1.Service{web}, EndpointSlices: []*discoveryv1.EndpointSlice{
		// Two slices of one Service; the named ports map to different
		// target ports per slice (two pod templates).
		slice("default", "web", "web-a", map[string]int32{"http": 8080, "metrics": 9100},
			ep{ip: "10.1.1.1"}, ep{ip: "10.1.1.2", ready: ptr.To(false)}),
		slice("default", "web", "web-b", map[string]int32{"http": 8081},
			ep{ip: "10.1.1.3", ready: ptr.To(true)}),
		// Another namespace's slice of the same name is not this Service's.
		slice("other", "web", "web-x", map[string]int32{"http": 8080}, ep{ip: "10.9.9.9"}),
	}})
	if len(out) != 2 {
		t.Fatalf("%d frontends, want 2: %+v", len(out), out)
	}
	if got := find(t, out, "10.96.0.10:80/6").Backends; !slices.Equal(got, aps("10.1.1.1:8080", "10.1.1.3:8081")) {
		t.Errorf("http backends %v", got)
	}
	if got := find(t, out, "10.96.0.10:9090/6").Backends; !slices.Equal(got, aps("10.1.1.1:9100")) {
		t.Errorf("metrics backends %v", got)
	}
}

// Terminating endpoints serve only when no endpoint is ready (kube-proxy's
// rule), and never when they stopped serving.
func TestTerminatingFallback(t *testing.T) {
	s := svc("ns", "s", []string{"10.96.0.20"}, port("", corev1.ProtocolTCP, 80))
	term := func(ip string, serving bool) ep {
		return ep{ip: ip, ready: ptr.To(false), serving: ptr.To(serving), terminating: ptr.To(true)}
	}
	mk := func(eps ...ep) []netip.AddrPort {
		out := Build(Input{Services: []*corev1.Service{s},
			EndpointSlices: []*discoveryv1.EndpointSlice{slice("ns", "s", "s-1", map[string]int32{"": 8080}, eps...)}})
		return out[0].Backends
	}
	if got := mk(ep{ip: "10.1.1.1"}, term("10.1.1.2", true)); !slices.Equal(got, aps("10.1.1.1:8080")) {
		t.Errorf("with a ready endpoint: %v", got)
	}
	if got := mk(term("10.1.1.2", true), term("10.1.1.3", false)); !slices.Equal(got, aps("10.1.1.2:8080")) {
		t.Errorf("only terminating: %v", got)
	}
	if got := mk(term("10.1.1.3", false)); len(got) != 0 {
		t.Errorf("none serving: %v", got)
	}
}

func TestWhatIsLeftOut(t *testing.T) {
	headless := svc("ns", "headless", []string{"None"}, port("", corev1.ProtocolTCP, 80))
	ext := svc("ns", "ext", nil, port("", corev1.ProtocolTCP, 80))
	ext.Spec.Type = corev1.ServiceTypeExternalName
	ext.Spec.ExternalName = "example.org"
	dual := svc("ns", "dual", []string{"fd00::10", "10.96.0.30"}, port("dns", corev1.ProtocolUDP, 53), port("sctp", corev1.ProtocolSCTP, 9))
	affinity := svc("ns", "sticky", []string{"10.96.0.31"}, port("", corev1.ProtocolTCP, 80))
	affinity.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	affinity.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
	out := Build(Input{Services: []*corev1.Service{headless, ext, dual, affinity}})
	if len(out) != 2 {
		t.Fatalf("frontends %+v, want dual's IPv4 UDP port and sticky's", out)
	}
	if s := find(t, out, "10.96.0.30:53/17"); len(s.Backends) != 0 {
		t.Errorf("dual: %+v", s)
	}
	if s := find(t, out, "10.96.0.31:80/6"); s.AffinityTimeout != time.Minute {
		t.Errorf("sticky's affinity %v, want 1m", s.AffinityTimeout)
	}
}

func TestInternalTrafficPolicyLocal(t *testing.T) {
	s := svc("ns", "s", []string{"10.96.0.40"}, port("", corev1.ProtocolTCP, 80))
	s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
	es := slice("ns", "s", "s-1", map[string]int32{"": 8080}, ep{ip: "10.1.1.1", node: "n1"}, ep{ip: "10.1.2.1", node: "n2"}, ep{ip: "10.1.3.1"})
	out := Build(Input{Services: []*corev1.Service{s}, EndpointSlices: []*discoveryv1.EndpointSlice{es}, NodeName: "n2"})
	if got := out[0].Backends; !slices.Equal(got, aps("10.1.2.1:8080")) {
		t.Fatalf("Local on n2: %v", got)
	}
}
