package podnet

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
)

// Issue 18, encrypted mode through the real agents (--encryption=wireguard:
// userspace wireguard-go over a TAP, this kernel having no wireguard
// module): each node makes its key, publishes only the public one on its
// Droplet, and peers with the droplets that publish theirs. Pods on three
// nodes talk (through the relays and host to host), nothing of the overlay
// crosses the bridge in the clear, and a stranger on the bridge that sends
// Geneve to a node's physical or droplet address injects nothing, where a
// droplet's own frame through WireGuard is delivered.
func TestEncryptedPodNetwork(t *testing.T) {
	c := newPodCluster(t, 3)
	ctx := context.Background()
	for i, n := range c.nodes {
		c.startAgent(n, "--encryption=wireguard", fmt.Sprintf("--wireguard-address=100.96.0.%d/24", i+1))
	}
	api := c.api.NetworkingV1alpha1()
	for i, n := range c.nodes {
		d, err := api.Droplets().Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("100.96.0.%d", i+1); d.Spec.IP != want || d.Spec.Interface != "mzwg0" {
			t.Fatalf("droplet %s is %s on %s, want %s on mzwg0", n.name, d.Spec.IP, d.Spec.Interface, want)
		}
		if len(d.Annotations[v1alpha1.DropletWireGuardKeyAnnotation]) != 64 || d.Annotations[v1alpha1.DropletWireGuardEndpointAnnotation] != n.ip+":51820" {
			t.Fatalf("droplet %s publishes %v", n.name, d.Annotations)
		}
		key, err := os.ReadFile(n.state + "/wireguard.key")
		if err != nil {
			t.Fatalf("node %s's private key: %v", n.name, err)
		}
		if string(key[:64]) == d.Annotations[v1alpha1.DropletWireGuardKeyAnnotation] {
			t.Fatalf("droplet %s publishes its private key", n.name)
		}
	}
	divider, bouncers := c.createVPC("vpc-a", "10.70.0.0/16", [2]string{"a1", "10.70.1.0/24"})
	t.Logf("divider on %s, bouncer on %s", divider, bouncers["a1"])
	vpc, err := api.Vpcs().Get(ctx, "vpc-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n1, n2, n3 := c.nodes[0], c.nodes[1], c.nodes[2]
	a := c.addPod(n1, "a", "a1")
	b := c.addPod(n2, "b", "a1")
	d := c.addPod(n3, "d", "a1")
	for _, pair := range [][2]*pod{{a, b}, {b, a}, {a, d}, {d, b}} {
		c.waitFor(fmt.Sprintf("%s -> %s over WireGuard", pair[0].name, pair[1].name), 30*time.Second, func() error {
			return ping(pair[0], pair[1].ip, 3)
		})
	}

	clear := startCaptureOf(t, c, n1, "udp", "and", "not", "port", "51820")
	sealed := startCaptureOf(t, c, n1, "udp", "port", "51820")
	marker := "mizar-sealed-" + c.prefix
	if got := udpExchange(t, a, b, 20, marker); got != 20 {
		t.Errorf("b got %d of a's 20 datagrams", got)
	}
	if n := clear.count(t, marker); n != 0 {
		t.Errorf("%d of a's datagrams crossed the bridge outside WireGuard", n)
	}
	if st, err := os.Stat(sealed.file); sealed.count(t, marker) != 0 || err != nil || st.Size() < 20*100 {
		t.Errorf("n1's port carried no WireGuard traffic for the 20 datagrams (%v, %v)", st, err)
	}

	// A stranger on the bridge: no droplet, no key.
	m := c.prefix + "-m"
	c.ip("netns", "add", m)
	c.netns = append(c.netns, m)
	c.ip("link", "add", "eth0", "netns", m, "type", "veth", "peer", "name", c.prefix+"m", "netns", c.prefix+"-ul")
	c.ip("-n", m, "addr", "add", "198.19.0.99/24", "dev", "eth0")
	c.ip("-n", m, "link", "set", "eth0", "up")
	c.ip("-n", c.prefix+"-ul", "link", "set", c.prefix+"m", "master", "br0", "up")
	c.ip("-n", m, "route", "add", "100.96.0.0/24", "via", n2.ip)
	c.waitFor("the stranger on the bridge", 10*time.Second, func() error {
		_, err := c.cnitool(n2, "status", "a1", "/run/netns/"+n2.ns) // the agent still answers
		if err != nil {
			return err
		}
		if out, err := exec.Command("ip", "netns", "exec", m, "ping", "-c", "1", "-W", "1", n2.ip).CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	bMAC := podMAC(t, b)
	vni := uint32(vpc.Spec.VNI)
	for _, dst := range []string{n2.ip, "100.96.0.2"} {
		if injectedTo(t, "/run/netns/"+m, dst, b, vni, a.ip, bMAC, fmt.Sprintf("mizar-stranger-%s-%s", dst, c.prefix)) {
			t.Errorf("b got the stranger's Geneve sent to %s", dst)
		}
	}
	if !injectedTo(t, "/run/netns/"+n1.ns, "100.96.0.2", b, vni, a.ip, bMAC, "mizar-droplet-"+c.prefix) {
		t.Error("control: n1's own Geneve as a through WireGuard did not reach b")
	}
	if err := ping(a, b.ip, 3); err != nil {
		t.Errorf("a -> b after the stranger: %v", err)
	}

	// SIGHUP: n1 takes a new key and publishes it; n2's agent replaces
	// the peer; a TCP stream from a to b runs across it.
	published := func() string {
		dr, err := api.Droplets().Get(ctx, n1.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return dr.Annotations[v1alpha1.DropletWireGuardKeyAnnotation]
	}
	old := published()
	if err := tcpTransfer(a, b, 4<<20, 2*time.Second, func() {
		if err := n1.agent.Signal(syscall.SIGHUP); err != nil {
			t.Error(err)
			return
		}
		c.waitFor("n1's new key published", 10*time.Second, func() error {
			if k := published(); k == old {
				return fmt.Errorf("still %s", k)
			}
			return nil
		})
	}); err != nil {
		t.Errorf("a -> b across n1's key rotation: %v", err)
	}
	if key, err := os.ReadFile(n1.state + "/wireguard.key"); err != nil || string(key[:64]) == old {
		t.Errorf("n1's key file after the rotation: %v", err)
	}
	if err := ping(b, a.ip, 3); err != nil {
		t.Errorf("b -> a after the rotation: %v", err)
	}
}
