package nodeagent

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/apiserver"
	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/pkg/dataplane"
	"mizar.dev/test/nettest"
)

// Two droplets on a bridged underlay, each a netns running the real agent
// (NodeOptions.Run, as cmd/nodeagent does); pods added through the plugin
// binary and libcni on each; they ping each other across the overlay.
func TestTwoNodesPodsPing(t *testing.T) {
	c := newCluster(t, 2)
	sfx, cniCfg, srv, ctx, nodes := c.sfx, c.cni, c.srv, c.ctx, c.nodes
	start, stop := c.start, c.stop
	api := srv.Client.NetworkingV1alpha1()
	vpc, subnet := "vpc-"+sfx, "sn-"+sfx
	if _, err := api.Vpcs().Create(ctx, &v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: vpc}, Spec: v1alpha1.VpcSpec{CIDR: "10.88.0.0/16"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Subnets().Create(ctx, &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: subnet}, Spec: v1alpha1.SubnetSpec{VPC: vpc, CIDR: "10.88.1.0/24"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	var ips []string
	var podNS []string
	var lists []*libcni.NetworkConfigList
	var rts []*libcni.RuntimeConf
	for i, n := range nodes {
		l, err := libcni.ConfListFromBytes(fmt.Appendf(nil, `{"cniVersion": "1.1.0", "name": "mizar", "plugins": [{"type": "mizar",
			"vpc": %q, "subnet": %q, "agentSocket": %q, "deleteQueue": %q}]}`, vpc, subnet, n.socket, n.queue))
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("mzt-pod%d-%s", i, sfx)
		path := netnsAdd(t, name)
		rt := &libcni.RuntimeConf{ContainerID: "ctr-" + name, NetNS: path, IfName: "eth0"}
		var res *types100.Result
		start := time.Now()
		for {
			r, err := cniCfg.AddNetworkList(ctx, l, rt)
			if err == nil {
				res, _ = types100.GetResult(r)
				break
			}
			// The agent may still be starting: the plugin says "try again later".
			if time.Since(start) > time.Minute || !strings.Contains(err.Error(), "not running") {
				t.Fatalf("ADD on %s: %v", n.name, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Cleanup(func() {
			if err := cniCfg.DelNetworkList(context.Background(), l, rt); err != nil {
				t.Errorf("DEL: %v", err)
			}
		})
		ips = append(ips, res.IPs[0].Address.IP.String())
		podNS = append(podNS, name)
		lists, rts = append(lists, l), append(rts, rt)
	}
	ping := func(from, to int) (int, error) {
		for try := 1; try <= 20; try++ {
			out, err := exec.Command("ip", "netns", "exec", podNS[from], "ping", "-c1", "-W1", ips[to]).CombinedOutput()
			if err == nil {
				return try, nil
			}
			if try == 20 {
				return try, fmt.Errorf("%v: %s", err, out)
			}
		}
		return 0, nil
	}
	for _, d := range [][2]int{{0, 1}, {1, 0}} {
		n, err := ping(d[0], d[1])
		if err != nil {
			t.Fatalf("pod %d -> pod %d (%s): no answer after %d pings: %v", d[0], d[1], ips[d[1]], n, err)
		}
		t.Logf("pod %d -> pod %d (%s): answered at ping %d", d[0], d[1], ips[d[1]], n)
	}

	// A pod of another subnet on node 1 is reached from node 0's pod through
	// the VPC's divider.
	{
		other := "sn2-" + sfx
		if _, err := api.Subnets().Create(ctx, &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: other}, Spec: v1alpha1.SubnetSpec{VPC: vpc, CIDR: "10.88.2.0/24"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		l, err := libcni.ConfListFromBytes(fmt.Appendf(nil, `{"cniVersion": "1.1.0", "name": "other", "plugins": [{"type": "mizar",
			"vpc": %q, "subnet": %q, "agentSocket": %q, "deleteQueue": %q}]}`, vpc, other, nodes[1].socket, nodes[1].queue))
		if err != nil {
			t.Fatal(err)
		}
		name := "mzt-pod3-" + sfx
		rt := &libcni.RuntimeConf{ContainerID: "ctr-" + name, NetNS: netnsAdd(t, name), IfName: "eth0"}
		r, err := cniCfg.AddNetworkList(ctx, l, rt)
		if err != nil {
			t.Fatalf("ADD into the second subnet: %v", err)
		}
		t.Cleanup(func() {
			if err := cniCfg.DelNetworkList(context.Background(), l, rt); err != nil {
				t.Errorf("DEL: %v", err)
			}
		})
		res, _ := types100.GetResult(r)
		dst := res.IPs[0].Address.IP.String()
		if out, err := exec.Command("ip", "netns", "exec", podNS[0], "ping", "-c1", "-W2", dst).CombinedOutput(); err != nil {
			t.Errorf("pod 0 (subnet 1, node 0) -> %s (subnet 2, node 1): %v\n%s", dst, err, out)
		}
	}

	// TCP across nodes, both ways: 4 MiB, checked by hash.
	tcpTransfer(t, "/run/netns/"+podNS[0], "/run/netns/"+podNS[1], ips[1])
	tcpTransfer(t, "/run/netns/"+podNS[1], "/run/netns/"+podNS[0], ips[0])

	// A second VPC with the same CIDR stays apart: its pod on node 1 does not
	// reach the first VPC's pod there (same address space, other VNI).
	{
		vpc2, sn := "vpc2-"+sfx, "sn-vpc2-"+sfx
		if _, err := api.Vpcs().Create(ctx, &v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: vpc2}, Spec: v1alpha1.VpcSpec{CIDR: "10.88.0.0/16"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := api.Subnets().Create(ctx, &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: sn}, Spec: v1alpha1.SubnetSpec{VPC: vpc2, CIDR: "10.88.1.0/24"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		l, err := libcni.ConfListFromBytes(fmt.Appendf(nil, `{"cniVersion": "1.1.0", "name": "vpc2", "plugins": [{"type": "mizar",
			"vpc": %q, "subnet": %q, "agentSocket": %q, "deleteQueue": %q}]}`, vpc2, sn, nodes[1].socket, nodes[1].queue))
		if err != nil {
			t.Fatal(err)
		}
		name := "mzt-pod4-" + sfx
		rt := &libcni.RuntimeConf{ContainerID: "ctr-" + name, NetNS: netnsAdd(t, name), IfName: "eth0"}
		if _, err := cniCfg.AddNetworkList(ctx, l, rt); err != nil {
			t.Fatalf("ADD into the second VPC: %v", err)
		}
		t.Cleanup(func() {
			if err := cniCfg.DelNetworkList(context.Background(), l, rt); err != nil {
				t.Errorf("DEL: %v", err)
			}
		})
		for _, dst := range ips {
			if err := exec.Command("ip", "netns", "exec", name, "ping", "-c2", "-W1", dst).Run(); err == nil {
				t.Errorf("a pod of VPC %s reached %s of VPC %s", vpc2, dst, vpc)
			}
		}
	}

	// A second pod on node 0 reaches the first locally.
	{
		name := "mzt-pod2-" + sfx
		path := netnsAdd(t, name)
		rt := &libcni.RuntimeConf{ContainerID: "ctr-" + name, NetNS: path, IfName: "eth0"}
		if _, err := cniCfg.AddNetworkList(ctx, lists[0], rt); err != nil {
			t.Fatalf("ADD of a second pod on node 0: %v", err)
		}
		t.Cleanup(func() {
			if err := cniCfg.DelNetworkList(context.Background(), lists[0], rt); err != nil {
				t.Errorf("DEL: %v", err)
			}
		})
		if out, err := exec.Command("ip", "netns", "exec", name, "ping", "-c1", "-W2", ips[0]).CombinedOutput(); err != nil {
			t.Errorf("pod on node 0 -> its neighbour pod %s: %v\n%s", ips[0], err, out)
		}
	}

	// Restart node 0's agent while pod 1 pings pod 0 every 20 ms: the pinned
	// maps and links are adopted, no packet is lost, nothing is attached twice.
	pings := exec.Command("ip", "netns", "exec", podNS[1], "ping", "-q", "-i", "0.02", "-c", "150", "-W", "1", ips[0])
	out := make(chan string, 1)
	go func() {
		b, _ := pings.CombinedOutput()
		out <- string(b)
	}()
	time.Sleep(500 * time.Millisecond)
	linksBefore, _ := nodes[0].opts.linkCount()
	stop(nodes[0])
	start(nodes[0])
	summary := <-out
	if !strings.Contains(summary, " 0% packet loss") {
		t.Errorf("pings across the agent restart lost packets:\n%s", summary)
	}
	if after, err := nodes[0].opts.linkCount(); err != nil || after != linksBefore {
		t.Errorf("pinned links %d before the restart, %d after (%v)", linksBefore, after, err)
	}

	// Kill node 0's agent, delete its pod meanwhile (the DEL is queued), start
	// it: the pod's veth, program and endpoint go.
	stop(nodes[0])
	if err := cniCfg.DelNetworkList(ctx, lists[0], rts[0]); err != nil {
		t.Fatalf("DEL with the agent down: %v", err)
	}
	start(nodes[0])
	id := attachmentID(rts[0].ContainerID, rts[0].IfName)
	epName, hostIf := names(id)
	nodeH := handle(t, nodes[0].path)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, linkErr := nodeH.LinkByName(hostIf)
		_, epErr := api.Endpoints("default").Get(ctx, epName, metav1.GetOptions{})
		if linkErr != nil && apierrors.IsNotFound(epErr) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the restart the queued DEL left veth (%v) or endpoint (%v)", linkErr, epErr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// linkCount counts the links pinned under the agent's pin root.
func (o *NodeOptions) linkCount() (int, error) {
	n := 0
	dirs, err := os.ReadDir(filepath.Join(o.PinRoot, "links"))
	if err != nil {
		return 0, err
	}
	for _, d := range dirs {
		pins, err := os.ReadDir(filepath.Join(o.PinRoot, "links", d.Name()))
		if err != nil {
			return 0, err
		}
		n += len(pins)
	}
	return n, nil
}

// tcpTransfer sends 4 MiB from a socket in netns from to addr:7777 served in
// netns to, and compares hashes.
func tcpTransfer(t *testing.T, from, to, addr string) {
	t.Helper()
	sink, err := nettest.ListenHash(to, addr+":7777", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	data := make([]byte, 4<<20)
	_, _ = rand.Read(data)
	want := sha256.Sum256(data)
	if err := ns.WithNetNSPath(from, func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp4", addr+":7777", 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		_, err = c.Write(data)
		return err
	}); err != nil {
		t.Fatalf("TCP %s -> %s: %v", from, addr, err)
	}
	if h := sink.Sum(); h != hex.EncodeToString(want[:]) {
		t.Errorf("TCP %s -> %s: received hash %s, sent %x", from, addr, h, want)
	}
}

// wireFeatures turn a veth into what a NIC puts on a wire: no segmentation or
// checksum left to the receiver.
var wireFeatures = map[string]bool{
	"tx-checksum-ip-generic": false, "tx-tcp-segmentation": false, "tx-tcp6-segmentation": false,
	"tx-generic-segmentation": false, "tx-udp_tnl-segmentation": false, "tx-udp_tnl-csum-segmentation": false,
}

// cluster is droplets on a bridged underlay, each a netns running the real
// agent (NodeOptions.Run, as cmd/nodeagent does) as its own identity, with
// the plugin binary built for libcni.
type cluster struct {
	tb    testing.TB
	sfx   string
	dir   string
	cni   *libcni.CNIConfig
	srv   *apiservertest.Server
	ctx   context.Context
	nodes []*clusterNode
}

type clusterNode struct {
	name, path, socket, queue string
	opts                      *NodeOptions
	cancel                    context.CancelFunc
	done                      chan error
}

func (c *cluster) start(n *clusterNode) {
	nctx, ncancel := context.WithCancel(c.ctx)
	n.cancel, n.done = ncancel, make(chan error, 1)
	go func() { n.done <- n.opts.Run(nctx) }()
}

func (c *cluster) stop(n *clusterNode) {
	n.cancel()
	if err := <-n.done; err != nil && !errors.Is(err, context.Canceled) {
		c.tb.Errorf("agent %s: %v", n.name, err)
	}
}

func newCluster(t testing.TB, count int) *cluster {
	requireRoot(t)
	sfx := suffix(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "mizar"), "mizar.dev/cmd/cni").CombinedOutput(); err != nil {
		t.Fatalf("building the plugin: %v\n%s", err, out)
	}
	cniCfg := libcni.NewCNIConfigWithCacheDir([]string{bin}, filepath.Join(dir, "cache"), nil)
	srv := apiservertest.Start(t, t.TempDir(), "--operators=true")
	ctx, cancel := context.WithCancel(context.Background())

	brPath := netnsAdd(t, "mzt-ul-"+sfx)
	brH := handle(t, brPath)
	if err := brH.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}); err != nil {
		t.Fatal(err)
	}
	br, _ := brH.LinkByName("br0")
	if err := brH.LinkSetUp(br); err != nil {
		t.Fatal(err)
	}
	brNS, err := netns.GetFromPath(brPath)
	if err != nil {
		t.Fatal(err)
	}
	defer brNS.Close()

	var nodes []*clusterNode
	c := &cluster{tb: t, sfx: sfx, dir: dir, cni: cniCfg, srv: srv, ctx: ctx}
	start, stop := c.start, c.stop
	for i := 1; i <= count; i++ {
		n := &clusterNode{name: fmt.Sprintf("n%d-%s", i, sfx), path: netnsAdd(t, fmt.Sprintf("mzt-n%d-%s", i, sfx)),
			socket: filepath.Join(dir, fmt.Sprintf("n%d.sock", i)), queue: filepath.Join(dir, fmt.Sprintf("q%d", i))}
		h := handle(t, n.path)
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", MTU: 1500}, PeerName: fmt.Sprintf("p%d", i),
			PeerNamespace: netlink.NsFd(int(brNS))}); err != nil {
			t.Fatal(err)
		}
		l, _ := h.LinkByName("eth0")
		if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipnet(netip.MustParsePrefix(fmt.Sprintf("198.18.9.%d/24", i)))}); err != nil {
			t.Fatal(err)
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
		// The underlay veths act as a NIC on a wire: segmentation and checksums
		// done before they leave (see pkg/dataplane's wireFeatures).
		for _, side := range []struct{ ns, ifname string }{{n.path, "eth0"}, {brPath, fmt.Sprintf("p%d", i)}} {
			if err := ns.WithNetNSPath(side.ns, func(ns.NetNS) error { return dataplane.SetFeatures(side.ifname, wireFeatures) }); err != nil {
				t.Fatal(err)
			}
		}
		p, _ := brH.LinkByName(fmt.Sprintf("p%d", i))
		if err := brH.LinkSetMaster(p, br); err != nil {
			t.Fatal(err)
		}
		if err := brH.LinkSetUp(p); err != nil {
			t.Fatal(err)
		}
		if err := dataplane.MountBPFFS("/sys/fs/bpf"); err != nil {
			t.Fatal(err)
		}
		pins := "/sys/fs/bpf/mizar-test-node-" + n.name
		t.Cleanup(func() {
			if err := dataplane.Purge(pins); err != nil {
				t.Errorf("purge %s: %v", pins, err)
			}
		})
		o := NewNodeOptions()
		// The droplet's own identity, as in production: it may write only its
		// own droplet's objects (the CNI server's endpoints among them).
		kc := filepath.Join(dir, n.name+".kubeconfig")
		if err := apiserver.IssueDropletKubeconfig(srv.DataDir, n.name, kc); err != nil {
			t.Fatal(err)
		}
		o.Kubeconfig, o.Droplet, o.NodeName, o.PinRoot, o.XDPGeneric = kc, n.name, n.name, pins, true
		o.CNISocket, o.DeleteQueue, o.StateDir, o.HealthAddr, o.HostNetns, o.Underlay = n.socket, n.queue, filepath.Join(dir, "state-"+n.name), "", n.path, "eth0"
		n.opts = o
		start(n)
		nodes = append(nodes, n)
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			stop(n)
		}
		cancel()
	})
	c.nodes = nodes
	return c

}

// BenchmarkCNIAddNodes measures ADD latency of 100 pods spread over 3 and over
// 6 droplets in one run: the ratio shows whether an ADD costs more as the
// cluster grows. Run with:
// go test -run '^$' -bench CNIAddNodes -benchtime 1x ./pkg/nodeagent
func BenchmarkCNIAddNodes(b *testing.B) {
	p50 := map[int]time.Duration{}
	for _, count := range []int{3, 6} {
		c := newCluster(b, count)
		api := c.srv.Client.NetworkingV1alpha1()
		vpc, subnet := "vpc-"+c.sfx, "sn-"+c.sfx
		if _, err := api.Vpcs().Create(c.ctx, &v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: vpc}, Spec: v1alpha1.VpcSpec{CIDR: "10.90.0.0/16"}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		if _, err := api.Subnets().Create(c.ctx, &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: subnet}, Spec: v1alpha1.SubnetSpec{VPC: vpc, CIDR: "10.90.1.0/24"}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		var lat []time.Duration
		for i := range 100 {
			n := c.nodes[i%count]
			l, err := libcni.ConfListFromBytes(fmt.Appendf(nil, `{"cniVersion": "1.1.0", "name": "mizar", "plugins": [{"type": "mizar",
				"vpc": %q, "subnet": %q, "agentSocket": %q, "deleteQueue": %q}]}`, vpc, subnet, n.socket, n.queue))
			if err != nil {
				b.Fatal(err)
			}
			name := fmt.Sprintf("mzt-b%d-%d-%s", count, i, c.sfx)
			rt := &libcni.RuntimeConf{ContainerID: "ctr-" + name, NetNS: netnsAdd(b, name), IfName: "eth0"}
			for waited := 0; ; waited++ {
				start := time.Now()
				_, err := c.cni.AddNetworkList(c.ctx, l, rt)
				if err == nil {
					lat = append(lat, time.Since(start))
					break
				}
				// Only the first ADDs may find an agent still starting.
				if waited > 100 || !strings.Contains(err.Error(), "not running") || len(lat) > 0 {
					b.Fatalf("ADD: %v", err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			b.Cleanup(func() { _ = c.cni.DelNetworkList(context.Background(), l, rt) })
		}
		slices.Sort(lat)
		p50[count] = lat[len(lat)/2]
		b.ReportMetric(float64(p50[count].Microseconds())/1000, fmt.Sprintf("nodes%d-p50-ms", count))
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, fmt.Sprintf("nodes%d-p99-ms", count))
	}
	b.ReportMetric(float64(p50[6])/float64(p50[3]), "p50-6/3-nodes")
}
