package nodeagent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/pkg/cni"
	"mizar.dev/pkg/dataplane"
	"mizar.dev/test/ci"
)

func requireRoot(t testing.TB) {
	t.Helper()
	ci.RequireRoot(t, "creates network namespaces, veths and BPF attachments")
}

func suffix(t testing.TB) string {
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// netnsAdd creates a named netns, deleted when the test ends (with every
// link in it).
func netnsAdd(t testing.TB, name string) string {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if _, err := os.Stat("/run/netns/" + name); errors.Is(err, os.ErrNotExist) {
			return // the test removed it
		}
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	return "/run/netns/" + name
}

func handle(t testing.TB, path string) *netlink.Handle {
	t.Helper()
	h, err := handleAt(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

type cniEnv struct {
	t        testing.TB
	sfx      string
	cni      *libcni.CNIConfig
	socket   string
	queue    string
	node     string // host netns path
	nodeH    *netlink.Handle
	srv      *CNIServer
	dp       *dataplane.Datapath
	client   *apiservertest.Server
	vpc      string
	subnet   string
	tiny     string // a /29: few addresses
	stateDir string
	bin      string // CNI_PATH holding the plugin
}

// newCNIEnv starts a real mizar-apiserver with its operators, a node netns
// with an underlay interface, the real datapath's pod side, an agent for the
// droplet's API side (over a Recorder: the host/bouncer maps are not what is
// tested here), and the CNI server on its socket; the plugin binary is built
// and driven through libcni.
func newCNIEnv(t testing.TB, opts ...func(*CNIOptions)) *cniEnv {
	requireRoot(t)
	e := &cniEnv{t: t, sfx: suffix(t)}
	dir := t.TempDir()
	e.socket, e.queue, e.stateDir = filepath.Join(dir, "cni.sock"), filepath.Join(dir, "queue"), filepath.Join(dir, "state")
	bin := filepath.Join(dir, "bin")
	e.bin = bin
	if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "mizar"), "mizar.dev/cmd/cni").CombinedOutput(); err != nil {
		t.Fatalf("building the plugin: %v\n%s", err, out)
	}
	e.cni = libcni.NewCNIConfigWithCacheDir([]string{bin}, filepath.Join(dir, "cache"), nil)

	e.node = netnsAdd(t, "mzt-node-"+e.sfx)
	e.nodeH = handle(t, e.node)
	// The underlay: one end of a veth pair (dummy devices need a module
	// this host may lack).
	ul := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ul0", MTU: 1500}, PeerName: "ul0p"}
	if err := e.nodeH.LinkAdd(ul); err != nil {
		t.Fatal(err)
	}
	ull, err := e.nodeH.LinkByName("ul0")
	if err != nil {
		t.Fatal(err)
	}
	hostIP := netip.MustParseAddr("198.18.7.1")
	if err := e.nodeH.AddrAdd(ull, &netlink.Addr{IPNet: ipnet(netip.PrefixFrom(hostIP, 24))}); err != nil {
		t.Fatal(err)
	}
	if err := e.nodeH.LinkSetUp(ull); err != nil {
		t.Fatal(err)
	}
	if err := dataplane.MountBPFFS("/sys/fs/bpf"); err != nil {
		t.Fatal(err)
	}
	pins := "/sys/fs/bpf/mizar-test-cni-" + e.sfx
	t.Cleanup(func() {
		if err := dataplane.Purge(pins); err != nil {
			t.Errorf("purge %s: %v", pins, err)
		}
	})
	e.dp, err = dataplane.Load(dataplane.Options{PinRoot: pins, UnderlayIfindex: ull.Attrs().Index, HostIP: hostIP,
		HostMAC: ull.Attrs().HardwareAddr, XDPMode: dataplane.XDPGeneric})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.dp.Close() })

	e.client = apiservertest.Start(t, t.TempDir(), "--operators=true")
	ctx, cancel := context.WithCancel(context.Background())
	droplet := "node-" + e.sfx
	agent, err := New(Options{Client: e.client.Client, Dataplane: NewRecorder(), Droplet: &v1alpha1.Droplet{
		ObjectMeta: metav1.ObjectMeta{Name: droplet},
		Spec:       v1alpha1.DropletSpec{Node: droplet, IP: hostIP.String(), MAC: ull.Attrs().HardwareAddr.String(), Interface: "ul0"}}})
	if err != nil {
		t.Fatal(err)
	}
	agentDone := make(chan error, 1)
	go func() { agentDone <- agent.Run(ctx) }()

	co := CNIOptions{Client: e.client.Client, Droplet: droplet, Pods: &DatapathPods{DP: e.dp, HostNetns: e.node},
		HostNetns: e.node, UnderlayMTU: 1500, HostIP: hostIP, StateDir: e.stateDir, ProvisionTimeout: 30 * time.Second}
	for _, o := range opts {
		o(&co)
	}
	e.srv, err = NewCNIServer(co)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := cni.Listen(e.socket)
	if err != nil {
		t.Fatal(err)
	}
	serveDone := make(chan error, 1)
	go func() { serveDone <- cni.Serve(ctx, ln, e.srv) }()
	t.Cleanup(func() {
		cancel()
		if err := <-serveDone; err != nil {
			t.Error(err)
		}
		if err := <-agentDone; err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
		e.srv.Close()
	})

	api := e.client.Client.NetworkingV1alpha1()
	e.vpc, e.subnet, e.tiny = "vpc-"+e.sfx, "sn-"+e.sfx, "tiny-"+e.sfx
	if _, err := api.Vpcs().Create(ctx, &v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: e.vpc}, Spec: v1alpha1.VpcSpec{CIDR: "10.77.0.0/16"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, cidr := range map[string]string{e.subnet: "10.77.1.0/24", e.tiny: "10.77.2.0/29"} {
		if _, err := api.Subnets().Create(ctx, &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.SubnetSpec{VPC: e.vpc, CIDR: cidr}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

func (e *cniEnv) conflist(ver, subnet string) *libcni.NetworkConfigList {
	e.t.Helper()
	l, err := libcni.ConfListFromBytes(fmt.Appendf(nil, `{"cniVersion": %q, "name": "mizar-%s", "plugins": [{"type": "mizar",
		"vpc": %q, "subnet": %q, "agentSocket": %q, "deleteQueue": %q}]}`, ver, e.sfx, e.vpc, subnet, e.socket, e.queue))
	if err != nil {
		e.t.Fatal(err)
	}
	return l
}

func (e *cniEnv) pod(name string) (*libcni.RuntimeConf, *netlink.Handle) {
	path := netnsAdd(e.t, "mzt-"+name+"-"+e.sfx)
	return &libcni.RuntimeConf{ContainerID: "ctr-" + name + "-" + e.sfx, NetNS: path, IfName: "eth0",
		Args: [][2]string{{"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", name}}}, handle(e.t, path)
}

// nothingLeft checks that an attachment left no veth, program, endpoint or state.
func (e *cniEnv) nothingLeft(rt *libcni.RuntimeConf, podH *netlink.Handle) {
	e.t.Helper()
	id := attachmentID(rt.ContainerID, rt.IfName)
	epName, hostIf := names(id)
	if _, err := e.nodeH.LinkByName(hostIf); err == nil {
		e.t.Errorf("veth %s is left on the node", hostIf)
	}
	if _, err := podH.LinkByName(rt.IfName); err == nil {
		e.t.Errorf("%s is left in the pod", rt.IfName)
	}
	if ok, err := e.srv.o.Pods.PodAttached(e.nodeH, hostIf); ok || err != nil {
		e.t.Errorf("pod program still pinned on %s (%v)", hostIf, err)
	}
	if _, err := os.Stat(e.srv.statePath(id)); !errors.Is(err, os.ErrNotExist) {
		e.t.Errorf("attachment state left: %v", err)
	}
	ep, err := e.client.Client.NetworkingV1alpha1().Endpoints("default").Get(context.Background(), epName, metav1.GetOptions{})
	if err == nil && ep.DeletionTimestamp == nil {
		e.t.Errorf("endpoint %s left, not being deleted", epName)
	} else if err != nil && !apierrors.IsNotFound(err) {
		e.t.Error(err)
	}
}

func cniCode(t *testing.T, err error) uint {
	t.Helper()
	var ce *types.Error
	if !errors.As(err, &ce) {
		t.Fatalf("want a CNI error, got %T %v", err, err)
	}
	return ce.Code
}

// Every advertised spec version: ADD returns a correct result and a
// configured pod, CHECK passes, DEL removes everything and is idempotent.
func TestCNIThroughLibcni(t *testing.T) {
	e := newCNIEnv(t)
	ctx := context.Background()
	if err := e.cni.GetStatusNetworkList(ctx, e.conflist("1.1.0", e.subnet)); err != nil {
		t.Fatalf("STATUS with the agent up: %v", err)
	}
	for _, ver := range []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(ver, func(t *testing.T) {
			e.t = t
			defer func() { e.t = t }()
			l := e.conflist(ver, e.subnet)
			rt, podH := e.pod("p" + strings.ReplaceAll(ver, ".", ""))
			start := time.Now()
			res, err := e.cni.AddNetworkList(ctx, l, rt)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			t.Logf("ADD took %v", time.Since(start))
			if res.Version() != ver {
				t.Errorf("result version %s, want %s", res.Version(), ver)
			}
			r, err := types100.GetResult(res)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.IPs) != 1 || len(r.Interfaces) != 2 || r.Interfaces[1].Sandbox != rt.NetNS || r.IPs[0].Gateway.String() != "10.77.1.1" {
				t.Fatalf("result %s", res)
			}
			if !netip.MustParsePrefix("10.77.1.0/24").Contains(netip.MustParseAddr(r.IPs[0].Address.IP.String())) {
				t.Errorf("address %s outside the subnet", r.IPs[0].Address.String())
			}
			pl, err := podH.LinkByName("eth0")
			if err != nil {
				t.Fatal(err)
			}
			addrs, _ := podH.AddrList(pl, netlink.FAMILY_V4)
			if len(addrs) != 1 || addrs[0].IPNet.String() != r.IPs[0].Address.String() || pl.Attrs().MTU != 1450 {
				t.Errorf("pod eth0: addrs %v mtu %d, want %s and 1450", addrs, pl.Attrs().MTU, r.IPs[0].Address.String())
			}
			routes, _ := podH.RouteList(pl, netlink.FAMILY_V4)
			hasDefault := false
			for _, rr := range routes {
				hasDefault = hasDefault || (rr.Dst == nil || rr.Dst.String() == "0.0.0.0/0") && rr.Gw.String() == "10.77.1.1"
			}
			if !hasDefault {
				t.Errorf("no default route via the gateway in the pod: %v", routes)
			}
			_, hostIf := names(attachmentID(rt.ContainerID, rt.IfName))
			if ok, err := e.srv.o.Pods.PodAttached(e.nodeH, hostIf); !ok || err != nil {
				t.Errorf("pod program not attached to %s (%v)", hostIf, err)
			}
			if ver != "0.3.1" {
				if err := e.cni.CheckNetworkList(ctx, l, rt); err != nil {
					t.Errorf("CHECK after ADD: %v", err)
				}
			}
			for range 2 {
				if err := e.cni.DelNetworkList(ctx, l, rt); err != nil {
					t.Fatalf("DEL: %v", err)
				}
			}
			e.nothingLeft(rt, podH)
		})
	}
	e.t = t
	// DEL without ADD.
	rt, _ := e.pod("never")
	if err := e.cni.DelNetworkList(ctx, e.conflist("1.1.0", e.subnet), rt); err != nil {
		t.Errorf("DEL without ADD: %v", err)
	}
}

// Failed ADDs: an unknown subnet and a full subnet fail with CNI errors and
// leave nothing behind.
func TestCNIFailedAddLeavesNothing(t *testing.T) {
	e := newCNIEnv(t)
	ctx := context.Background()
	rt, podH := e.pod("unknown")
	_, err := e.cni.AddNetworkList(ctx, e.conflist("1.1.0", "no-such-"+e.sfx), rt)
	if cniCode(t, err) != types.ErrInvalidNetworkConfig || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("ADD into an unknown subnet: %v, want code 7 saying it does not exist", err)
	}
	e.nothingLeft(rt, podH)

	// Fill the /29 with endpoints made through the API.
	eps := e.client.Client.NetworkingV1alpha1().Endpoints("default")
	for i := 0; ; i++ {
		_, err := eps.Create(ctx, &v1alpha1.Endpoint{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("fill-%s-%d", e.sfx, i)},
			Spec: v1alpha1.EndpointSpec{Subnet: e.tiny, Droplet: e.srv.o.Droplet, MAC: fmt.Sprintf("02:00:00:00:01:%02x", i)}}, metav1.CreateOptions{})
		if err != nil {
			if !apierrors.IsInvalid(err) || i == 0 {
				t.Fatalf("filling the /29 after %d endpoints: %v", i, err)
			}
			break
		}
	}
	tiny := e.conflist("1.1.0", e.tiny)
	rt, podH = e.pod("full")
	_, err = e.cni.AddNetworkList(ctx, tiny, rt)
	if cniCode(t, err) != cni.CodeSubnetFull {
		t.Errorf("ADD into a full subnet: %v, want code %d", err, cni.CodeSubnetFull)
	}
	e.nothingLeft(rt, podH)

	// GC removes attachments not listed as valid, keeps the listed ones.
	l := e.conflist("1.1.0", e.subnet)
	keep, keepH := e.pod("keep")
	gone, goneH := e.pod("gone")
	for _, rt := range []*libcni.RuntimeConf{keep, gone} {
		if _, err := e.cni.AddNetworkList(ctx, l, rt); err != nil {
			t.Fatalf("ADD: %v", err)
		}
	}
	// An attachment of another network on the same node: that network's
	// GC, not this one's, decides about it.
	otherNet, err := libcni.ConfListFromBytes([]byte(strings.Replace(string(l.Bytes), `"name": "mizar-`, `"name": "other-`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	other, otherH := e.pod("othernet")
	if _, err := e.cni.AddNetworkList(ctx, otherNet, other); err != nil {
		t.Fatalf("ADD on the other network: %v", err)
	}
	if err := e.cni.GCNetworkList(ctx, l, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: keep.ContainerID, IfName: keep.IfName}}}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	e.nothingLeft(gone, goneH)
	if err := e.cni.CheckNetworkList(ctx, otherNet, other); err != nil {
		t.Errorf("GC of network %s removed an attachment of network %s: CHECK says %v", l.Name, otherNet.Name, err)
	}
	if err := e.cni.GCNetworkList(ctx, otherNet, &libcni.GCArgs{}); err != nil {
		t.Fatalf("GC of the other network: %v", err)
	}
	e.nothingLeft(other, otherH)
	if err := e.cni.CheckNetworkList(ctx, l, keep); err != nil {
		t.Errorf("CHECK of the attachment GC kept: %v", err)
	}
	if _, err := keepH.LinkByName("eth0"); err != nil {
		t.Errorf("GC removed a valid attachment: %v", err)
	}
}

// A DEL while the agent is away is queued and carried out when it drains.
func TestCNIQueuedDelete(t *testing.T) {
	e := newCNIEnv(t)
	ctx := context.Background()
	l := e.conflist("1.1.0", e.subnet)
	rt, podH := e.pod("q")
	if _, err := e.cni.AddNetworkList(ctx, l, rt); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	away, err := libcni.ConfListFromBytes([]byte(strings.Replace(string(l.Bytes), e.socket, e.socket+".down", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.cni.DelNetworkList(ctx, away, rt); err != nil {
		t.Fatalf("DEL with the agent away: %v", err)
	}
	if _, err := podH.LinkByName("eth0"); err != nil {
		t.Fatalf("the pod lost eth0 before the queue was drained: %v", err)
	}
	if err := e.srv.DrainDeleteQueue(ctx, e.queue); err != nil {
		t.Fatal(err)
	}
	e.nothingLeft(rt, podH)
}

// BenchmarkCNIAdd measures ADD latency through the plugin binary and libcni,
// sequentially and 100 at once on one node, beside two baselines in the same
// run: creating the veth pair alone (pod end in its netns), the floor any
// CNI pays, and the plugin binary run for VERSION 100 at once (starting 100
// processes, which no ADD through an exec'd plugin can beat).
// Run with: go test -run '^$' -bench CNIAdd -benchtime 1x ./pkg/nodeagent
func BenchmarkCNIAdd(b *testing.B) {
	e := newCNIEnv(b)
	ctx := context.Background()
	l := e.conflist("1.1.0", e.subnet)
	const n = 100
	pct := func(d []time.Duration, p float64) time.Duration {
		slices.Sort(d)
		return d[int(float64(len(d)-1)*p)]
	}
	// Namespaces first: their creation is the runtime's cost, not the plugin's.
	mk := func(prefix string) []*libcni.RuntimeConf {
		rts := make([]*libcni.RuntimeConf, n)
		for i := range rts {
			rts[i], _ = e.pod(fmt.Sprintf("%s%d", prefix, i))
		}
		return rts
	}
	// run returns the ADDs' latencies and the API writes made per ADD (the
	// agents' and operators' included), counted before the DELs.
	run := func(rts []*libcni.RuntimeConf, concurrent bool) ([]time.Duration, float64) {
		lat := make([]time.Duration, len(rts))
		before := apiWrites(ctx, b, e.client)
		var wg sync.WaitGroup
		var failed atomic.Int32
		for i, rt := range rts {
			add := func() {
				start := time.Now()
				if _, err := e.cni.AddNetworkList(ctx, l, rt); err != nil {
					b.Errorf("ADD %s: %v", rt.ContainerID, err)
					failed.Add(1)
				}
				lat[i] = time.Since(start)
			}
			if concurrent {
				wg.Add(1)
				go func() { defer wg.Done(); add() }()
			} else {
				add()
			}
		}
		wg.Wait()
		if failed.Load() > 0 {
			b.Fatalf("%d ADDs failed", failed.Load())
		}
		// The last acknowledgements and Provisioned writes may follow the
		// ADDs' return by an ack interval: let them land before counting.
		time.Sleep(2 * DefaultAckInterval)
		writes := (apiWrites(ctx, b, e.client) - before) / float64(len(rts))
		for _, rt := range rts {
			if err := e.cni.DelNetworkList(ctx, l, rt); err != nil {
				b.Errorf("DEL: %v", err)
			}
		}
		return lat, writes
	}
	// Baseline: the veth pair alone, created the same way.
	base := make([]time.Duration, 0, n)
	for i, rt := range mk("b") {
		podNS, err := netns.GetFromPath(rt.NetNS)
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		err = e.nodeH.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("mzb%d", i)}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(podNS))})
		base = append(base, time.Since(start))
		podNS.Close()
		if err != nil {
			b.Fatal(err)
		}
	}
	// Baseline: the plugin started 100 at once doing nothing but VERSION.
	execs := make([]time.Duration, n)
	var wg sync.WaitGroup
	for i := range execs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			if _, err := e.cni.GetVersionInfo(ctx, "mizar"); err != nil {
				b.Errorf("VERSION: %v", err)
			}
			execs[i] = time.Since(start)
		}()
	}
	wg.Wait()
	b.ResetTimer()
	seq, seqWrites := run(mk("s"), false)
	conc, concWrites := run(mk("c"), true)
	b.StopTimer()
	bp50 := pct(base, .5)
	ep50, ep99 := pct(execs, .5), pct(execs, .99)
	b.ReportMetric(float64(ep50.Microseconds())/1000, "exec100-p50-ms")
	b.ReportMetric(float64(ep99.Microseconds())/1000, "exec100-p99-ms")
	b.ReportMetric(float64(pct(conc, .5))/float64(ep50), "conc100-p50/exec100-p50")
	for _, m := range []struct {
		name string
		d    []time.Duration
	}{{"seq", seq}, {"conc100", conc}} {
		p50, p99 := pct(m.d, .5), pct(m.d, .99)
		b.ReportMetric(float64(p50.Microseconds())/1000, m.name+"-p50-ms")
		b.ReportMetric(float64(p99.Microseconds())/1000, m.name+"-p99-ms")
		b.ReportMetric(float64(p50)/float64(bp50), m.name+"-p50/veth-p50")
	}
	b.ReportMetric(float64(bp50.Microseconds())/1000, "veth-p50-ms")
	b.ReportMetric(seqWrites, "seq-writes/add")
	b.ReportMetric(concWrites, "conc100-writes/add")
}

// apiWrites is the number of mutating requests the server has answered
// (apiserver_request_total for POST, PUT, PATCH and DELETE).
func apiWrites(ctx context.Context, t testing.TB, s *apiservertest.Server) float64 {
	t.Helper()
	raw, err := s.Client.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatalf("reading the server's metrics: %v", err)
	}
	sum := 0.0
	for line := range strings.Lines(string(raw)) {
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		for _, verb := range []string{"POST", "PUT", "PATCH", "DELETE"} {
			if strings.Contains(line, `verb="`+verb+`"`) {
				f := strings.Fields(line)
				v, err := strconv.ParseFloat(f[len(f)-1], 64)
				if err != nil {
					t.Fatalf("metrics line %q: %v", line, err)
				}
				sum += v
			}
		}
	}
	if sum == 0 {
		t.Fatal("the server's metrics count no writes: apiserver_request_total missing?")
	}
	return sum
}

// The real cnitool (at the cni module version go.mod pins) drives the plugin
// as a runtime would: conflist in NETCONFPATH, plugin in CNI_PATH.
func TestCNIWithCnitool(t *testing.T) {
	e := newCNIEnv(t)
	dir := t.TempDir()
	tool := filepath.Join(dir, "cnitool")
	if out, err := exec.Command("go", "build", "-o", tool, "github.com/containernetworking/cni/cnitool").CombinedOutput(); err != nil {
		t.Fatalf("building cnitool: %v\n%s", err, out)
	}
	netName := "mizar-" + e.sfx
	conf := fmt.Sprintf(`{"cniVersion": "1.1.0", "name": %q, "plugins": [{"type": "mizar", "vpc": %q, "subnet": %q, "agentSocket": %q, "deleteQueue": %q}]}`,
		netName, e.vpc, e.subnet, e.socket, e.queue)
	if err := os.WriteFile(filepath.Join(dir, "10-mizar.conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	rt, podH := e.pod("tool")
	cnitool := func(cmd string) (string, error) {
		c := exec.Command(tool, cmd, netName, rt.NetNS)
		c.Env = append(os.Environ(), "NETCONFPATH="+dir, "CNI_PATH="+e.bin, "CNI_ARGS=K8S_POD_NAMESPACE=default;K8S_POD_NAME=tool")
		out, err := c.CombinedOutput()
		return string(out), err
	}
	for _, cmd := range []string{"status", "add", "check", "del", "del"} {
		out, err := cnitool(cmd)
		if err != nil {
			t.Fatalf("cnitool %s: %v\n%s", cmd, err, out)
		}
		if cmd == "add" {
			if !strings.Contains(out, `"address": "10.77.1.`) || !strings.Contains(out, `"sandbox": "`+rt.NetNS+`"`) {
				t.Errorf("cnitool add printed:\n%s", out)
			}
			if _, err := podH.LinkByName("eth0"); err != nil {
				t.Errorf("no eth0 in the pod after cnitool add: %v", err)
			}
		}
	}
	if _, err := podH.LinkByName("eth0"); err == nil {
		t.Error("eth0 left in the pod after cnitool del")
	}
	// cnitool's GC lists no valid attachment: everything goes.
	if out, err := cnitool("add"); err != nil {
		t.Fatalf("cnitool add: %v\n%s", err, out)
	}
	if out, err := cnitool("gc"); err != nil {
		t.Fatalf("cnitool gc: %v\n%s", err, out)
	}
	if _, err := podH.LinkByName("eth0"); err == nil {
		t.Error("eth0 left in the pod after cnitool gc")
	}
}

// DEL succeeds when the pod's netns is gone already, and still removes the
// endpoint and the attachment's state.
func TestCNIDelAfterNetnsGone(t *testing.T) {
	e := newCNIEnv(t)
	ctx := context.Background()
	l := e.conflist("1.0.0", e.subnet)
	rt, podH := e.pod("nsgone")
	if _, err := e.cni.AddNetworkList(ctx, l, rt); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if out, err := exec.Command("ip", "netns", "del", filepath.Base(rt.NetNS)).CombinedOutput(); err != nil {
		t.Fatalf("ip netns del: %v: %s", err, out)
	}
	if err := e.cni.DelNetworkList(ctx, l, rt); err != nil {
		t.Fatalf("DEL after the netns went: %v", err)
	}
	e.nothingLeft(rt, podH)
}

// Host <-> pod through the real plugin: the node pings its pod and the pod
// its node, outside the overlay. Two pods of overlapping VPCs with the same
// IP: the first holds the host route, and gets it handed over on its DEL.
func TestCNIHostAndPod(t *testing.T) {
	e := newCNIEnv(t)
	ctx := context.Background()
	api := e.client.Client.NetworkingV1alpha1()
	// A second VPC with the same CIDR, and a /29 in each with every address
	// but .2 taken: both pods get 10.77.9.2.
	vpc2 := "vpc2-" + e.sfx
	if _, err := api.Vpcs().Create(ctx, &v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: vpc2}, Spec: v1alpha1.VpcSpec{CIDR: "10.77.0.0/16"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lists := map[string]*libcni.NetworkConfigList{}
	for _, o := range []struct{ vpc, subnet string }{{e.vpc, "ova-" + e.sfx}, {vpc2, "ovb-" + e.sfx}} {
		if _, err := api.Subnets().Create(ctx, &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: o.subnet}, Spec: v1alpha1.SubnetSpec{VPC: o.vpc, CIDR: "10.77.9.0/29"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for i := 3; i <= 6; i++ {
			if _, err := api.Endpoints("default").Create(ctx, &v1alpha1.Endpoint{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", o.subnet, i)},
				Spec: v1alpha1.EndpointSpec{Subnet: o.subnet, Droplet: e.srv.o.Droplet, IP: fmt.Sprintf("10.77.9.%d", i), MAC: fmt.Sprintf("02:00:00:00:09:%02x", i)}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		l, err := libcni.ConfListFromBytes(fmt.Appendf(nil, `{"cniVersion": "1.1.0", "name": "mizar-%s", "plugins": [{"type": "mizar",
			"vpc": %q, "subnet": %q, "agentSocket": %q, "deleteQueue": %q}]}`, o.subnet, o.vpc, o.subnet, e.socket, e.queue))
		if err != nil {
			t.Fatal(err)
		}
		lists[o.vpc] = l
	}
	nodeIP := "198.18.7.1"
	ping := func(nsPath, dst string) error {
		out, err := exec.Command("ip", "netns", "exec", filepath.Base(nsPath), "ping", "-n", "-q", "-c", "2", "-i", "0.2", "-W", "2", dst).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ping %s in %s: %v: %s", dst, filepath.Base(nsPath), err, out)
		}
		return nil
	}
	routeDev := func(ip string) int {
		t.Helper()
		rs, err := e.nodeH.RouteGet(netip.MustParseAddr(ip).AsSlice())
		if err != nil || len(rs) != 1 {
			t.Fatalf("route to %s on the node: %v %v", ip, rs, err)
		}
		return rs[0].LinkIndex
	}
	hostIndex := func(rt *libcni.RuntimeConf) int {
		t.Helper()
		_, hostIf := names(attachmentID(rt.ContainerID, rt.IfName))
		l, err := e.nodeH.LinkByName(hostIf)
		if err != nil {
			t.Fatal(err)
		}
		return l.Attrs().Index
	}

	first, _ := e.pod("hosta")
	second, _ := e.pod("hostb")
	for _, p := range []struct {
		rt *libcni.RuntimeConf
		l  *libcni.NetworkConfigList
	}{{first, lists[e.vpc]}, {second, lists[vpc2]}} {
		rt := p.rt
		res, err := e.cni.AddNetworkList(ctx, p.l, rt)
		if err != nil {
			t.Fatalf("ADD %s: %v", rt.ContainerID, err)
		}
		if r, _ := types100.GetResult(res); r == nil || r.IPs[0].Address.IP.String() != "10.77.9.2" {
			t.Fatalf("ADD %s: %s, want 10.77.9.2", rt.ContainerID, res)
		}
	}
	if routeDev("10.77.9.2") != hostIndex(first) {
		t.Fatalf("the host route to 10.77.9.2 is not on the first pod's veth")
	}
	if err := ping(e.node, "10.77.9.2"); err != nil {
		t.Errorf("node -> pod: %v", err)
	}
	if err := ping(first.NetNS, nodeIP); err != nil {
		t.Errorf("pod -> node: %v", err)
	}
	c, err := e.dp.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if c.Pod["to_host"] == 0 || c.Pod["encap"] != 0 {
		t.Errorf("pod counters %v: want to_host and no encap", c.Pod)
	}

	// The holder goes: the other pod gets the route and reaches the node.
	if err := e.cni.DelNetworkList(ctx, lists[e.vpc], first); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if routeDev("10.77.9.2") != hostIndex(second) {
		t.Fatalf("the host route to 10.77.9.2 was not handed to the other pod")
	}
	if err := ping(e.node, "10.77.9.2"); err != nil {
		t.Errorf("node -> the other pod after the handover: %v", err)
	}
	if err := ping(second.NetNS, nodeIP); err != nil {
		t.Errorf("the other pod -> node after the handover: %v", err)
	}

	// The node gains an address while the agent runs: its pods reach it
	// too; removed, it is the overlay's again.
	ul, err := e.nodeH.LinkByName("ul0")
	if err != nil {
		t.Fatal(err)
	}
	extra := &netlink.Addr{IPNet: ipnet(netip.MustParsePrefix("198.18.8.1/32"))}
	if err := e.nodeH.AddrAdd(ul, extra); err != nil {
		t.Fatal(err)
	}
	hasExtra := func() bool {
		addrs, err := e.dp.HostAddrs()
		if err != nil {
			t.Fatal(err)
		}
		return slices.Contains(addrs, netip.MustParseAddr("198.18.8.1"))
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s within 5 s", what)
			}
		}
	}
	waitFor("the new address reached host_addrs", hasExtra)
	if err := ping(second.NetNS, "198.18.8.1"); err != nil {
		t.Errorf("pod -> the node's new address: %v", err)
	}
	if err := e.nodeH.AddrDel(ul, extra); err != nil {
		t.Fatal(err)
	}
	waitFor("the removed address left host_addrs", func() bool { return !hasExtra() })
	if err := e.cni.DelNetworkList(ctx, lists[vpc2], second); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	rs, err := e.nodeH.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: ipnet(netip.MustParsePrefix("10.77.9.2/32"))}, netlink.RT_FILTER_DST)
	if err != nil || len(rs) != 0 {
		t.Errorf("routes to 10.77.9.2 left after both DELs: %v %v", rs, err)
	}
}

// The conflist's "mtu" is honoured up to what the underlay carries and
// refused beyond it (or below IPv4's minimum) with code 7, leaving nothing.
func TestCNIMTU(t *testing.T) {
	e := newCNIEnv(t)
	ctx := context.Background()
	withMTU := func(mtu int) *libcni.NetworkConfigList {
		l, err := libcni.ConfListFromBytes(fmt.Appendf(nil, `{"cniVersion": "1.0.0", "name": "mizar-%s", "plugins": [{"type": "mizar",
			"vpc": %q, "subnet": %q, "agentSocket": %q, "deleteQueue": %q, "mtu": %d}]}`, e.sfx, e.vpc, e.subnet, e.socket, e.queue, mtu))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	rt, podH := e.pod("mtu1400")
	l := withMTU(1400)
	if _, err := e.cni.AddNetworkList(ctx, l, rt); err != nil {
		t.Fatalf("ADD with mtu 1400: %v", err)
	}
	if pl, err := podH.LinkByName("eth0"); err != nil || pl.Attrs().MTU != 1400 {
		t.Errorf("pod eth0 with mtu 1400 in the conflist: %v, err %v", pl, err)
	}
	if err := e.cni.DelNetworkList(ctx, l, rt); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	e.nothingLeft(rt, podH)
	for _, c := range []struct {
		mtu  int
		want string
	}{{1451, "exceeds this node's largest pod MTU 1450"}, {60, "below IPv4's minimum"}} {
		rt, podH := e.pod(fmt.Sprintf("mtu%d", c.mtu))
		_, err := e.cni.AddNetworkList(ctx, withMTU(c.mtu), rt)
		if cniCode(t, err) != types.ErrInvalidNetworkConfig || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ADD with mtu %d: %v, want code 7 saying %q", c.mtu, err, c.want)
		}
		_ = e.cni.DelNetworkList(ctx, withMTU(c.mtu), rt)
		e.nothingLeft(rt, podH)
	}
}
