package podnet

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"mizar.dev/pkg/dataplane"
	"mizar.dev/test/nettest"
)

// BenchmarkPodTCP: pod-to-pod TCP throughput (iperf3, one stream) and round
// trips (1-byte TCP_RR) across nodes of a 4-node cluster, through the real
// mizar-nodeagent processes and pods added by the real cnitool, in wire mode
// (the cluster's underlay veths have no TSO/GSO/checksum offload), beside
// the kernel's VXLAN overlay on the same node and pod namespaces. Both pods
// of each pair are on the two nodes without a relay of the VPC (a relay's
// node knows the endpoints it relays for and sends to them directly), so the
// path is the one mizar takes between two ordinary nodes:
//
//	mizar-same   one subnet: the first packets go through its bouncer, then
//	             both nodes have learned each other's pod and send host to
//	             host (checked: the relays forward next to nothing of the
//	             measured flow, and the sender encapsulates to a learned host)
//	mizar-cross  two subnets of one VPC: the first packets go through the
//	             divider, then host to host the same way (checked the same)
//	vxlan-same,  the same pod pairs over a second veth in each pod into the
//	vxlan-cross  same node netns, routed over a VXLAN device per node on the
//	             same underlay addresses (flannel's vxlan backend, static
//	             neighbour and FDB entries)
//
// The four paths take turns, round by round, so drift on a shared machine
// hits all of them; each reports its best round (other load only ever takes
// speed away), and each mizar path its ratio to VXLAN between the same pods.
// The VXLAN packets also cross mizar's underlay program (XDP_PASS, generic
// mode as the cluster runs it), since the nodes are the same.
func BenchmarkPodTCP(b *testing.B) {
	const (
		rounds   = 3
		rrRounds = 10000
	)
	c := newPodCluster(b, 4)
	for _, n := range c.nodes {
		n.health = freeLoopbackAddr(b)
	}
	// Placement as in TestPodNetwork: vpc-a's divider and a2's bouncer on
	// node 1, a1's bouncer on node 2; the nodes that join later hold none.
	c.startAgent(c.nodes[0])
	c.startAgent(c.nodes[1])
	divider, bouncers := c.createVPC("vpc-a", "10.60.0.0/16", [2]string{"a1", "10.60.1.0/24"}, [2]string{"a2", "10.60.2.0/24"})
	for _, n := range c.nodes[2:] {
		c.startAgent(n)
	}
	b.Logf("vpc-a's divider on %s, a1's bouncer on %s, a2's on %s", divider, bouncers["a1"], bouncers["a2"])
	var free []*node
	for _, n := range c.nodes {
		if n.name != divider && n.name != bouncers["a1"] && n.name != bouncers["a2"] {
			free = append(free, n)
		}
	}
	if len(free) < 2 {
		b.Fatalf("relays of vpc-a on all but %d nodes: no pair of nodes whose first packets go through a relay", len(free))
	}
	s, r := c.addPod(free[0], "s", "a1"), c.addPod(free[1], "r", "a1")
	x, y := c.addPod(free[0], "x", "a1"), c.addPod(free[1], "y", "a2")
	vx := c.vxlanOverlay([]*pod{s, r, x, y})

	type path struct {
		name     string
		from, to *pod
		dstIP    string
		mizar    bool
		relayed  float64 // packets the relays forwarded in the worst run
		by       string  // and by whom
		sender   string  // the sender node's pod program in that run
		// Packets the sender's pod program sent to a learned host, and
		// through a relay (plain or introducing), in that run.
		learned, unlearned float64
		gbps               float64
		rtt                float64
		baseline           string // the VXLAN path between the same pods
	}
	paths := []*path{
		{name: "mizar-same", from: s, to: r, dstIP: r.ip, mizar: true, baseline: "vxlan-same"},
		{name: "vxlan-same", from: s, to: r, dstIP: vx[r]},
		{name: "mizar-cross", from: x, to: y, dstIP: y.ip, mizar: true, baseline: "vxlan-cross"},
		{name: "vxlan-cross", from: x, to: y, dstIP: vx[y]},
	}
	byName := map[string]*path{}
	for _, p := range paths {
		byName[p.name] = p
		if p.baseline == "" {
			continue
		}
		// The first packets go through the relays and teach the sender's
		// node where the peer lives; a second round, spaced past the
		// introduction delay, goes host to host.
		for range 2 {
			if err := ping(p.from, p.to.ip, 3); err != nil {
				b.Fatalf("%s warm-up: %v", p.name, err)
			}
		}
	}
	for _, p := range paths {
		if err := ping(p.from, p.dstIP, 1); err != nil {
			b.Fatalf("%s: %v", p.name, err)
		}
	}

	b.ResetTimer()
	for round := range rounds {
		for _, p := range paths {
			var before map[string]float64
			if p.mizar {
				before = c.counters(b)
			}
			g, err := nettest.Iperf(p.from.path, p.to.path, p.dstIP, 1)
			if err != nil {
				b.Fatalf("%s: %v", p.name, err)
			}
			if p.mizar {
				delta := c.counters(b)
				var n float64
				var by []string
				for k, v := range delta {
					delta[k] = v - before[k]
					node, counter, _ := strings.Cut(k, "/")
					if relayReasons[counter] && delta[k] > 0 {
						n += delta[k]
						by = append(by, fmt.Sprintf("%s %s %.0f", node, counter, delta[k]))
					}
				}
				if n >= p.relayed {
					slices.Sort(by)
					pod := func(reason string) float64 { return delta[p.from.node.name+"/pod/"+reason] }
					p.relayed, p.by = n, strings.Join(by, ", ")
					p.learned, p.unlearned = pod("encap_learned"), pod("encap")+pod("introduce")
					p.sender = fmt.Sprintf("encap_learned %.0f, encap %.0f, introduce %.0f", pod("encap_learned"), pod("encap"), pod("introduce"))
				}
			}
			rtt, err := nettest.TCPRR(p.from.path, p.to.path, p.dstIP, rrRounds)
			if err != nil {
				b.Fatalf("%s: %v", p.name, err)
			}
			b.Logf("round %d %-11s %6.2f Gbit/s %7.1f µs", round+1, p.name, g, rtt)
			p.gbps = max(p.gbps, g)
			if p.rtt == 0 || rtt < p.rtt {
				p.rtt = rtt
			}
		}
	}
	b.StopTimer()

	var summary []string
	for _, p := range paths {
		b.ReportMetric(p.gbps, p.name+"-Gbit/s")
		b.ReportMetric(p.rtt, p.name+"-rtt-µs")
		line := fmt.Sprintf("%s %.2f Gbit/s %.1f µs", p.name, p.gbps, p.rtt)
		if base := byName[p.baseline]; base != nil {
			b.ReportMetric(p.gbps/base.gbps, p.name+"-x-vxlan-tput")
			b.ReportMetric(p.rtt/base.rtt, p.name+"-x-vxlan-rtt")
			b.ReportMetric(p.relayed, p.name+"-relayed-pkts")
			line += fmt.Sprintf(" (x%.2f vxlan tput, x%.2f vxlan rtt; relayed in the worst iperf run: %.0f packets [%s], sender's pod program: %s)",
				p.gbps/base.gbps, p.rtt/base.rtt, p.relayed, p.by, p.sender)
		}
		summary = append(summary, line)
	}
	b.Log("best of " + fmt.Sprint(rounds) + " interleaved rounds: " + strings.Join(summary, "; "))
	// The mizar flows must have gone host to host: a learned flow only goes
	// through a relay again when its entry nears its end of life, or for a
	// new connection's first packets (a handful), and iperf moves ~10^5
	// packets a second.
	for _, p := range paths {
		if p.mizar && (p.relayed > 100 || p.learned < p.unlearned) {
			b.Errorf("%s: the relays forwarded %.0f packets of the flow (%s), the sender's pod program %s: it did not go host to host", p.name, p.relayed, p.by, p.sender)
		}
	}
}

// vxlanOverlay builds the kernel's VXLAN overlay over the cluster's nodes
// and gives each pod a second interface, eth1, on it: a veth from the pod's
// node netns, an address in 10.99.0.0/24 (in the order given), a route on
// its node and proxy ARP there, and on every other node a route over that
// node's VXLAN device with static neighbour and FDB entries. The pod ends
// get GRO, as mizar's eth0 has, so both overlays deliver alike. It returns
// each pod's address on eth1; everything goes with the namespaces.
func (c *podCluster) vxlanOverlay(pods []*pod) map[*pod]string {
	c.t.Helper()
	vxMAC := func(i int) string { return fmt.Sprintf("02:fd:00:00:00:%02x", i+1) }
	mtu, err := dataplane.PodMTU(1500)
	if err != nil {
		c.t.Fatal(err)
	}
	index := map[*node]int{}
	for i, n := range c.nodes {
		index[n] = i
		c.ip("-n", n.ns, "link", "add", "vx0", "mtu", fmt.Sprint(mtu), "address", vxMAC(i), "type", "vxlan", "id", "42",
			"local", n.ip, "dev", "eth0", "dstport", "4789", "nolearning")
		c.ip("-n", n.ns, "link", "set", "vx0", "up")
		c.run("ip", "netns", "exec", n.ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
		for j, o := range c.nodes {
			if o != n {
				c.run("bridge", "-n", n.ns, "fdb", "append", vxMAC(j), "dev", "vx0", "dst", o.ip, "self", "permanent")
			}
		}
	}
	addrs := map[*pod]string{}
	for k, p := range pods {
		addr := fmt.Sprintf("10.99.0.%d", k+1)
		addrs[p] = addr
		host := fmt.Sprintf("vxp%d", k)
		c.ip("link", "add", host, "mtu", fmt.Sprint(mtu), "netns", p.node.ns, "type", "veth", "peer", "name", "eth1", "mtu", fmt.Sprint(mtu), "netns", p.netns)
		c.ip("-n", p.netns, "addr", "add", addr+"/24", "dev", "eth1")
		c.ip("-n", p.netns, "link", "set", "eth1", "up")
		if err := dataplane.EnableGROInNetns(p.path, "eth1"); err != nil {
			c.t.Fatal(err)
		}
		c.ip("-n", p.node.ns, "link", "set", host, "up")
		// Answered at once: the kernel delays proxy ARP replies by up to
		// 0.8 s by default, past a single ping's wait.
		c.run("ip", "netns", "exec", p.node.ns, "sysctl", "-qw", "net.ipv4.conf."+host+".proxy_arp=1", "net.ipv4.neigh."+host+".proxy_delay=0")
		c.ip("-n", p.node.ns, "route", "add", addr+"/32", "dev", host)
		for _, o := range c.nodes {
			if o == p.node {
				continue
			}
			c.ip("-n", o.ns, "route", "add", addr+"/32", "dev", "vx0")
			c.ip("-n", o.ns, "neigh", "replace", addr, "lladdr", vxMAC(index[p.node]), "dev", "vx0", "nud", "permanent")
		}
	}
	return addrs
}

// relayReasons are the underlay counters of packets forwarded for others: as
// bouncer, as divider, or on to a relay.
var relayReasons = map[string]bool{"underlay/fwd_endpoint": true, "underlay/fwd_subnet": true, "underlay/fwd_divider": true, "underlay/rebounce": true}

// counters reads every agent's datapath counters from its /metrics, keyed
// "<node>/underlay/<reason>" and "<node>/pod/<reason>".
func (c *podCluster) counters(tb testing.TB) map[string]float64 {
	tb.Helper()
	all := map[string]float64{}
	for _, n := range c.nodes {
		c.waitFor("metrics of "+n.name, 10*time.Second, func() error {
			got, err := agentCounters(n.health)
			for k, v := range got {
				all[n.name+"/"+k] = v
			}
			return err
		})
	}
	return all
}

// agentCounters reads mizar_dataplane_packets_total by program and reason
// from an agent's Prometheus endpoint, keyed "underlay/<reason>" and
// "pod/<reason>".
func agentCounters(addr string) (map[string]float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/metrics: %s", addr, resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), `mizar_dataplane_packets_total{program="`)
		if !ok {
			continue
		}
		prog, rest, ok := strings.Cut(rest, `",reason="`)
		if !ok {
			return nil, fmt.Errorf("metrics of %s: unexpected line %q", addr, sc.Text())
		}
		reason, value, ok := strings.Cut(rest, `"} `)
		if !ok {
			return nil, fmt.Errorf("metrics of %s: unexpected line %q", addr, sc.Text())
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return nil, fmt.Errorf("metrics of %s: %q: %w", addr, sc.Text(), err)
		}
		out[prog+"/"+reason] = v
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("metrics of %s: no datapath counters", addr)
	}
	return out, nil
}

// freeLoopbackAddr is a loopback address with a port free right now, for an
// agent's --health-addr.
func freeLoopbackAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
