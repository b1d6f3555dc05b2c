package podnet

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"mizar.dev/pkg/dataplane"
	"mizar.dev/test/nettest"
)

// The host path as the agents run it (--host-vpc vpc-a): nodes reach pods
// on other nodes and those pods reach them, a pod reaches a "ClusterIP"
// (a real iptables DNAT rule in its node's netns, as kube-proxy writes
// them) served by a pod of another node, and a pod of vpc-b does not. An
// agent restarted without the flag removes its node's host path.
func TestHostVPC(t *testing.T) {
	c := newPodCluster(t, 2)
	n1, n2 := c.nodes[0], c.nodes[1]
	for _, n := range c.nodes {
		c.startAgent(n, "--host-vpc", "vpc-a")
	}
	c.createVPC("vpc-a", "10.61.0.0/16", [2]string{"a1", "10.61.1.0/24"})
	c.createVPC("vpc-b", "10.62.0.0/16", [2]string{"b1", "10.62.1.0/24"})
	for _, n := range c.nodes {
		c.waitFor(dataplane.HostDevice+" on "+n.name, 30*time.Second, func() error {
			return exec.Command("ip", "-n", n.ns, "link", "show", dataplane.HostDevice).Run()
		})
	}
	a, b := c.addPod(n1, "ha", "a1"), c.addPod(n2, "hb", "a1")
	x := c.addPod(n1, "hx", "b1")
	node1 := &pod{name: n1.name, netns: n1.ns, path: "/run/netns/" + n1.ns, ip: n1.ip}

	// The node and a pod of another node, both ways.
	for _, d := range [][2]*pod{{node1, b}, {b, node1}} {
		if err := ping(d[0], d[1].ip, 2); err != nil {
			t.Error(err)
		}
		if err := tcpTransfer(d[0], d[1], 1<<20, 0, nil); err != nil {
			t.Error(err)
		}
	}

	const svc = "10.96.0.10"
	c.run("ip", "netns", "exec", n1.ns, "iptables", "-w", "-t", "nat", "-A", "PREROUTING", "-d", svc, "-j", "DNAT", "--to-destination", b.ip)
	if err := ping(a, svc, 2); err != nil {
		t.Errorf("pod -> ClusterIP: %v", err)
	}
	if err := tcpToService(a, b, svc); err != nil {
		t.Errorf("pod -> ClusterIP: %v", err)
	}
	// A "NodePort" of the other node whose backend is back on this one
	// (kube-proxy's DNAT and masquerade, in n2): the SYN arrives at n2
	// encapsulated, and n2 forwards it, translated, out of its host
	// device to be encapsulated again. On a veth underlay the skb that
	// crossed still carries the first encapsulation's mark.
	c2 := c.addPod(n1, "hc", "a1")
	const nodePort = "30777"
	c.run("ip", "netns", "exec", n2.ns, "iptables", "-w", "-t", "nat", "-A", "PREROUTING", "-d", n2.ip, "-p", "tcp", "--dport", nodePort, "-j", "DNAT", "--to-destination", c2.ip+":7777")
	c.run("ip", "netns", "exec", n2.ns, "iptables", "-w", "-t", "nat", "-A", "POSTROUTING", "-d", c2.ip, "-p", "tcp", "--dport", "7777", "-j", "MASQUERADE")
	if err := tcpToServicePort(a, c2, n2.ip, nodePort); err != nil {
		t.Errorf("pod -> another node's NodePort -> a pod of the first node: %v", err)
	}
	// vpc-b's pod reaches its node, and nothing of vpc-a through it.
	if err := ping(x, n1.ip, 1); err != nil {
		t.Errorf("vpc-b pod -> its node: %v", err)
	}
	if err := ping(x, svc, 1); err == nil {
		t.Error("vpc-b's pod reached vpc-a's ClusterIP")
	}

	c.stopAgent(n1)
	c.startAgent(n1)
	// Its droplet was Provisioned by the first run: the removal may follow.
	c.waitFor("the host path gone from "+n1.name+" after a restart without --host-vpc", 30*time.Second, func() error {
		if exec.Command("ip", "-n", n1.ns, "link", "show", dataplane.HostDevice).Run() == nil {
			return fmt.Errorf("%s still there", dataplane.HostDevice)
		}
		if out, err := exec.Command("ip", "netns", "exec", n1.ns, "nft", "list", "table", "ip", dataplane.HostPathTable).CombinedOutput(); err == nil {
			return fmt.Errorf("nftables table %s still there:\n%s", dataplane.HostPathTable, out)
		}
		return nil
	})
	if err := ping(a, svc, 1); err == nil {
		t.Error("pod reached the ClusterIP with its node's host path removed")
	}
}

// tcpToService sends 1 MB from pod from to addr's port 7777, which a
// node DNATs to pod to's port 7777, and checks what to received.
func tcpToService(from, to *pod, addr string) error {
	return tcpToServicePort(from, to, addr, "7777")
}

// tcpToServicePort is tcpToService to addr:port.
func tcpToServicePort(from, to *pod, addr, port string) error {
	sink, err := nettest.ListenHash(to.path, to.ip+":7777", 30*time.Second)
	if err != nil {
		return fmt.Errorf("listen in %s: %w", to.name, err)
	}
	defer sink.Close()
	data := make([]byte, 1<<20)
	_, _ = rand.Read(data)
	want := sha256.Sum256(data)
	var conn net.Conn
	if err := ns.WithNetNSPath(from.path, func(ns.NetNS) error {
		conn, err = net.DialTimeout("tcp4", net.JoinHostPort(addr, port), 5*time.Second)
		return err
	}); err != nil {
		return fmt.Errorf("TCP %s -> %s: %w", from.name, addr, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := conn.Write(data); err != nil {
		return fmt.Errorf("TCP %s -> %s: %w", from.name, addr, err)
	}
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		return err
	}
	if h := sink.Sum(); h != hex.EncodeToString(want[:]) {
		return fmt.Errorf("TCP %s -> %s (%s): received %s, sent sha256 %x", from.name, addr, to.name, h, want)
	}
	return nil
}
