package podnet

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Issue 18: a host that only learned where an endpoint lives (a relay told
// it; it holds no API entry for the endpoint) forgets it when the endpoint
// leaves its host, within one watch event (the subnet's status.departures),
// not the learned lifetime (30 s). Through the kernel: pod a on node 3
// talks to pod b on node 4 until node 3 sends to node 4 directly; b is
// deleted and its address given to b2 on node 1. From then on no packet of
// a's reaches node 4, every one reaches b2, and node 4 speaking as b's
// address to a is refused. Nodes 3 and 4 are no relay of the VPC (relays are
// trusted VPC-wide and would prove nothing).
func TestMovedEndpointIsForgottenByLearners(t *testing.T) {
	c := newPodCluster(t, 4)
	n1, n2, n3, n4 := c.nodes[0], c.nodes[1], c.nodes[2], c.nodes[3]
	ctx := context.Background()
	c.startAgent(n1)
	c.startAgent(n2)
	divider, bouncers := c.createVPC("vpc-a", "10.60.0.0/16", [2]string{"a1", "10.60.1.0/24"})
	if divider == n3.name || divider == n4.name || bouncers["a1"] == n3.name || bouncers["a1"] == n4.name {
		t.Fatalf("relays placed on the test's plain hosts: divider %s, bouncer %s", divider, bouncers["a1"])
	}
	c.startAgent(n3)
	c.startAgent(n4)
	vpc, err := c.api.NetworkingV1alpha1().Vpcs().Get(ctx, "vpc-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vni := uint32(vpc.Spec.VNI)

	a := c.addPod(n3, "a", "a1")
	b := c.addPod(n4, "b", "a1")
	// Both ways, so that each host introduces its pod to the other and n3
	// learns b at n4.
	c.waitFor("n3 learned b at n4", 30*time.Second, func() error {
		if err := ping(a, b.ip, 3); err != nil {
			return err
		}
		if err := ping(b, a.ip, 3); err != nil {
			return err
		}
		if h := learnedAt(t, n3, vni, b.ip); h != n4.ip {
			return fmt.Errorf("n3 learned b at %q", h)
		}
		return nil
	})
	// The injection test's control: the frame n4 sends as b reaches a
	// while b lives there.
	aMAC := podMAC(t, a)
	if !injected(t, c, n4, n3, a, vni, b.ip, aMAC, "mizar-move-control-"+c.prefix) {
		t.Fatal("a did not get n4's frame from b while b lived on n4: the injection check below would prove nothing")
	}

	capB := startCapture(t, c, n4)
	start := time.Now()
	c.del(b)
	b2 := c.addPod(n1, "b2", "a1")
	if b2.ip != b.ip {
		t.Fatalf("b2 got %s, not b's %s: the IPAM did not hand the address on", b2.ip, b.ip)
	}
	t.Logf("b deleted and its address on n1 in %v", time.Since(start).Round(time.Millisecond))
	// The departure was listed before b's address was free to hand on;
	// n3's agent applies it from its subnet watch.
	deadline := time.Now().Add(2 * time.Second)
	for h := learnedAt(t, n3, vni, b.ip); h != ""; h = learnedAt(t, n3, vni, b.ip) {
		if time.Now().After(deadline) {
			// Not fatal: what the kernel does with it is the test.
			t.Errorf("n3 still holds a learned path for %s to %s 2 s after the move", b.ip, h)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Every datagram of a's to the address reaches b2, none n4.
	const count = 20
	marker := "mizar-moved-" + c.prefix
	got := udpExchange(t, a, b2, count, marker)
	if got != count {
		t.Errorf("b2 got %d of %d datagrams", got, count)
	}
	if n := capB.count(t, marker); n != 0 {
		t.Errorf("n4, b's former host, got %d of a's %d datagrams after the move", n, count)
	}
	if injected(t, c, n4, n3, a, vni, b.ip, aMAC, "mizar-move-inject-"+c.prefix) {
		t.Error("n3 delivered n4's frame as b's address to a after b left n4")
	}
	s, err := c.api.NetworkingV1alpha1().Subnets().Get(ctx, "a1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("subnet a1 departures: %+v", s.Status.Departures)
	if len(s.Status.Departures) == 0 || s.Status.Departures[len(s.Status.Departures)-1].IP != b.ip {
		t.Errorf("subnet a1 lists departures %+v, want b's last", s.Status.Departures)
	}
}

// learnedAt is the host n's learned map names for (vni, ip), "" if none.
func learnedAt(t *testing.T, n *node, vni uint32, ip string) string {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(n.pins, "learned"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	want := netip.MustParseAddr(ip).As4()
	var k, v []byte
	it := m.Iterate()
	for it.Next(&k, &v) {
		// struct endpoint_key {__u32 vni; __u8 ip[4]} -> struct learned_entry {__u8 host_ip[4]; ...}
		if binary.NativeEndian.Uint32(k[:4]) == vni && bytes.Equal(k[4:8], want[:]) {
			return netip.AddrFrom4([4]byte(v[:4])).String()
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return ""
}

func podMAC(t *testing.T, p *pod) net.HardwareAddr {
	t.Helper()
	var mac net.HardwareAddr
	if err := ns.WithNetNSPath(p.path, func(ns.NetNS) error {
		i, err := net.InterfaceByName("eth0")
		if err == nil {
			mac = i.HardwareAddr
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return mac
}

// inNetns runs f in the netns at path; sockets it opens stay there.
func inNetns(t *testing.T, path string, f func() error) {
	t.Helper()
	if err := ns.WithNetNSPath(path, func(ns.NetNS) error { return f() }); err != nil {
		t.Fatal(err)
	}
}

// udpExchange sends count datagrams carrying marker from p to q's address
// (50 ms apart) and reports how many q received.
func udpExchange(t *testing.T, p, q *pod, count int, marker string) int {
	t.Helper()
	var rx, tx *net.UDPConn
	inNetns(t, q.path, func() (err error) {
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{Port: 9181})
		return err
	})
	defer rx.Close()
	inNetns(t, p.path, func() (err error) {
		tx, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP(q.ip), Port: 9181})
		return err
	})
	defer tx.Close()
	for i := 0; i < count; i++ {
		if _, err := fmt.Fprintf(tx, "%s-%d", marker, i); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	got := 0
	buf := make([]byte, 2048)
	_ = rx.SetReadDeadline(time.Now().Add(time.Second))
	for {
		n, err := rx.Read(buf)
		if err != nil {
			return got
		}
		if strings.HasPrefix(string(buf[:n]), marker) {
			got++
		}
	}
}

// injected sends, from host from's own address (a real droplet's address
// and MAC: nothing spoofed on the wire), a Geneve frame to host to whose
// inner packet claims source src and goes to pod p, and reports whether p
// received it.
func injected(t *testing.T, c *podCluster, from, to *node, p *pod, vni uint32, src string, pMAC net.HardwareAddr, marker string) bool {
	t.Helper()
	return injectedTo(t, "/run/netns/"+from.ns, to.ip, p, vni, src, pMAC, marker)
}

// injectedTo is injected from the netns at fromNS to address dst.
func injectedTo(t *testing.T, fromNS, dst string, p *pod, vni uint32, src string, pMAC net.HardwareAddr, marker string) bool {
	t.Helper()
	var rx *net.UDPConn
	inNetns(t, p.path, func() (err error) {
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{Port: 9182})
		return err
	})
	defer rx.Close()
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: net.ParseIP(src).To4(), DstIP: net.ParseIP(p.ip).To4()}
	udp := &layers.UDP{SrcPort: 9182, DstPort: 9182}
	_ = udp.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		&layers.Geneve{Protocol: layers.EthernetTypeTransparentEthernetBridging, VNI: vni},
		&layers.Ethernet{SrcMAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 0x42}, DstMAC: pMAC, EthernetType: layers.EthernetTypeIPv4},
		ip, udp, gopacket.Payload(marker)); err != nil {
		t.Fatal(err)
	}
	inNetns(t, fromNS, func() error {
		conn, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP(dst), Port: 6081})
		if err != nil {
			return err
		}
		defer conn.Close()
		for i := 0; i < 3; i++ {
			// Refused: a port unreachable came back for an earlier one.
			if _, err := conn.Write(buf.Bytes()); err != nil && !errors.Is(err, syscall.ECONNREFUSED) {
				return err
			}
		}
		return nil
	})
	b := make([]byte, 2048)
	_ = rx.SetReadDeadline(time.Now().Add(time.Second))
	for {
		n, err := rx.Read(b)
		if err != nil {
			return false
		}
		if string(b[:n]) == marker {
			return true
		}
	}
}

// capture is tcpdump of the Geneve frames the underlay bridge hands to a
// node, written to a file. Taken on the bridge's port: on the node's own
// eth0, generic XDP runs before the packet taps, so a frame its program
// re-bounces or drops is never seen there.
type capture struct {
	cmd  *exec.Cmd
	file string
}

func startCapture(t *testing.T, pc *podCluster, n *node) *capture {
	t.Helper()
	return startCaptureOf(t, pc, n, "udp", "port", "6081", "and", "dst", "host", n.ip)
}

// startCaptureOf captures what tcpdump's filter selects on n's bridge port.
func startCaptureOf(t *testing.T, pc *podCluster, n *node, filter ...string) *capture {
	t.Helper()
	c := &capture{file: filepath.Join(t.TempDir(), n.name+".pcap")}
	port := pc.prefix + strings.TrimPrefix(n.name, pc.prefix+"-") // the bridge's end of the node's eth0
	c.cmd = exec.Command("ip", append([]string{"netns", "exec", pc.prefix + "-ul", "tcpdump", "-i", port, "-nn", "-U", "-s", "0", "-w", c.file}, filter...)...)
	stderr, err := c.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.stop)
	// tcpdump says "listening on" once its socket is open.
	listening := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "listening on") {
				close(listening)
				break
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	select {
	case <-listening:
	case <-time.After(10 * time.Second):
		t.Fatalf("tcpdump on %s did not start", n.name)
	}
	return c
}

func (c *capture) stop() {
	if c.cmd.Process != nil && c.cmd.ProcessState == nil {
		_ = c.cmd.Process.Signal(os.Interrupt)
		_ = c.cmd.Wait()
	}
}

// count stops the capture and counts the frames carrying marker.
func (c *capture) count(t *testing.T, marker string) int {
	t.Helper()
	time.Sleep(200 * time.Millisecond) // the last frames written out (-U)
	c.stop()
	data, err := os.ReadFile(c.file)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(data, []byte(marker))
}
