// Package podnet is the pod network end to end (issue 9): a 3-node local
// cluster of real processes (mizar-apiserver, one mizar-nodeagent per node),
// pods added through the real cnitool and libcni exactly as a runtime does,
// and traffic between them through the real dataplane. Needs root.
package podnet

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"mizar.dev/pkg/cni"
	"mizar.dev/test/nettest"
)

func TestPodNetwork(t *testing.T) {
	c := newPodCluster(t, 3)
	n1, n2, n3 := c.nodes[0], c.nodes[1], c.nodes[2]
	ctx := context.Background()
	api := c.api.NetworkingV1alpha1()

	// Node 3 joins after the VPCs are placed: no divider or bouncer of them
	// lands there, the placement whose cross-subnet traffic bouncers used to
	// drop (drop_src_unknown).
	c.startAgent(n1)
	c.startAgent(n2)
	// One at a time, each placed before the next: the operator puts an
	// object on the least loaded droplet (ties by name), so the placement is
	// the same every run: vpc-a's divider on node 1, a1's bouncer on node 2.
	c.createVPC("vpc-a", "10.60.0.0/16", [2]string{"a1", "10.60.1.0/24"}, [2]string{"a2", "10.60.2.0/24"}, [2]string{"a3", "10.60.3.0/29"})
	c.createVPC("vpc-b", "10.60.0.0/16", [2]string{"b1", "10.60.1.0/24"})
	c.startAgent(n3)
	divs, _ := api.Dividers().List(ctx, metav1.ListOptions{})
	bns, _ := api.Bouncers().List(ctx, metav1.ListOptions{})
	for _, d := range divs.Items {
		t.Logf("divider %s of %s on %s", d.Name, d.Spec.VPC, d.Spec.Droplet)
		if d.Spec.Droplet == n3.name {
			t.Fatalf("divider %s placed on %s, which should hold none", d.Name, n3.name)
		}
	}
	dividerOf := map[string]string{}
	far := ""
	for _, d := range divs.Items {
		dividerOf[d.Spec.VPC] = d.Spec.Droplet
	}
	for _, b := range bns.Items {
		t.Logf("bouncer %s of %s on %s", b.Name, b.Spec.Subnet, b.Spec.Droplet)
		if b.Spec.Droplet == n3.name {
			t.Fatalf("bouncer %s placed on %s, which should hold none", b.Name, n3.name)
		}
		// A subnet whose bouncer is away from vpc-a's divider (whose host
		// knows every endpoint of the VPC): its bouncer knows only its own.
		if (b.Spec.Subnet == "a1" || b.Spec.Subnet == "a2") && b.Spec.Droplet != dividerOf["vpc-a"] {
			far = b.Spec.Subnet
		}
	}
	if far == "" {
		t.Fatal("the bouncers of a1 and a2 share a node with vpc-a's divider: the cross-subnet case is not covered")
	}

	step := func(name string, f func(t *testing.T)) {
		t.Run(name, func(st *testing.T) {
			c.t = st
			defer func() { c.t = t }()
			f(st)
		})
	}

	var p1, p2, p3, q1, q2, q3 *pod
	step("first ping after ADD", func(t *testing.T) {
		// Provisioned means forwarding: the first ping from a pod whose ADD
		// just returned, to every pod before it, is answered; no retries.
		var pods []*pod
		for i, n := range c.nodes {
			p := c.addPod(n, fmt.Sprintf("p%d", i+1), "a1")
			for _, q := range pods {
				if err := ping(p, q.ip, 1); err != nil {
					t.Errorf("first ping after ADD: %v", err)
				}
			}
			pods = append(pods, p)
		}
		p1, p2, p3 = pods[0], pods[1], pods[2]
	})
	if p3 == nil {
		t.FailNow()
	}

	step("same subnet across nodes", func(t *testing.T) {
		for _, pair := range [][2]*pod{{p1, p2}, {p1, p3}, {p2, p3}} {
			for _, d := range [][2]*pod{pair, {pair[1], pair[0]}} {
				if err := ping(d[0], d[1].ip, 3); err != nil {
					t.Error(err)
				}
			}
		}
		// TCP data both ways, checked by hash, between a relay node and the
		// node without one, and between two relay nodes.
		for _, d := range [][2]*pod{{p1, p3}, {p3, p1}, {p2, p1}, {p1, p2}} {
			if err := tcpTransfer(d[0], d[1], 4<<20, 0, nil); err != nil {
				t.Error(err)
			}
		}
	})

	step("host and pod", func(t *testing.T) {
		// A node reaches its own pods and they reach it outside the overlay
		// (kubelet's probes): ping and hash-checked TCP both ways. Before any
		// pod of vpc-b shares an address with these.
		for _, p := range []*pod{p1, p2, p3} {
			host := &pod{name: p.node.name, netns: p.node.ns, path: "/run/netns/" + p.node.ns, ip: p.node.ip}
			if err := ping(host, p.ip, 1); err != nil {
				t.Errorf("node -> its pod: %v", err)
			}
			if err := ping(p, host.ip, 1); err != nil {
				t.Errorf("pod -> its node: %v", err)
			}
			for _, d := range [][2]*pod{{host, p}, {p, host}} {
				if err := tcpTransfer(d[0], d[1], 1<<20, 0, nil); err != nil {
					t.Error(err)
				}
			}
		}
	})

	step("across subnets through the divider", func(t *testing.T) {
		q1, q2, q3 = c.addPod(n1, "q1", "a2"), c.addPod(n2, "q2", "a2"), c.addPod(n3, "q3", "a2")
		// The first packets of a new pod on node 3 (no divider or bouncer
		// there) into the subnet whose bouncer is not on the divider's node
		// (a bouncer holds, and trusts, only its own subnet's endpoints):
		// answered at once.
		near, targets := "a2", []*pod{p1, p2}
		if far == "a2" {
			near, targets = "a1", []*pod{q1, q2}
		}
		x := c.addPod(n3, "x3", near)
		for _, p := range targets {
			if err := ping(x, p.ip, 1); err != nil {
				t.Errorf("first ping from the node without relays into %s: %v", far, err)
			}
		}
		for _, d := range [][2]*pod{{p3, q1}, {p3, q2}, {q3, p1}, {q3, p2}, {p1, q2}, {q2, p1}, {p1, q3}, {p2, q3}, {q1, p3}} {
			if err := ping(d[0], d[1].ip, 2); err != nil {
				t.Error(err)
			}
		}
		for _, d := range [][2]*pod{{p3, q2}, {q2, p3}} {
			if err := tcpTransfer(d[0], d[1], 4<<20, 0, nil); err != nil {
				t.Error(err)
			}
		}
	})
	if q3 == nil {
		t.FailNow()
	}

	step("two VPCs with overlapping CIDRs stay isolated", func(t *testing.T) {
		// b1 repeats a1's addresses; a node refuses a second pod with an address
		// one of its pods holds (it could not tell them apart), so each lands on a
		// node whose a1 pod holds another: r1 takes 10.60.1.2 (p1's, on n1), r3 .3 (p2's, on n2).
		r1, r3 := c.addPod(n3, "r1", "b1"), c.addPod(n1, "r3", "b1")
		if err := ping(r3, r1.ip, 2); err != nil {
			t.Error(err)
		}
		// r1 may hold an address a pod of VPC a has too: TCP to a listener
		// only r1 runs tells who answered.
		if err := tcpTransfer(r3, r1, 1<<20, 0, nil); err != nil {
			t.Error(err)
		}
		bIPs := []string{r1.ip, r3.ip}
		for _, q := range []*pod{p1, p2, p3, q1, q2, q3} {
			if slices.Contains(bIPs, q.ip) {
				continue
			}
			if err := ping(r3, q.ip, 1); err == nil {
				t.Errorf("pod r3 of vpc-b reached %s of vpc-a (%s)", q.name, q.ip)
			}
			if err := ping(q, r3.ip, 1); err == nil && !slices.Contains([]string{p1.ip, p2.ip, p3.ip}, r3.ip) {
				t.Errorf("pod %s of vpc-a reached r3 of vpc-b (%s)", q.name, r3.ip)
			}
		}
	})

	step("CHECK after ADD, DEL twice, DEL without ADD", func(t *testing.T) {
		before := c.footprint(n2)
		d := c.addPod(n2, "d1", "a1")
		if _, err := c.cnitool(n2, "check", "a1", d.path); err != nil {
			t.Errorf("CHECK after ADD: %v", err)
		}
		if err := c.cni.CheckNetworkList(ctx, c.conflist(n2, "a1"), d.runtimeConf()); err != nil {
			t.Errorf("CHECK through libcni: %v", err)
		}
		for i := range 2 {
			if _, err := c.cnitool(n2, "del", "a1", d.path); err != nil {
				t.Errorf("DEL %d: %v", i+1, err)
			}
		}
		if after := c.footprint(n2); after != before || c.hasEth0(d) {
			t.Errorf("after DEL: %+v (eth0 left: %v), before ADD: %+v", after, c.hasEth0(d), before)
		}
		never := c.newPod(n2, "never", "a1")
		if _, err := c.cnitool(n2, "del", "a1", never.path); err != nil {
			t.Errorf("DEL without ADD: %v", err)
		}
		if _, err := c.cnitool(n2, "check", "a1", never.path); err == nil {
			t.Error("CHECK of a pod never added passed")
		}
	})

	step("deleting a pod stops its traffic and frees its IP", func(t *testing.T) {
		old := p2.ip
		c.del(p2)
		if err := ping(p1, old, 2); err == nil {
			t.Errorf("%s still answers after its pod was deleted", old)
		}
		c.waitFor("endpoint of p2 gone", 10*time.Second, func() error {
			eps, err := api.Endpoints("default").List(ctx, metav1.ListOptions{FieldSelector: "spec.subnet=a1"})
			if err != nil {
				return err
			}
			for _, ep := range eps.Items {
				if ep.Spec.IP == old {
					return fmt.Errorf("endpoint %s still holds %s", ep.Name, old)
				}
			}
			return nil
		})
		// The lowest free address is handed out first: the freed one.
		p2 = c.addPod(n2, "p2b", "a1")
		if p2.ip != old {
			t.Errorf("a new pod got %s, not the freed %s", p2.ip, old)
		}
		if err := ping(p1, p2.ip, 1); err != nil {
			t.Errorf("first ping to the new pod: %v", err)
		}
	})

	step("GC per network", func(t *testing.T) {
		g1, g2, g3 := c.addPod(n1, "g1", "a1"), c.addPod(n1, "g2", "a1"), c.addPod(n1, "g3", "b1")
		// The runtime's GC of network a1 lists a1's attachments it knows.
		valid := []types.GCAttachment{}
		for _, p := range []*pod{p1, g1} {
			rt := p.runtimeConf()
			valid = append(valid, types.GCAttachment{ContainerID: rt.ContainerID, IfName: rt.IfName})
		}
		if err := c.cni.GCNetworkList(ctx, c.conflist(n1, "a1"), &libcni.GCArgs{ValidAttachments: valid}); err != nil {
			t.Fatalf("GC of a1: %v", err)
		}
		if c.hasEth0(g2) {
			t.Error("GC of a1 kept g2, which it did not list")
		}
		// Listed ones, and other networks' (a2, b1) on the same node, stay.
		for _, p := range []*pod{p1, g1, q1, g3} {
			if _, err := c.cnitool(n1, "check", p.network, p.path); err != nil {
				t.Errorf("after GC of a1: %v", err)
			}
		}
		if err := ping(p3, g1.ip, 1); err != nil {
			t.Errorf("after GC: %v", err)
		}
		if _, err := c.cnitool(n1, "del", "a1", g2.path); err != nil {
			t.Errorf("DEL after GC: %v", err)
		}
	})

	step("failed ADDs leave nothing behind", func(t *testing.T) {
		bad := map[string]struct {
			conf string
			code uint
			says string
		}{
			"no subnet":      {`{"type": "mizar", "vpc": "vpc-a"}`, types.ErrInvalidNetworkConfig, `"subnet"`},
			"not decodable":  {`{"type": "mizar", "vpc": 5, "subnet": "a1"}`, types.ErrDecodingFailure, "not valid JSON"},
			"unknown subnet": {`{"type": "mizar", "vpc": "vpc-a", "subnet": "nope"}`, types.ErrInvalidNetworkConfig, "does not exist"},
			"other VPC":      {`{"type": "mizar", "vpc": "vpc-b", "subnet": "a2"}`, types.ErrInvalidNetworkConfig, `belongs to VPC "vpc-a"`},
		}
		for name, b := range bad {
			entry := strings.TrimSuffix(b.conf, "}") + fmt.Sprintf(`, "agentSocket": %q, "deleteQueue": %q}`, n1.socket, n1.queue)
			l, err := libcni.ConfListFromBytes(fmt.Appendf(nil, `{"cniVersion": "1.1.0", "name": "bad", "plugins": [%s]}`, entry))
			if err != nil {
				t.Fatal(err)
			}
			p := c.newPod(n1, "bad"+strings.ReplaceAll(name, " ", ""), "bad")
			before := c.footprint(n1)
			_, err = c.cni.AddNetworkList(ctx, l, p.runtimeConf())
			var ce *types.Error
			if !errors.As(err, &ce) || ce.Code != b.code || !strings.Contains(err.Error(), b.says) {
				t.Errorf("%s: ADD said %v, want CNI code %d saying %s", name, err, b.code, b.says)
			}
			if after := c.footprint(n1); after != before || c.hasEth0(p) {
				t.Errorf("%s: left %+v (eth0 %v), before %+v", name, after, c.hasEth0(p), before)
			}
		}
		// A /29 holds 5 pods (network, gateway and broadcast excluded); the
		// 6th ADD fails with code 102 and leaves nothing.
		for i := range 5 {
			c.addPod(c.nodes[i%3], fmt.Sprintf("t%d", i), "a3")
		}
		p := c.newPod(n3, "t5", "a3")
		before := c.footprint(n3)
		_, err := c.cni.AddNetworkList(ctx, c.conflist(n3, "a3"), p.runtimeConf())
		var ce *types.Error
		if !errors.As(err, &ce) || ce.Code != cni.CodeSubnetFull {
			t.Errorf("ADD into the full /29: %v, want code %d", err, cni.CodeSubnetFull)
		}
		if after := c.footprint(n3); after != before || c.hasEth0(p) {
			t.Errorf("full subnet: left %+v (eth0 %v), before %+v", after, c.hasEth0(p), before)
		}
	})

	step("agent restarts during a TCP transfer", func(t *testing.T) {
		// 24 MiB paced over ~4 s from node 1 to node 3 (through both, then
		// direct); each agent restarts while it runs. The connection must
		// survive and deliver every byte.
		err := tcpTransfer(p1, p3, 24<<20, 4*time.Second, func() {
			for _, n := range []*node{n3, n1} {
				c.stopAgent(n)
				c.startAgent(n)
			}
		})
		if err != nil {
			t.Error(err)
		}
		if err := ping(q3, p1.ip, 1); err != nil {
			t.Errorf("after the restarts: %v", err)
		}
	})

	step("agent killed, pod deleted meanwhile, agent back: pod cleaned up", func(t *testing.T) {
		k := c.addPod(n2, "k", "a1")
		before := c.footprint(n2)
		n2.agent.Kill()
		err := c.cni.GetStatusNetworkList(ctx, c.conflist(n2, "a1"))
		var ce *types.Error
		if !errors.As(err, &ce) || ce.Code != 50 {
			t.Errorf("STATUS with the agent down: %v, want code 50", err)
		}
		if _, err := c.cnitool(n2, "del", "a1", k.path); err != nil {
			t.Errorf("DEL with the agent down (queued): %v", err)
		}
		c.startAgent(n2)
		c.waitFor("the queued DEL carried out", 20*time.Second, func() error {
			if f := c.footprint(n2); f.links != before.links-1 || f.states != before.states-1 || f.endpoints != before.endpoints-1 || c.hasEth0(k) {
				return fmt.Errorf("footprint %+v, eth0 %v; before DEL %+v", f, c.hasEth0(k), before)
			}
			return nil
		})
		if err := c.cni.GetStatusNetworkList(ctx, c.conflist(n2, "a1")); err != nil {
			t.Errorf("STATUS with the agent back: %v", err)
		}
		if err := ping(p2, p3.ip, 1); err != nil {
			t.Errorf("after the kill: %v", err)
		}
	})
}

// tcpTransfer sends size random bytes over TCP from pod from to a listener in
// pod to, spread over pace (0: as fast as it goes), calling during (if set)
// half-way in its own goroutine, and compares SHA-256 on both ends.
func tcpTransfer(from, to *pod, size int, pace time.Duration, during func()) error {
	sink, err := nettest.ListenHash(to.path, to.ip+":7777", 90*time.Second)
	if err != nil {
		return fmt.Errorf("listen in %s: %w", to.name, err)
	}
	defer sink.Close()
	data := make([]byte, size)
	_, _ = rand.Read(data)
	want := sha256.Sum256(data)
	var conn net.Conn
	if err := ns.WithNetNSPath(from.path, func(ns.NetNS) error {
		var err error
		conn, err = net.DialTimeout("tcp4", to.ip+":7777", 5*time.Second)
		return err
	}); err != nil {
		return fmt.Errorf("TCP %s -> %s (%s): %w", from.name, to.name, to.ip, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(90 * time.Second))
	const chunk = 64 << 10
	chunks := (size + chunk - 1) / chunk
	done := make(chan struct{})
	for i := 0; i < chunks; i++ {
		if during != nil && i == chunks/4 {
			go func() { defer close(done); during() }()
		}
		if _, err := conn.Write(data[i*chunk : min(size, (i+1)*chunk)]); err != nil {
			return fmt.Errorf("TCP %s -> %s: write at %d of %d bytes: %w", from.name, to.name, i*chunk, size, err)
		}
		if pace > 0 {
			time.Sleep(pace / time.Duration(chunks))
		}
	}
	if during != nil {
		<-done
	}
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		return err
	}
	if h := sink.Sum(); h != hex.EncodeToString(want[:]) {
		return fmt.Errorf("TCP %s -> %s: received %s, sent sha256 %x", from.name, to.name, h, want)
	}
	return nil
}
