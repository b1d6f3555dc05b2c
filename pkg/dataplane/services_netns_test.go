package dataplane

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"mizar.dev/pkg/dataplane/maglev"
	"mizar.dev/pkg/netpol"
)

// One host, a client pod and three backend pods, Services translated by
// the pod program (no kube-proxy, no iptables: the host netns has no rule).
//
//	c  10.1.1.10   b1 10.1.1.21   b2 10.1.1.22   b3 10.1.1.23   (VPC 100, host A)
func buildServiceNet(t *testing.T) *testNet {
	tn := newTestNet(t, []string{"A"}, []podSpec{
		{"c", "A", vpc1, "10.1.1.10/24"},
		{"b1", "A", vpc1, "10.1.1.21/24"},
		{"b2", "A", vpc1, "10.1.1.22/24"},
		{"b3", "A", vpc1, "10.1.1.23/24"},
	})
	tn.services = true
	tn.loadMizar(t, tn.hosts["A"])
	return tn
}

const nameEchoPort = 7001

// serveNameEcho runs, inside pod p, a TCP service that names p on
// connect, then echoes every line.
func serveNameEcho(t *testing.T, p *testPod) {
	l := p.ns.listen(t, fmt.Sprintf("%s:%d", p.ip, nameEchoPort))
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fmt.Fprintf(c, "%s\n", p.name)
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
}

// svcConn is a client's connection to a Service and the backend that
// named itself on it.
type svcConn struct {
	c       net.Conn
	r       *bufio.Reader
	backend string
}

func dialService(t *testing.T, p *testPod, dst netip.AddrPort) *svcConn {
	t.Helper()
	c, err := p.ns.dial(shortCtx(t), dst.String())
	if err != nil {
		t.Fatalf("%s -> %s: %v", p.name, dst, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if got := c.RemoteAddr().(*net.TCPAddr).AddrPort(); netip.AddrPortFrom(got.Addr().Unmap(), got.Port()) != dst {
		t.Fatalf("connected to %s, want %s", got, dst)
	}
	sc := &svcConn{c: c, r: bufio.NewReader(c)}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	name, err := sc.r.ReadString('\n')
	if err != nil {
		t.Fatalf("%s -> %s: read the backend's name: %v", p.name, dst, err)
	}
	sc.backend = strings.TrimSpace(name)
	return sc
}

// echo sends a line on the connection and returns the error if it does
// not come back.
func (sc *svcConn) echo(msg string) error {
	_ = sc.c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := sc.c.Write([]byte(msg + "\n")); err != nil {
		return err
	}
	line, err := sc.r.ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != msg {
		return fmt.Errorf("echo %q, want %q", strings.TrimSpace(line), msg)
	}
	return nil
}

// slot is the Maglev slot the pod program hashes the connection to.
func (sc *svcConn) slot(vip netip.Addr, port uint16) int {
	local := sc.c.LocalAddr().(*net.TCPAddr).AddrPort()
	ports := uint32(local.Port())<<16 | uint32(port)
	return int(flowHash(local.Addr().Unmap(), vip, ports, 6) % uint32(MaglevTableSize))
}

// owners is the backend pod name owning each slot of the table the
// datapath builds for backends.
func owners(t *testing.T, backends map[string]netip.AddrPort) []string {
	t.Helper()
	var names, pods []string
	for pod, b := range backends {
		names = append(names, b.String())
		pods = append(pods, pod)
	}
	table, err := maglev.Table(names, MaglevTableSize)
	must(t, err)
	out := make([]string, len(table))
	for s, i := range table {
		out[s] = pods[i]
	}
	return out
}

func TestServicesNetns(t *testing.T) {
	tn := buildServiceNet(t)
	A := tn.hosts["A"]
	c := tn.pods["c"]
	bs := map[string]*testPod{"b1": tn.pods["b1"], "b2": tn.pods["b2"], "b3": tn.pods["b3"]}
	for _, b := range bs {
		serveNameEcho(t, b)
		serveIdentity(t, b)
		echoUDP(t, b.ns, b.name, netip.AddrPortFrom(b.ip, 5353))
	}
	vip := addr("10.96.0.10")
	web := netip.AddrPortFrom(vip, 80)
	backendsOf := func(port uint16, pods ...string) ([]netip.AddrPort, map[string]netip.AddrPort) {
		var list []netip.AddrPort
		byPod := map[string]netip.AddrPort{}
		for _, p := range pods {
			a := netip.AddrPortFrom(bs[p].ip, port)
			list = append(list, a)
			byPod[p] = a
		}
		return list, byPod
	}
	webSvc := func(pods ...string) Service {
		list, _ := backendsOf(nameEchoPort, pods...)
		return Service{Frontend: Frontend{VIP: vip, Port: 80, Proto: TCP}, Backends: list}
	}
	must(t, A.dp.UpsertService(webSvc("b1", "b2")))
	bulk, _ := backendsOf(identityPort, "b1", "b2")
	// The identity service's own port, so exchange dials it on the VIP.
	must(t, A.dp.UpsertService(Service{Frontend: Frontend{VIP: vip, Port: identityPort, Proto: TCP}, Backends: bulk}))
	dns, _ := backendsOf(5353, "b1", "b2")
	must(t, A.dp.UpsertService(Service{Frontend: Frontend{VIP: vip, Port: 53, Proto: UDP}, Backends: dns}))
	must(t, A.dp.UpsertService(Service{Frontend: Frontend{VIP: addr("10.96.0.11"), Port: 80, Proto: TCP}}))

	t.Run("connections spread over the backends, replies from the VIP", func(t *testing.T) {
		before := counters(t, A)
		seen := map[string]int{}
		for i := range 16 {
			sc := dialService(t, c, web)
			seen[sc.backend]++
			if err := sc.echo(fmt.Sprint("hello ", i)); err != nil {
				t.Fatalf("echo through %s (backend %s): %v", web, sc.backend, err)
			}
			_ = sc.c.Close()
		}
		if len(seen) != 2 || seen["b1"] == 0 || seen["b2"] == 0 {
			t.Fatalf("16 connections reached %v, want both b1 and b2", seen)
		}
		after := counters(t, A)
		if after.Pod["svc_nat"] <= before.Pod["svc_nat"] || after.Pod["svc_rev_nat"] <= before.Pod["svc_rev_nat"] {
			t.Fatalf("translation counters did not move: %v -> %v", before.Pod, after.Pod)
		}
	})

	t.Run("bulk transfer through the VIP", func(t *testing.T) {
		// Large segments (TSO/GSO on the veths): the checksum fixups must
		// hold for partial checksums too.
		data := make([]byte, 4<<20)
		for i := range data {
			data[i] = byte(i * 7)
		}
		name, sum := exchange(t, c, vip, data)
		want := sha256.Sum256(data)
		if (name != "b1" && name != "b2") || sum != hex.EncodeToString(want[:]) {
			t.Fatalf("answer %q %s, want b1 or b2 and %x", name, sum, want)
		}
	})

	t.Run("UDP through the VIP", func(t *testing.T) {
		// A connected socket: only a reply from the VIP itself is taken.
		got := udpAsk(t, c.ns, netip.AddrPortFrom(vip, 53), "ping")
		if got != "b1 ping" && got != "b2 ping" {
			t.Fatalf("UDP answer %q", got)
		}
	})

	t.Run("connections keep their backend when one is added", func(t *testing.T) {
		_, two := backendsOf(nameEchoPort, "b1", "b2")
		_, three := backendsOf(nameEchoPort, "b1", "b2", "b3")
		old, next := owners(t, two), owners(t, three)
		// Connections until at least one hashes to a slot that b3 takes.
		var conns []*svcConn
		moved := 0
		for i := 0; i < 200 && (len(conns) < 8 || moved == 0); i++ {
			sc := dialService(t, c, web)
			s := sc.slot(vip, 80)
			if sc.backend != old[s] {
				t.Fatalf("connection hashed to slot %d reached %s, the table says %s", s, sc.backend, old[s])
			}
			if next[s] != old[s] {
				moved++
			}
			conns = append(conns, sc)
		}
		if moved == 0 {
			t.Fatal("no connection hashed to a slot b3 would take")
		}
		must(t, A.dp.UpsertService(webSvc("b1", "b2", "b3")))
		for i, sc := range conns {
			if err := sc.echo(fmt.Sprint("still there ", i)); err != nil {
				t.Fatalf("connection %d to %s broke when b3 was added: %v", i, sc.backend, err)
			}
		}
		t.Logf("%d long-lived connections kept their backends, %d of them hashed to a slot b3 now owns", len(conns), moved)
		got := map[string]bool{}
		for i := 0; i < 60 && !got["b3"]; i++ {
			sc := dialService(t, c, web)
			got[sc.backend] = true
			_ = sc.c.Close()
		}
		if !got["b3"] {
			t.Fatalf("no new connection reached b3: %v", got)
		}
	})

	t.Run("removing a backend breaks only its connections", func(t *testing.T) {
		byBackend := map[string][]*svcConn{}
		for i := 0; i < 200 && (len(byBackend["b1"]) < 2 || len(byBackend["b2"]) < 2 || len(byBackend["b3"]) < 2); i++ {
			sc := dialService(t, c, web)
			byBackend[sc.backend] = append(byBackend[sc.backend], sc)
		}
		must(t, A.dp.UpsertService(webSvc("b2", "b3")))
		for _, b := range []string{"b2", "b3"} {
			for i, sc := range byBackend[b] {
				if err := sc.echo(fmt.Sprint("after b1 left ", i)); err != nil {
					t.Fatalf("connection %d to %s broke when b1 was removed: %v", i, b, err)
				}
			}
		}
		for i, sc := range byBackend["b1"] {
			// Re-balanced to b2 or b3, which know no such connection
			// and reset it.
			if err := sc.echo(fmt.Sprint("to b1 ", i)); err == nil {
				t.Fatalf("connection %d to the removed b1 still echoes", i)
			}
		}
		t.Logf("connections: b1 %d (broken), b2 %d, b3 %d (intact)",
			len(byBackend["b1"]), len(byBackend["b2"]), len(byBackend["b3"]))
		got, err := A.dp.Services()
		must(t, err)
		for _, s := range got {
			if s.Port == 80 && s.VIP == vip {
				want, _ := backendsOf(nameEchoPort, "b2", "b3")
				if !slices.Equal(s.Backends, want) {
					t.Fatalf("programmed backends %v, want %v", s.Backends, want)
				}
			}
		}
	})

	t.Run("ClientIP affinity holds for its timeout", func(t *testing.T) {
		list, three := backendsOf(nameEchoPort, "b1", "b2", "b3")
		sticky := Service{Frontend: Frontend{VIP: vip, Port: 82, Proto: TCP}, Backends: list, AffinityTimeout: 2 * time.Second}
		must(t, A.dp.UpsertService(sticky))
		table := owners(t, three)
		dst := netip.AddrPortFrom(vip, 82)
		first := dialService(t, c, dst)
		_ = first.c.Close()
		// Within the timeout every new connection goes to the first's
		// backend, also those whose Maglev slot names another.
		otherSlot := 0
		for range 12 {
			sc := dialService(t, c, dst)
			if sc.backend != first.backend {
				t.Fatalf("a connection within the affinity timeout reached %s, the client's backend is %s", sc.backend, first.backend)
			}
			if table[sc.slot(vip, 82)] != first.backend {
				otherSlot++
			}
			_ = sc.c.Close()
		}
		if otherSlot == 0 {
			t.Fatal("every connection hashed to its affinity backend's slot: the test proves nothing")
		}
		// Past the timeout the Maglev slot decides again: wait until a
		// connection's slot names another backend than the last one.
		last := first.backend
		for try := 0; ; try++ {
			time.Sleep(2100 * time.Millisecond)
			sc := dialService(t, c, dst)
			_ = sc.c.Close()
			owner := table[sc.slot(vip, 82)]
			if sc.backend != owner {
				t.Fatalf("after the timeout a connection reached %s, its slot names %s", sc.backend, owner)
			}
			if owner != last {
				break
			}
			if try == 4 {
				t.Fatalf("5 connections after the timeout all hashed to %s", last)
			}
			last = sc.backend
		}
	})

	t.Run("a Service without backends drops, counted", func(t *testing.T) {
		before := counters(t, A)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if conn, err := c.ns.dial(ctx, "10.96.0.11:80"); err == nil {
			_ = conn.Close()
			t.Fatal("connected to a Service without backends")
		}
		after := counters(t, A)
		if after.Pod["drop_no_backend"] <= before.Pod["drop_no_backend"] {
			t.Fatalf("drop_no_backend did not move: %d -> %d", before.Pod["drop_no_backend"], after.Pod["drop_no_backend"])
		}
	})
}

// Two hosts: the backend's replies cross the underlay and are translated
// back where the connection was translated, at the client's host, by the
// underlay program as it delivers them.
//
//	c  10.1.1.10 (A)   b1 10.1.1.21 (A)   b2 10.1.1.22 (B)
func TestServicesAcrossHosts(t *testing.T) {
	tn := newTestNet(t, []string{"A", "B"}, []podSpec{
		{"c", "A", vpc1, "10.1.1.10/24"},
		{"b1", "A", vpc1, "10.1.1.21/24"},
		{"b2", "B", vpc1, "10.1.1.22/24"},
	})
	tn.wireMode(t)
	tn.services = true
	A, B := tn.hosts["A"], tn.hosts["B"]
	tn.loadMizar(t, A)
	tn.loadMizar(t, B)
	c, b1, b2 := tn.pods["c"], tn.pods["b1"], tn.pods["b2"]
	tn.remoteEndpoint(t, A, b2)
	tn.remoteEndpoint(t, B, c)
	for _, b := range []*testPod{b1, b2} {
		serveNameEcho(t, b)
		serveIdentity(t, b)
		echoUDP(t, b.ns, b.name, netip.AddrPortFrom(b.ip, 5353))
	}
	vip, remoteOnly := addr("10.96.0.10"), addr("10.96.0.12")
	must(t, A.dp.UpsertService(Service{Frontend: Frontend{VIP: vip, Port: 80, Proto: TCP},
		Backends: []netip.AddrPort{netip.AddrPortFrom(b1.ip, nameEchoPort), netip.AddrPortFrom(b2.ip, nameEchoPort)}}))
	must(t, A.dp.UpsertService(Service{Frontend: Frontend{VIP: remoteOnly, Port: identityPort, Proto: TCP},
		Backends: []netip.AddrPort{netip.AddrPortFrom(b2.ip, identityPort)}}))
	must(t, A.dp.UpsertService(Service{Frontend: Frontend{VIP: remoteOnly, Port: 53, Proto: UDP},
		Backends: []netip.AddrPort{netip.AddrPortFrom(b2.ip, 5353)}}))

	before := counters(t, A)
	seen := map[string]int{}
	for i := range 16 {
		sc := dialService(t, c, netip.AddrPortFrom(vip, 80))
		seen[sc.backend]++
		if err := sc.echo(fmt.Sprint("hello ", i)); err != nil {
			t.Fatalf("echo through the VIP (backend %s): %v", sc.backend, err)
		}
		_ = sc.c.Close()
	}
	if seen["b1"] == 0 || seen["b2"] == 0 {
		t.Fatalf("16 connections reached %v, want the local b1 and the remote b2", seen)
	}

	// Full-size segments across the underlay (wire mode), checksums
	// patched per segment.
	data := make([]byte, 4<<20)
	for i := range data {
		data[i] = byte(i * 13)
	}
	name, sum := exchange(t, c, remoteOnly, data)
	want := sha256.Sum256(data)
	if name != "b2" || sum != hex.EncodeToString(want[:]) {
		t.Fatalf("answer %q %s, want b2 and %x", name, sum, want)
	}
	if got := udpAsk(t, c.ns, netip.AddrPortFrom(remoteOnly, 53), "ping"); got != "b2 ping" {
		t.Fatalf("UDP answer %q, want %q", got, "b2 ping")
	}
	after := counters(t, A)
	if after.Underlay["svc_rev_nat"] <= before.Underlay["svc_rev_nat"] {
		t.Fatalf("A's underlay translated no reply: %v", after.Underlay)
	}
	// B programs no Service: its pod program skips the translation.
	if bc := counters(t, B); bc.Pod["svc_nat"]+bc.Pod["svc_rev_nat"] != 0 {
		t.Fatalf("B translated: %v", bc.Pod)
	}
}

// With NetworkPolicy: policy sees the backend (the forward packet is
// translated before it is checked), and a client isolated for ingress
// still gets its replies (the connection entry is under the backend's
// address, checked before the reply is translated back).
func TestServicesWithPolicy(t *testing.T) {
	tn := newTestNet(t, []string{"A"}, []podSpec{
		{"c", "A", vpc1, "10.1.1.10/24"},
		{"b1", "A", vpc1, "10.1.1.21/24"},
		{"b2", "A", vpc1, "10.1.1.22/24"},
	})
	tn.services, tn.netpol = true, true
	A := tn.hosts["A"]
	tn.loadMizar(t, A)
	c, b1, b2 := tn.pods["c"], tn.pods["b1"], tn.pods["b2"]
	serveNameEcho(t, b1)
	serveNameEcho(t, b2)
	pod := func(p *testPod, app string) netpol.Pod {
		return netpol.Pod{Namespace: "default", Name: p.name, Labels: map[string]string{"app": app}, VNI: vpc1, IP: p.ip}
	}
	in := &netpol.Input{Namespaces: map[string]map[string]string{"default": {}},
		Pods: []netpol.Pod{pod(c, "client"), pod(b1, "allowed"), pod(b2, "denied")}}
	tcp := corev1.ProtocolTCP
	in.Policies = []*networkingv1.NetworkPolicy{
		// Nothing may connect to the client.
		{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "client-isolated"}, Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}},
		// b2 takes nobody's connections; b1 the client's on the echo port.
		{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "backends"}, Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"allowed", "denied"}}}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "b1-from-client"}, Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "allowed"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: ptr.To(intstr.FromInt32(nameEchoPort))}},
			}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}},
	}
	comp, err := netpol.NewCompiler().Compile(in)
	must(t, err)
	_, err = A.dp.ApplyPolicy(comp)
	must(t, err)

	vip := addr("10.96.0.10")
	must(t, A.dp.UpsertService(Service{Frontend: Frontend{VIP: vip, Port: 80, Proto: TCP},
		Backends: []netip.AddrPort{netip.AddrPortFrom(b1.ip, nameEchoPort)}}))
	sc := dialService(t, c, netip.AddrPortFrom(vip, 80))
	if sc.backend != "b1" {
		t.Fatalf("reached %s, want b1", sc.backend)
	}
	if err := sc.echo("through policy"); err != nil {
		t.Fatalf("echo: %v", err)
	}

	// The same Service to b2: its ingress policy refuses the client.
	must(t, A.dp.UpsertService(Service{Frontend: Frontend{VIP: vip, Port: 81, Proto: TCP},
		Backends: []netip.AddrPort{netip.AddrPortFrom(b2.ip, nameEchoPort)}}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if conn, err := c.ns.dial(ctx, netip.AddrPortFrom(vip, 81).String()); err == nil {
		_ = conn.Close()
		t.Fatal("connected through a Service to a backend whose policy refuses the client")
	}
}
