package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/pkg/dataplane"
)

// Two droplets on a bridged underlay, each a netns running the real agent
// (NodeOptions.Run, as cmd/nodeagent does); pods added through the plugin
// binary and libcni on each; they ping each other across the overlay.
func TestTwoNodesPodsPing(t *testing.T) {
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

	type node struct{ name, path, socket, queue string }
	var nodes []node
	done := make(chan error, 2)
	for i := 1; i <= 2; i++ {
		n := node{name: fmt.Sprintf("n%d-%s", i, sfx), path: netnsAdd(t, fmt.Sprintf("mzt-n%d-%s", i, sfx)),
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
		o.Kubeconfig, o.Droplet, o.Node, o.PinRoot, o.XDPGeneric = srv.Kubeconfig, n.name, n.name, pins, true
		o.CNISocket, o.DeleteQueue, o.StateDir, o.HealthAddr, o.HostNetns, o.Underlay = n.socket, n.queue, filepath.Join(dir, "state-"+n.name), "", n.path, "eth0"
		go func() { done <- o.Run(ctx) }()
		nodes = append(nodes, n)
	}
	t.Cleanup(func() {
		cancel()
		for range nodes {
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("agent: %v", err)
			}
		}
	})

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
}
