package podnet

import (
	"context"
	"crypto/rand"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/safchain/ethtool"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/dataplane"
	"mizar.dev/pkg/generated/clientset/versioned"
	"mizar.dev/test/ci"
	"mizar.dev/test/cluster"
)

// requireRoot skips without root, and fails instead under CI=true.
func requireRoot(t testing.TB) {
	t.Helper()
	ci.RequireRoot(t, "network namespaces, veths, XDP and TC programs")
}

// podCluster is the local cluster of hack/up.sh, made of the same processes:
// a standalone mizar-apiserver, an underlay bridge in its own netns, and nodes
// that are network namespaces, each with its own mizar-nodeagent (running in
// the host, programming its node through --host-netns) and droplet identity.
// Every name (netns, link, pin) starts with a random prefix, so it coexists
// with `make up` and other tests.
type podCluster struct {
	t      testing.TB
	prefix string
	dir    string
	bin    string // nodeagent, cnitool; cni/ is CNI_PATH
	server string // mizar-apiserver binary
	api    versioned.Interface
	apisrv *cluster.Proc
	nodes  []*node
	netns  []string // every netns made, deleted at the end
	pods   []*pod   // their libcni result caches go at the end
	cni    *libcni.CNIConfig
}

type node struct {
	name   string // droplet and Kubernetes node name
	ns     string // netns name
	ip     string
	dir    string
	netd   string // NETCONFPATH
	socket string
	queue  string
	state  string
	pins   string
	health string // --health-addr of its agent ("": none)
	agent  *cluster.Proc
}

// Networks every node's NETCONFPATH holds: conflist name -> vpc, subnet.
var networks = map[string][2]string{
	"a1": {"vpc-a", "a1"}, "a2": {"vpc-a", "a2"}, "a3": {"vpc-a", "a3"}, "b1": {"vpc-b", "b1"},
}

func build(t testing.TB, out, pkg string) {
	t.Helper()
	if b, err := exec.Command("go", "build", "-o", out, pkg).CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
}

func newPodCluster(t testing.TB, nodes int) *podCluster {
	requireRoot(t)
	var r [2]byte
	_, _ = rand.Read(r[:])
	c := &podCluster{t: t, prefix: "mzpn" + hex.EncodeToString(r[:]), dir: t.TempDir()}
	c.bin = filepath.Join(c.dir, "bin")
	build(t, filepath.Join(c.bin, "mizar-nodeagent"), "mizar.dev/cmd/nodeagent")
	build(t, filepath.Join(c.bin, "cni", "mizar"), "mizar.dev/cmd/cni")
	build(t, filepath.Join(c.bin, "cnitool"), "github.com/containernetworking/cni/cnitool")
	var err error
	if c.server, err = cluster.MizarAPIServer(c.bin); err != nil {
		t.Fatal(err)
	}
	// The default cache dir, as cnitool's: CHECK and GC see its ADDs.
	c.cni = libcni.NewCNIConfig([]string{filepath.Join(c.bin, "cni")}, nil)
	t.Cleanup(c.teardown)

	data := filepath.Join(c.dir, "apiserver")
	c.apisrv, err = cluster.StartProc("mizar-apiserver", filepath.Join(c.dir, "apiserver.log"),
		exec.Command(c.server, "--standalone", "--data-dir", data, "--secure-port", "0"))
	if err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(data, "kubeconfig")
	c.waitFor("mizar-apiserver ready", 60*time.Second, func() error {
		if c.apisrv.Exited() {
			t.Fatalf("mizar-apiserver exited: %v\n%s", c.apisrv.Err(), c.apisrv.Tail(20))
		}
		cfg, err := clientcmd.BuildConfigFromFlags("", kc)
		if err != nil {
			return err
		}
		api, err := versioned.NewForConfig(cfg)
		if err != nil {
			return err
		}
		if _, err := api.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(context.Background()); err != nil {
			return err
		}
		c.api = api
		return nil
	})

	ul := c.prefix + "-ul"
	c.ip("netns", "add", ul)
	c.netns = append(c.netns, ul)
	c.ip("-n", ul, "link", "add", "br0", "type", "bridge")
	c.ip("-n", ul, "link", "set", "br0", "up")
	if err := dataplane.MountBPFFS("/sys/fs/bpf"); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= nodes; i++ {
		n := &node{name: fmt.Sprintf("%s-n%d", c.prefix, i), ns: fmt.Sprintf("%s-n%d", c.prefix, i), ip: fmt.Sprintf("198.19.0.%d", i)}
		n.dir = filepath.Join(c.dir, n.name)
		n.netd, n.socket, n.queue, n.state = filepath.Join(n.dir, "net.d"), filepath.Join(n.dir, "cni.sock"), filepath.Join(n.dir, "queue"), filepath.Join(n.dir, "state")
		n.pins = "/sys/fs/bpf/" + n.name
		if err := os.MkdirAll(n.netd, 0o755); err != nil {
			t.Fatal(err)
		}
		peer := fmt.Sprintf("%sn%d", c.prefix, i)
		c.ip("netns", "add", n.ns)
		c.netns = append(c.netns, n.ns)
		c.ip("link", "add", "eth0", "netns", n.ns, "type", "veth", "peer", "name", peer, "netns", ul)
		c.ip("-n", n.ns, "addr", "add", n.ip+"/24", "dev", "eth0")
		c.ip("-n", n.ns, "link", "set", "eth0", "up")
		c.ip("-n", n.ns, "link", "set", "lo", "up")
		c.ip("-n", ul, "link", "set", peer, "master", "br0", "up")
		// The veths keep the kernel's offloads, as kind's nodes do: the
		// agent turns off what its peer's XDP program cannot finish.
		c.run(c.server, "droplet-kubeconfig", "--data-dir", data, "--droplet", n.name, "--out", filepath.Join(n.dir, "kubeconfig"))
		for name, placement := range networks {
			c.writeConflist(n, name, fmt.Sprintf(`{"cniVersion": "1.1.0", "name": %q, "plugins": [{"type": "mizar", "vpc": %q, "subnet": %q, "agentSocket": %q, "deleteQueue": %q}]}`,
				name, placement[0], placement[1], n.socket, n.queue))
		}
		c.nodes = append(c.nodes, n)
	}
	return c
}

func (c *podCluster) writeConflist(n *node, name, conf string) {
	c.t.Helper()
	if err := os.WriteFile(filepath.Join(n.netd, "10-"+name+".conflist"), []byte(conf), 0o644); err != nil {
		c.t.Fatal(err)
	}
}

// startAgent starts n's mizar-nodeagent, with extra flags if given, and
// waits until its droplet is Provisioned and its CNI socket answers STATUS.
func (c *podCluster) startAgent(n *node, extra ...string) {
	c.t.Helper()
	var err error
	args := append([]string{"--kubeconfig", filepath.Join(n.dir, "kubeconfig"), "--droplet", n.name, "--node-name", n.name,
		"--host-netns", "/run/netns/" + n.ns, "--underlay", "eth0", "--xdp-generic", "--pin-root", n.pins,
		"--cni-socket", n.socket, "--cni-delete-queue", n.queue, "--cni-state-dir", n.state,
		"--health-addr", n.health}, extra...)
	n.agent, err = cluster.StartProc("mizar-nodeagent "+n.name, filepath.Join(n.dir, fmt.Sprintf("nodeagent-%d.log", time.Now().UnixNano())),
		exec.Command(filepath.Join(c.bin, "mizar-nodeagent"), args...))
	if err != nil {
		c.t.Fatal(err)
	}
	start := time.Now()
	c.waitFor("agent "+n.name+" serving", 60*time.Second, func() error {
		if n.agent.Exited() {
			c.t.Fatalf("mizar-nodeagent %s exited: %v\n%s", n.name, n.agent.Err(), n.agent.Tail(20))
		}
		if _, err := c.cnitool(n, "status", "a1", "/run/netns/"+n.ns); err != nil {
			return err
		}
		d, err := c.api.NetworkingV1alpha1().Droplets().Get(context.Background(), n.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.Phase != v1alpha1.PhaseProvisioned {
			return fmt.Errorf("droplet is %q", d.Status.Phase)
		}
		return nil
	})
	c.t.Logf("agent %s ready in %v", n.name, time.Since(start).Round(time.Millisecond))
	c.checkWireFrames(n)
}

// checkWireFrames: the agent turned off, on its veth underlay, the offloads
// its peers' underlay programs cannot finish (without it, cross-node TCP
// stalls once its window grows).
func (c *podCluster) checkWireFrames(n *node) {
	c.t.Helper()
	var have map[string]bool
	err := ns.WithNetNSPath("/run/netns/"+n.ns, func(ns.NetNS) error {
		e, err := ethtool.NewEthtool()
		if err != nil {
			return err
		}
		defer e.Close()
		have, err = e.Features("eth0")
		return err
	})
	if err != nil {
		c.t.Fatalf("reading eth0's features on %s: %v", n.name, err)
	}
	for f := range dataplane.WireFeatures {
		if have[f] {
			c.t.Errorf("%s: %s is still on on the veth underlay after the agent started", n.name, f)
		}
	}
}

func (c *podCluster) stopAgent(n *node) {
	c.t.Helper()
	if err := n.agent.Stop(); err != nil {
		c.t.Errorf("stopping the agent of %s: %v\n%s", n.name, err, n.agent.Tail(20))
	}
}

func (c *podCluster) teardown() {
	for _, n := range c.nodes {
		if n.agent != nil {
			if err := n.agent.Stop(); err != nil {
				c.t.Errorf("agent %s: %v", n.name, err)
			}
			if c.t.Failed() {
				c.t.Logf("agent %s: %s", n.name, n.agent.Tail(30))
			}
		}
	}
	if c.apisrv != nil {
		if err := c.apisrv.Stop(); err != nil {
			c.t.Errorf("mizar-apiserver: %v", err)
		}
	}
	for i := len(c.netns) - 1; i >= 0; i-- {
		if out, err := exec.Command("ip", "netns", "del", c.netns[i]).CombinedOutput(); err != nil && !strings.Contains(string(out), "No such file") {
			c.t.Errorf("ip netns del %s: %v: %s", c.netns[i], err, out)
		}
	}
	for _, n := range c.nodes {
		if err := dataplane.Purge(n.pins); err != nil {
			c.t.Errorf("purge %s: %v", n.pins, err)
		}
	}
	// cnitool caches results in libcni's default directory (it has no
	// option for another); pods never deleted leave theirs.
	for _, p := range c.pods {
		files, _ := filepath.Glob(filepath.Join(libcni.CacheDir, "results", "*-"+p.runtimeConf().ContainerID+"-*"))
		for _, f := range files {
			if err := os.Remove(f); err != nil {
				c.t.Error(err)
			}
		}
	}
}

func (c *podCluster) run(name string, args ...string) string {
	c.t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		c.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (c *podCluster) ip(args ...string) { c.t.Helper(); c.run("ip", args...) }

func (c *podCluster) waitFor(what string, timeout time.Duration, f func() error) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cnitool runs the real cnitool against n's NETCONFPATH and CNI_PATH.
func (c *podCluster) cnitool(n *node, cmd, network, netns string, env ...string) (string, error) {
	tool := exec.Command(filepath.Join(c.bin, "cnitool"), cmd, network, netns)
	tool.Env = append(os.Environ(), append([]string{"NETCONFPATH=" + n.netd, "CNI_PATH=" + filepath.Join(c.bin, "cni")}, env...)...)
	out, err := tool.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("cnitool %s %s %s on %s: %w: %s", cmd, network, netns, n.name, err, out)
	}
	return string(out), nil
}

// pod is a network namespace attached to a mizar network by cnitool.
type pod struct {
	name, netns, path string
	node              *node
	network           string
	ip                string
}

// newPod makes the pod's netns (removed at the end).
func (c *podCluster) newPod(n *node, name, network string) *pod {
	c.t.Helper()
	p := &pod{name: name, netns: c.prefix + "-" + name, node: n, network: network}
	p.path = "/run/netns/" + p.netns
	c.ip("netns", "add", p.netns)
	c.netns = append(c.netns, p.netns)
	c.pods = append(c.pods, p)
	c.ip("-n", p.netns, "link", "set", "lo", "up")
	return p
}

// add runs cnitool add and records the pod's address.
func (c *podCluster) add(p *pod) error {
	out, err := c.cnitool(p.node, "add", p.network, p.path, "CNI_ARGS=K8S_POD_NAMESPACE=default;K8S_POD_NAME="+p.name)
	if err != nil {
		return err
	}
	var res types100.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.IPs) != 1 {
		return fmt.Errorf("cnitool add %s printed %q (%v)", p.name, out, err)
	}
	p.ip = res.IPs[0].Address.IP.String()
	return nil
}

// addPod makes a pod and adds it, failing the test on error.
func (c *podCluster) addPod(n *node, name, network string) *pod {
	c.t.Helper()
	p := c.newPod(n, name, network)
	start := time.Now()
	if err := c.add(p); err != nil {
		c.t.Fatal(err)
	}
	c.t.Logf("pod %s on %s in %s: %s (ADD %v)", name, n.name, network, p.ip, time.Since(start).Round(time.Millisecond))
	return p
}

func (c *podCluster) del(p *pod) {
	c.t.Helper()
	if _, err := c.cnitool(p.node, "del", p.network, p.path); err != nil {
		c.t.Fatal(err)
	}
}

// runtimeConf is what cnitool used for p: libcni calls on it address the
// same attachment (and its cached result).
func (p *pod) runtimeConf() *libcni.RuntimeConf {
	s := sha512.Sum512([]byte(p.path))
	return &libcni.RuntimeConf{ContainerID: fmt.Sprintf("cnitool-%x", s[:10]), NetNS: p.path, IfName: "eth0",
		Args: [][2]string{{"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", p.name}}}
}

func (c *podCluster) conflist(n *node, network string) *libcni.NetworkConfigList {
	c.t.Helper()
	l, err := libcni.LoadConfList(n.netd, network)
	if err != nil {
		c.t.Fatal(err)
	}
	return l
}

// ping sends count pings from p to ip, each waiting up to a second.
func ping(p *pod, ip string, count int) error {
	out, err := exec.Command("ip", "netns", "exec", p.netns, "ping", "-n", "-q", "-c", fmt.Sprint(count), "-W", "1", "-i", "0.2", ip).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ping %s -> %s: %w: %s", p.name, ip, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// footprint is what an attachment leaves on a node: links in its netns,
// attachment records, and endpoints in the API.
type footprint struct {
	links, states, endpoints int
}

func (c *podCluster) footprint(n *node) footprint {
	c.t.Helper()
	var f footprint
	out := c.run("ip", "-n", n.ns, "-o", "link", "show")
	f.links = strings.Count(out, "\n")
	entries, err := os.ReadDir(n.state)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		c.t.Fatal(err)
	}
	f.states = len(entries)
	eps, err := c.api.NetworkingV1alpha1().Endpoints(metav1.NamespaceAll).List(context.Background(), metav1.ListOptions{FieldSelector: "spec.droplet=" + n.name})
	if err != nil {
		c.t.Fatal(err)
	}
	f.endpoints = len(eps.Items)
	return f
}

// hasLink reports whether the pod's netns has eth0.
func (c *podCluster) hasEth0(p *pod) bool {
	return exec.Command("ip", "-n", p.netns, "link", "show", "eth0").Run() == nil
}

// createVPC creates a VPC and its subnets (name, CIDR) one at a time, each
// placed before the next, and waits until all are Provisioned. The operator
// puts an object on the least loaded droplet (ties by name), so the same
// calls on the same nodes give the same placement every run. It returns
// the droplet of the VPC's divider and of each subnet's bouncer.
func (c *podCluster) createVPC(vpc, cidr string, subnets ...[2]string) (divider string, bouncers map[string]string) {
	c.t.Helper()
	ctx := context.Background()
	api := c.api.NetworkingV1alpha1()
	placed := func(kind, name string, get func() (string, error)) string {
		var d string
		c.waitFor(kind+" of "+name+" placed", 30*time.Second, func() error {
			var err error
			if d, err = get(); err == nil && d == "" {
				err = errors.New("not yet")
			}
			return err
		})
		return d
	}
	if _, err := api.Vpcs().Create(ctx, &v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: vpc}, Spec: v1alpha1.VpcSpec{CIDR: cidr}}, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	divider = placed("divider", vpc, func() (string, error) {
		l, err := api.Dividers().List(ctx, metav1.ListOptions{FieldSelector: "spec.vpc=" + vpc})
		if err != nil || len(l.Items) == 0 {
			return "", err
		}
		return l.Items[0].Spec.Droplet, nil
	})
	bouncers = map[string]string{}
	for _, sn := range subnets {
		if _, err := api.Subnets().Create(ctx, &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: sn[0]}, Spec: v1alpha1.SubnetSpec{VPC: vpc, CIDR: sn[1]}}, metav1.CreateOptions{}); err != nil {
			c.t.Fatal(err)
		}
		bouncers[sn[0]] = placed("bouncer", sn[0], func() (string, error) {
			l, err := api.Bouncers().List(ctx, metav1.ListOptions{FieldSelector: "spec.subnet=" + sn[0]})
			if err != nil || len(l.Items) == 0 {
				return "", err
			}
			return l.Items[0].Spec.Droplet, nil
		})
	}
	c.waitFor("VPC "+vpc+" and its subnets Provisioned", 60*time.Second, func() error {
		if o, err := api.Vpcs().Get(ctx, vpc, metav1.GetOptions{}); err != nil || o.Status.Phase != v1alpha1.PhaseProvisioned {
			return fmt.Errorf("VPC %s not Provisioned (%v)", vpc, err)
		}
		for _, sn := range subnets {
			if o, err := api.Subnets().Get(ctx, sn[0], metav1.GetOptions{}); err != nil || o.Status.Phase != v1alpha1.PhaseProvisioned {
				return fmt.Errorf("subnet %s not Provisioned (%v)", sn[0], err)
			}
		}
		return nil
	})
	return divider, bouncers
}
