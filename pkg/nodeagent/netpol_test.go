package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/dataplane"
	listers "mizar.dev/pkg/generated/listers/networking/v1alpha1"
	"mizar.dev/pkg/netpol"
	"mizar.dev/pkg/netpol/netpoltest"
)

// timedApplier applies to a real dataplane and notes what and when.
type timedApplier struct {
	dp *dataplane.Datapath
	mu sync.Mutex
	c  *netpol.Compiled
	at time.Time
	ch chan struct{}
}

func (a *timedApplier) ApplyPolicy(c *netpol.Compiled) (dataplane.PolicyApplied, error) {
	st, err := a.dp.ApplyPolicy(c)
	if err == nil {
		a.mu.Lock()
		a.c, a.at = c, time.Now()
		a.mu.Unlock()
		select {
		case a.ch <- struct{}{}:
		default:
		}
	}
	return st, err
}

// waitFor waits until a rule set applied after since satisfies ok, and
// returns when it was applied.
func (a *timedApplier) waitFor(t *testing.T, what string, since time.Time, ok func(*netpol.Compiled) bool) time.Time {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		a.mu.Lock()
		c, at := a.c, a.at
		a.mu.Unlock()
		if c != nil && at.After(since) && ok(c) {
			return at
		}
		select {
		case <-a.ch:
		case <-deadline:
			t.Fatalf("never applied: %s", what)
		}
	}
}

func policyDataplane(t *testing.T) *dataplane.Datapath {
	t.Helper()
	requireRoot(t)
	if err := dataplane.MountBPFFS("/sys/fs/bpf"); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join("/sys/fs/bpf", "mizar-nptest-"+suffix(t))
	dp, err := dataplane.Load(dataplane.Options{PinRoot: root, UnderlayIfindex: 1, HostIP: netip.MustParseAddr("198.18.0.1"),
		HostMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, NetworkPolicy: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = dp.Close()
		if err := dataplane.Purge(root); err != nil {
			t.Error(err)
		}
	})
	return dp
}

// TestPolicyController: the agent's controller over a real kube-apiserver
// and a real dataplane. Pods are placed as the CNI server places them
// (annotations, else the conflist's subnet); policies, namespace labels and
// pod labels all reach the maps; the time from an API write to the maps is
// logged.
func TestPolicyController(t *testing.T) {
	dp := policyDataplane(t)
	kc := startKube(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	vpcs := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	subnets := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, v := range []*v1alpha1.Vpc{
		{ObjectMeta: metav1.ObjectMeta{Name: "pods"}, Spec: v1alpha1.VpcSpec{CIDR: "10.0.0.0/16", VNI: 100}},
		{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Spec: v1alpha1.VpcSpec{CIDR: "10.0.0.0/16", VNI: 200}},
	} {
		must(t, vpcs.Add(v))
	}
	must(t, subnets.Add(&v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: "pods-default"}, Spec: v1alpha1.SubnetSpec{VPC: "pods", CIDR: "10.0.0.0/16"}}))
	must(t, subnets.Add(&v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: "other-s"}, Spec: v1alpha1.SubnetSpec{VPC: "other", CIDR: "10.0.0.0/16"}}))

	// The conflist the agent would install places unannotated pods.
	conflist := filepath.Join(t.TempDir(), "10-mizar.conflist")
	must(t, os.WriteFile(conflist, []byte(`{"cniVersion":"1.1.0","name":"mizar","plugins":[{"type":"mizar","subnet":"pods-default"},{"type":"portmap"}]}`), 0o644))
	vpc, subnet, err := defaultPlacement(conflist, "")
	must(t, err)
	app := &timedApplier{dp: dp, ch: make(chan struct{}, 1)}
	c := NewPolicyController(PolicyOptions{Workload: kc, VPCs: listers.NewVpcLister(vpcs), Subnets: listers.NewSubnetLister(subnets),
		DefaultVPC: vpc, DefaultSubnet: subnet, DP: app, Resync: time.Second, NodeName: "node-a"})
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Error(err)
		}
	})

	// World's namespaces and pods, for real; x/oa in VPC "other" by annotation.
	world := netpoltest.World()
	for ns, l := range world.Namespaces {
		_, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: l}}, metav1.CreateOptions{})
		must(t, err)
		// No controller-manager makes it: pods need their service account.
		if _, err := kc.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	for i, p := range world.Pods {
		po := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels},
			Spec: corev1.PodSpec{NodeName: []string{"node-a", "node-b"}[i%2], Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}}
		for _, cp := range p.Ports {
			proto := map[uint8]corev1.Protocol{netpol.ProtoTCP: corev1.ProtocolTCP, netpol.ProtoUDP: corev1.ProtocolUDP}[cp.Protocol]
			po.Spec.Containers[0].Ports = append(po.Spec.Containers[0].Ports, corev1.ContainerPort{Name: cp.Name, Protocol: proto, ContainerPort: int32(cp.Port)})
		}
		if p.VNI == 2 {
			po.Annotations = map[string]string{AnnotationSubnet: "other-s"}
		}
		created, err := kc.CoreV1().Pods(p.Namespace).Create(ctx, po, metav1.CreateOptions{})
		must(t, err)
		created.Status.PodIP = p.IP.String()
		created.Status.PodIPs = []corev1.PodIP{{IP: p.IP.String()}}
		_, err = kc.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
		must(t, err)
		world.Pods[i].VNI = map[uint32]uint32{1: 100, 2: 200}[p.VNI]
	}
	// As the agent must see it: Decide over world (VNIs 100/200) must
	// agree with what was applied, for every pair and port.
	agrees := func(ps []*networkingv1.NetworkPolicy) func(*netpol.Compiled) bool {
		in := *world
		in.Policies = ps
		return func(comp *netpol.Compiled) bool {
			if len(comp.Endpoints) != len(world.Pods) {
				return false
			}
			for _, s := range in.Pods {
				for _, d := range in.Pods {
					for _, port := range []uint16{80, 81, 8000, 8001, 8002} {
						for _, proto := range []uint8{netpol.ProtoTCP, netpol.ProtoUDP} {
							p := netpol.Packet{VNI: s.VNI, Src: s.IP, Dst: d.IP, Proto: proto, DstPort: port}
							if comp.Allowed(p) != netpol.Decide(&in, p) {
								return false
							}
						}
					}
				}
			}
			return true
		}
	}
	app.waitFor(t, "the pods, no policy", time.Time{}, agrees(nil))

	ingress := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	fromY := []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "blue"}}}},
		Ports: []networkingv1.NetworkPolicyPort{{Port: netpoltest.Named("serve-80-tcp")}}}}
	var ps []*networkingv1.NetworkPolicy
	var lat []time.Duration
	write := func(np *networkingv1.NetworkPolicy) time.Time {
		start := time.Now()
		_, err := kc.NetworkingV1().NetworkPolicies(np.Namespace).Create(ctx, np, metav1.CreateOptions{})
		must(t, err)
		ps = append(ps, np)
		return start
	}
	start := write(netpoltest.Policy("x", "from-blue", nil, ingress, fromY, nil))
	lat = append(lat, app.waitFor(t, "x's policy", start, agrees(ps)).Sub(start))

	// y loses its team label: x no longer takes from it.
	start = time.Now()
	nsY, err := kc.CoreV1().Namespaces().Get(ctx, "y", metav1.GetOptions{})
	must(t, err)
	delete(nsY.Labels, "team")
	_, err = kc.CoreV1().Namespaces().Update(ctx, nsY, metav1.UpdateOptions{})
	must(t, err)
	world.Namespaces["y"] = nsY.Labels
	lat = append(lat, app.waitFor(t, "y's labels", start, agrees(ps)).Sub(start))

	// More policies, one at a time.
	for i := range 10 {
		np := netpoltest.Policy("z", "deny-"+string(rune('a'+i)), map[string]string{"pod": "c"}, ingress, nil, nil)
		start := write(np)
		lat = append(lat, app.waitFor(t, np.Name, start, agrees(ps)).Sub(start))
	}
	slices.Sort(lat)
	t.Logf("API write to applied on the node: min %v, median %v, max %v over %d changes", lat[0], lat[len(lat)/2], lat[len(lat)-1], len(lat))
	st := c.Status()
	if st.Generation == 0 || st.LastError != "" || st.Pods != len(world.Pods) {
		t.Errorf("status %+v", st)
	}

	// What the agent reports for its node's pods.
	rec := httptest.NewRecorder()
	c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/policy", nil))
	var report PolicyReport
	must(t, json.Unmarshal(rec.Body.Bytes(), &report))
	if report.Generation != st.Generation || len(report.Pods) != (len(world.Pods)+1)/2 {
		t.Fatalf("report: generation %d (status %d), %d pods, want node-a's %d:\n%s", report.Generation, st.Generation, len(report.Pods), (len(world.Pods)+1)/2, rec.Body)
	}
	for _, p := range report.Pods {
		want := map[string][]string{"x/a": {"x/from-blue"}, "x/c": {"x/from-blue"}, "z/c": nil}[p.Pod]
		if p.Pod == "z/c" {
			if len(p.Ingress) != 10 {
				t.Errorf("z/c: ingress policies %v, want the 10 deny-*", p.Ingress)
			}
			continue
		}
		if want != nil && !slices.Equal(p.Ingress, want) {
			t.Errorf("%s: ingress policies %v, want %v", p.Pod, p.Ingress, want)
		}
		if p.Node != "node-a" || p.Identity == 0 {
			t.Errorf("%s: node %q identity %d", p.Pod, p.Node, p.Identity)
		}
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestPolicyInput: which pods the controller hands the compiler, and where
// it places them, from listers (no cluster needed).
func TestPolicyInput(t *testing.T) {
	idx := func() cache.Indexer {
		return cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	}
	vpcs, subnets, pods, nss, nps := idx(), idx(), idx(), idx(), idx()
	must(t, vpcs.Add(&v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: "pods"}, Spec: v1alpha1.VpcSpec{VNI: 100}}))
	must(t, vpcs.Add(&v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Spec: v1alpha1.VpcSpec{VNI: 200}}))
	must(t, subnets.Add(&v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: "pods-default"}, Spec: v1alpha1.SubnetSpec{VPC: "pods"}}))
	must(t, subnets.Add(&v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: "other-s"}, Spec: v1alpha1.SubnetSpec{VPC: "other"}}))
	must(t, nss.Add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x", Labels: map[string]string{"a": "b"}}}))
	t0 := metav1.NewTime(time.Now().Add(-time.Hour))
	t1 := metav1.NewTime(time.Now())
	pod := func(name, ip string, created metav1.Time, mut func(*corev1.Pod)) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: name, CreationTimestamp: created},
			Spec:   corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}},
			Status: corev1.PodStatus{PodIP: ip, Phase: corev1.PodRunning}}
		if mut != nil {
			mut(p)
		}
		must(t, pods.Add(p))
	}
	pod("plain", "10.0.0.1", t0, nil)
	pod("done", "10.0.0.2", t1, func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded })
	pod("reuser", "10.0.0.2", t0, nil)
	pod("old", "10.0.0.3", t0, nil)
	pod("new", "10.0.0.3", t1, nil)
	pod("hostnet", "192.168.0.1", t0, func(p *corev1.Pod) { p.Spec.HostNetwork = true })
	pod("pending", "", t0, nil)
	pod("v6", "fd00::1", t0, nil)
	pod("other", "10.0.0.1", t0, func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationSubnet: "other-s"} })
	pod("byvpc", "10.0.0.9", t0, func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationVPC: "other"} })
	pod("lost", "10.0.0.8", t0, func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationSubnet: "nope"} })
	c := &PolicyController{o: PolicyOptions{VPCs: listers.NewVpcLister(vpcs), Subnets: listers.NewSubnetLister(subnets), DefaultSubnet: "pods-default"},
		pods: corelisters.NewPodLister(pods), nss: corelisters.NewNamespaceLister(nss), policies: networkinglisters.NewNetworkPolicyLister(nps)}
	in, nodes, err := c.input()
	must(t, err)
	got := map[string]string{}
	for _, p := range in.Pods {
		got[p.Name] = fmt.Sprintf("%d/%s", p.VNI, p.IP)
		if len(p.Ports) != 1 || p.Ports[0] != (netpol.Port{Name: "http", Protocol: netpol.ProtoTCP, Port: 8080}) {
			t.Errorf("%s: ports %v", p.Name, p.Ports)
		}
	}
	want := map[string]string{"plain": "100/10.0.0.1", "reuser": "100/10.0.0.2", "new": "100/10.0.0.3", "other": "200/10.0.0.1", "byvpc": "200/10.0.0.9"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("pods %v\nwant %v", got, want)
	}
	if len(nodes) != len(want) || nodes["x/new"] != "n1" {
		t.Errorf("nodes %v", nodes)
	}
	if in.Namespaces["x"]["a"] != "b" {
		t.Errorf("namespaces %v", in.Namespaces)
	}
}

// genApplier is a simulated agent's dataplane: it records which policy
// names the last rule set held, and when.
type genApplier struct {
	mu   sync.Mutex
	seen map[int]time.Time // rules count -> first applied
}

func (a *genApplier) ApplyPolicy(c *netpol.Compiled) (dataplane.PolicyApplied, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.seen[len(c.Rules)]; !ok {
		a.seen[len(c.Rules)] = time.Now()
	}
	return dataplane.PolicyApplied{Generation: uint64(len(a.seen))}, nil
}

func (a *genApplier) at(rules int) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.seen[rules]
	return t, ok
}

// TestPolicyFanout: time from one NetworkPolicy write to its rules applied
// by every agent, with 100 simulated agents (each its own informers on a
// real kube-apiserver and its own compiler; the dataplane write is left
// out: TestNetworkPolicyApplyScale times it), over 10 writes.
func TestPolicyFanout(t *testing.T) {
	if testing.Short() {
		t.Skip("100 agents against a kube-apiserver")
	}
	kc := startKube(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	vpcs := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	subnets := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	must(t, vpcs.Add(&v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: "pods"}, Spec: v1alpha1.VpcSpec{VNI: 100}}))
	ns := "fan"
	_, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	must(t, err)
	if _, err := kc.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// 200 pods over the 100 nodes, two apps.
	for i := range 200 {
		po := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("p%d", i), Labels: map[string]string{"app": fmt.Sprint(i % 2)}},
			Spec: corev1.PodSpec{NodeName: fmt.Sprintf("n%d", i%100), Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}}
		created, err := kc.CoreV1().Pods(ns).Create(ctx, po, metav1.CreateOptions{})
		must(t, err)
		created.Status.PodIP = netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}).String()
		_, err = kc.CoreV1().Pods(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{})
		must(t, err)
	}
	const agents = 100
	apps := make([]*genApplier, agents)
	errc := make(chan error, agents)
	for i := range apps {
		apps[i] = &genApplier{seen: map[int]time.Time{}}
		c := NewPolicyController(PolicyOptions{Workload: kc, VPCs: listers.NewVpcLister(vpcs), Subnets: listers.NewSubnetLister(subnets),
			DefaultVPC: "pods", DP: apps[i], NodeName: fmt.Sprintf("n%d", i)})
		go func() { errc <- c.Run(ctx) }()
	}
	t.Cleanup(func() {
		cancel()
		for range agents {
			if err := <-errc; err != nil {
				t.Error(err)
			}
		}
	})
	// Every agent up (synced, first rule set applied) before timing.
	for _, a := range apps {
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if _, ok := a.at(0); ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("an agent never started")
			}
		}
	}
	// Policy k lets app 0 take from a /32 of its own: with k policies an
	// agent holds k rules, which is how it is seen to have applied the k-th.
	ingress := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	var lat []time.Duration
	for k := 1; k <= 10; k++ {
		blk := []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: fmt.Sprintf("172.16.0.%d/32", k)}}}
		np := netpoltest.Policy(ns, fmt.Sprintf("np%d", k), map[string]string{"app": "0"}, ingress,
			[]networkingv1.NetworkPolicyIngressRule{{From: blk}}, nil)
		start := time.Now()
		_, err := kc.NetworkingV1().NetworkPolicies(ns).Create(ctx, np, metav1.CreateOptions{})
		must(t, err)
		deadline := time.Now().Add(30 * time.Second)
		var last time.Time
		for _, a := range apps {
			for {
				at, ok := a.at(k) // k policies: k rules (one identity, k prefixes)
				if ok {
					if at.After(last) {
						last = at
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("policy %d: an agent never applied it", k)
				}
				time.Sleep(time.Millisecond)
			}
		}
		lat = append(lat, last.Sub(start))
	}
	slices.Sort(lat)
	t.Logf("%d agents: one policy write to applied by every agent: min %v, median %v, max %v over %d writes", agents, lat[0], lat[len(lat)/2], lat[len(lat)-1], len(lat))
	// The goal is 1 s; on a shared 2-core machine this guards against
	// starvation only (0.07-0.9 s measured under load 15).
	if lat[len(lat)-1] > 5*time.Second {
		t.Errorf("slowest write took %v to reach every agent", lat[len(lat)-1])
	}
}
