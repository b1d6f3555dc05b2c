package aggregated

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"mizar.dev/test/cluster"
)

// benchConcurrency is the number of clients creating at once.
const benchConcurrency = 16

// benchRounds is how many turns each path takes (see BenchmarkCreates).
const benchRounds = 5

// benchOctets hands out the second octet of the underlay IPs of the
// benchmark's objects, starting at a random one so repeated runs differ.
var benchOctets = func() *atomic.Int64 {
	var n atomic.Int64
	n.Store(rand.Int64N(16))
	return &n
}()

// benchCRD is a CRD shaped like Droplet (same spec fields, a status
// subresource), served by the same kube-apiserver from its own etcd: the
// baseline the two mizar paths are compared with.
const benchCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: benchdroplets.bench.mizar.dev}
spec:
  group: bench.mizar.dev
  scope: Cluster
  names: {plural: benchdroplets, singular: benchdroplet, kind: BenchDroplet}
  versions:
  - name: v1alpha1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [node, ip, mac, interface]
            properties:
              node: {type: string}
              ip: {type: string, format: ipv4}
              mac: {type: string, pattern: '^([0-9a-f]{2}:){5}[0-9a-f]{2}$'}
              interface: {type: string}
          status:
            type: object
            x-kubernetes-preserve-unknown-fields: true
`

type benchResult struct {
	rate     float64
	p50, p99 time.Duration
	// cpu is the CPU time per create of each process (cpuProcs, and "client").
	cpu map[string]time.Duration
}

// cpuProcs are the control plane's processes whose CPU time per create the
// benchmark reports. On a shared, busy machine the creates/s ratios follow the
// sum of these more than anything else: the sum is the steadier number.
var cpuProcs = []string{"kube-apiserver", "etcd", "mizar-apiserver", "mizar-etcd"}

// cpuTimes reads the CPU time used so far by cpuProcs and by this process.
func cpuTimes(b *testing.B) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, name := range cpuProcs {
		p := cl.Proc(name)
		if p == nil {
			b.Fatalf("no %s process in the control plane", name)
		}
		t, err := p.CPUTime()
		if err != nil {
			b.Fatal(err)
		}
		out[name] = t
	}
	t, err := cluster.ProcessCPUTime(os.Getpid())
	if err != nil {
		b.Fatal(err)
	}
	out["client"] = t
	return out
}

// BenchmarkCreates measures Droplet creates direct to mizar-apiserver, through
// kube-apiserver's aggregator, and of the equivalent CRD on kube-apiserver, and
// a GET of one object on each path (its floor), in one run with the paths
// taking turns, and reports each as a ratio of the CRD creates' rate.
//
//	go test ./test/aggregated -run '^$' -bench Creates -benchtime 2000x
//
// With MIZAR_BENCH_PROFILE=<dir>, each path's first turn also takes CPU
// profiles of both servers (MIZAR_BENCH_PROFILE_SECONDS long, 5 by default, so
// give -benchtime enough requests to cover them): <dir>/<path>-<server>.pprof.
func BenchmarkCreates(b *testing.B) {
	ctx := context.Background()
	if _, err := cl.KubectlStdin(ctx, benchCRD, "apply", "-f", "-"); err != nil {
		b.Fatal(err)
	}
	if _, err := cl.Kubectl(ctx, "wait", "--for=condition=Established", "--timeout=60s", "crd/benchdroplets.bench.mizar.dev"); err != nil {
		b.Fatal(err)
	}
	dropletGVR := schema.GroupVersionResource{Group: "networking.mizar.dev", Version: "v1alpha1", Resource: "droplets"}
	crd := schema.GroupVersionResource{Group: "bench.mizar.dev", Version: "v1alpha1", Resource: "benchdroplets"}
	paths := []struct {
		name       string
		kubeconfig string
		gvr        schema.GroupVersionResource
		apiVersion string
		kind       string
	}{
		{"crd", cl.AdminKubeconfig, crd, "bench.mizar.dev/v1alpha1", "BenchDroplet"},
		{"direct", cl.DirectKubeconfig, dropletGVR, "networking.mizar.dev/v1alpha1", "Droplet"},
		{"aggregated", cl.AdminKubeconfig, dropletGVR, "networking.mizar.dev/v1alpha1", "Droplet"},
	}
	results := map[string]benchResult{}
	clients := map[string]dynamic.NamespaceableResourceInterface{}
	for _, p := range paths {
		cfg, err := clientcmd.BuildConfigFromFlags("", p.kubeconfig)
		if err != nil {
			b.Fatal(err)
		}
		// No client-side throttling: the servers are what is measured.
		cfg.QPS, cfg.Burst = -1, 1000
		client, err := dynamic.NewForConfig(cfg)
		if err != nil {
			b.Fatal(err)
		}
		clients[p.name] = client.Resource(p.gvr)
	}
	// newDroplets returns a maker of objects unique to one benchmark call: names,
	// underlay IPs and MACs (mizar refuses duplicates), and a call's objects
	// may still be going away when the next call starts.
	newDroplets := func(apiVersion, kind string) func(i int) *unstructured.Unstructured {
		run := fmt.Sprintf("b%x", rand.Uint32())
		// Each maker its own second octet: the paths' objects live side by side.
		octet := 16 + int(benchOctets.Add(1)%16)
		return func(i int) *unstructured.Unstructured {
			return &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": apiVersion, "kind": kind,
				"metadata": map[string]any{"name": fmt.Sprintf("%s-%d", run, i)},
				"spec": map[string]any{
					"node": fmt.Sprintf("node-%d", i), "interface": "eth0",
					"ip":  fmt.Sprintf("172.%d.%d.%d", octet, i/250, i%250+1),
					"mac": fmt.Sprintf("02:bb:%02x:%02x:%02x:%02x", octet, rand.IntN(256), i/256%256, i%256),
				},
			}}
		}
	}
	// Each path runs in benchRounds rounds, the paths taking turns: this
	// machine's speed drifts by tens of percent from one minute to the next,
	// and a path run whole in one stretch measured the drift as much as the
	// path. A path's numbers are over all its rounds.
	type path struct {
		name string
		op   func(i int) error
	}
	var turns []path
	for _, p := range paths {
		res, droplet := clients[p.name], newDroplets(p.apiVersion, p.kind)
		turns = append(turns, path{p.name, func(i int) error {
			_, err := res.Create(ctx, droplet(i), metav1.CreateOptions{})
			return err
		}})
	}
	// The floor of each path: a GET of one object, the least a request through
	// it can do. Through the aggregator, kube-apiserver's CPU per GET is what
	// its proxy costs per request, whatever the backend does.
	for _, p := range paths {
		res := clients[p.name]
		obj, err := res.Create(ctx, newDroplets(p.apiVersion, p.kind)(0), metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = res.Delete(ctx, obj.GetName(), metav1.DeleteOptions{}) }()
		turns = append(turns, path{"get-" + p.name, func(int) error {
			_, err := res.Get(ctx, obj.GetName(), metav1.GetOptions{})
			return err
		}})
	}
	rounds := min(benchRounds, b.N)
	samples := map[string][]sample{}
	b.ResetTimer()
	for r := 0; r < rounds; r++ {
		from, to := b.N*r/rounds, b.N*(r+1)/rounds
		for _, t := range turns {
			samples[t.name] = append(samples[t.name], drive(b, t.name, r == 0, from, to, t.op))
			// Let the servers finish reacting (watchers, operators, GC) so
			// the next turn does not pay for this one.
			waitIdle(b)
		}
	}
	b.StopTimer()
	for _, t := range turns {
		r := combine(samples[t.name])
		results[t.name] = r
		b.ReportMetric(r.rate, t.name+"-ops/s")
		b.ReportMetric(float64(r.p50.Microseconds())/1000, t.name+"-p50-ms")
		b.ReportMetric(float64(r.p99.Microseconds())/1000, t.name+"-p99-ms")
		b.ReportMetric(float64(r.cpu["total"].Microseconds())/1000, t.name+"-cpu-ms/op")
	}
	// Clean up so repeated runs start from the same state.
	for _, p := range paths {
		_ = clients[p.name].DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	}
	base := results["crd"]
	if b.N < 100 {
		return // the testing package's first call, with b.N = 1
	}
	for _, n := range []string{"direct", "aggregated", "get-crd", "get-direct", "get-aggregated"} {
		r, ok := results[n]
		if !ok {
			continue
		}
		b.Logf("%-14s %7.0f requests/s = %.2fx the CRD's creates (%.0f/s); p50 %v (CRD %v), p99 %v (CRD %v); CPU per request %v = %.2fx the CRD create's (%v)",
			n, r.rate, r.rate/base.rate, base.rate, r.p50.Round(time.Microsecond*100), base.p50.Round(time.Microsecond*100),
			r.p99.Round(time.Microsecond*100), base.p99.Round(time.Microsecond*100),
			r.cpu["total"].Round(time.Microsecond*10), float64(r.cpu["total"])/float64(base.cpu["total"]), base.cpu["total"].Round(time.Microsecond*10))
	}
	if g, ok := results["get-aggregated"]; ok {
		b.Logf("kube-apiserver's proxy: %v CPU per aggregated request (GET); a CRD create costs kube-apiserver %v and its etcd %v",
			g.cpu["kube-apiserver"].Round(time.Microsecond*10), base.cpu["kube-apiserver"].Round(time.Microsecond*10), base.cpu["etcd"].Round(time.Microsecond*10))
	}
}

// sample is one turn of a path: ops from benchConcurrency clients at once.
type sample struct {
	elapsed time.Duration
	lat     []time.Duration
	// cpu is the CPU time each process used in the turn.
	cpu map[string]time.Duration
}

// drive runs op for i in [from, to) from benchConcurrency clients at once,
// with CPU profiles of both servers when profile is set (profileServers).
func drive(b *testing.B, name string, profile bool, from, to int, op func(i int) error) sample {
	var next atomic.Int64
	next.Store(int64(from))
	lat := make([]time.Duration, to-from)
	var wg sync.WaitGroup
	var failed atomic.Value
	profiled := func() {}
	if profile {
		profiled = profileServers(b, name)
	}
	cpu0 := cpuTimes(b)
	start := time.Now()
	for w := 0; w < benchConcurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= to {
					return
				}
				t0 := time.Now()
				if err := op(i); err != nil {
					failed.Store(err)
					return
				}
				lat[i-from] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	s := sample{elapsed: time.Since(start), lat: lat, cpu: map[string]time.Duration{}}
	cpu1 := cpuTimes(b)
	profiled()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	for name, t := range cpu1 {
		s.cpu[name] = t - cpu0[name]
	}
	return s
}

// combine makes one result of a path's turns: its rate over the time its
// turns took, its latency percentiles and its CPU time per op.
func combine(samples []sample) benchResult {
	var (
		elapsed time.Duration
		lat     []time.Duration
		cpu     = map[string]time.Duration{}
	)
	for _, s := range samples {
		elapsed += s.elapsed
		lat = append(lat, s.lat...)
		for name, t := range s.cpu {
			cpu[name] += t
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	n := len(lat)
	r := benchResult{rate: float64(n) / elapsed.Seconds(), p50: lat[n/2], p99: lat[n*99/100], cpu: map[string]time.Duration{}}
	var total time.Duration
	for name, t := range cpu {
		r.cpu[name] = t / time.Duration(n)
		total += r.cpu[name]
	}
	r.cpu["total"] = total
	return r
}

// waitIdle waits (30 s at most) until the control plane uses under a tenth
// of a core.
func waitIdle(b *testing.B) {
	const window = 500 * time.Millisecond
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		before := cpuTimes(b)
		time.Sleep(window)
		after := cpuTimes(b)
		var used time.Duration
		for _, name := range cpuProcs {
			used += after[name] - before[name]
		}
		if used < window/10 {
			return
		}
	}
	b.Logf("the control plane was still busy 30 s after a path's cleanup")
}

// profileServers starts CPU profiles of kube-apiserver and mizar-apiserver
// when MIZAR_BENCH_PROFILE names a directory (/debug/pprof is on in both), and
// returns a function that waits for them to be written.
func profileServers(b *testing.B, path string) func() {
	dir := os.Getenv("MIZAR_BENCH_PROFILE")
	if dir == "" || b.N < 100 {
		return func() {}
	}
	seconds := 5
	if s := os.Getenv("MIZAR_BENCH_PROFILE_SECONDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			b.Fatalf("MIZAR_BENCH_PROFILE_SECONDS=%q: want a positive number of seconds", s)
		}
		seconds = n
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	for server, kubeconfig := range map[string]string{"kube": cl.AdminKubeconfig, "mizar": cl.DirectKubeconfig} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
			if err != nil {
				b.Error(err)
				return
			}
			client, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				b.Error(err)
				return
			}
			// Past the first connections' handshakes.
			time.Sleep(300 * time.Millisecond)
			prof, err := client.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
				Param("seconds", strconv.Itoa(seconds)).Timeout(time.Duration(seconds+30) * time.Second).DoRaw(context.Background())
			if err != nil {
				b.Errorf("profiling %s: %v", server, err)
				return
			}
			if err := os.WriteFile(filepath.Join(dir, path+"-"+server+".pprof"), prof, 0o644); err != nil {
				b.Error(err)
			}
		}()
	}
	return wg.Wait
}
