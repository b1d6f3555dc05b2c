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
// kube-apiserver's aggregator, and of the equivalent CRD on kube-apiserver, in
// one run, and reports each as a ratio of the CRD's rate.
//
//	go test ./test/aggregated -run '^$' -bench Creates -benchtime 2000x
//
// With MIZAR_BENCH_PROFILE=<dir>, each path also takes CPU profiles of both
// servers while it runs (MIZAR_BENCH_PROFILE_SECONDS long, 5 by default, so
// give -benchtime enough creates to cover them): <dir>/<path>-<server>.pprof.
func BenchmarkCreates(b *testing.B) {
	ctx := context.Background()
	if _, err := cl.KubectlStdin(ctx, benchCRD, "apply", "-f", "-"); err != nil {
		b.Fatal(err)
	}
	if _, err := cl.Kubectl(ctx, "wait", "--for=condition=Established", "--timeout=60s", "crd/benchdroplets.bench.mizar.dev"); err != nil {
		b.Fatal(err)
	}
	droplets := schema.GroupVersionResource{Group: "networking.mizar.dev", Version: "v1alpha1", Resource: "droplets"}
	crd := schema.GroupVersionResource{Group: "bench.mizar.dev", Version: "v1alpha1", Resource: "benchdroplets"}
	paths := []struct {
		name       string
		kubeconfig string
		gvr        schema.GroupVersionResource
		apiVersion string
		kind       string
	}{
		{"crd", cl.AdminKubeconfig, crd, "bench.mizar.dev/v1alpha1", "BenchDroplet"},
		{"direct", cl.DirectKubeconfig, droplets, "networking.mizar.dev/v1alpha1", "Droplet"},
		{"aggregated", cl.AdminKubeconfig, droplets, "networking.mizar.dev/v1alpha1", "Droplet"},
	}
	results := map[string]benchResult{}
	for _, p := range paths {
		b.Run(p.name, func(b *testing.B) {
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
			res := client.Resource(p.gvr)
			run := fmt.Sprintf("b%x", rand.Uint32())
			// Unique underlay IPs and MACs per object (mizar refuses duplicates).
			octet := 16 + rand.IntN(16)
			var next atomic.Int64
			lat := make([]time.Duration, b.N)
			var wg sync.WaitGroup
			var failed atomic.Value
			b.ResetTimer()
			profiled := profileServers(b, p.name)
			cpu0 := cpuTimes(b)
			start := time.Now()
			for w := 0; w < benchConcurrency; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := int(next.Add(1) - 1)
						if i >= b.N {
							return
						}
						obj := &unstructured.Unstructured{Object: map[string]any{
							"apiVersion": p.apiVersion, "kind": p.kind,
							"metadata": map[string]any{"name": fmt.Sprintf("%s-%d", run, i)},
							"spec": map[string]any{
								"node": fmt.Sprintf("node-%d", i), "interface": "eth0",
								"ip":  fmt.Sprintf("172.%d.%d.%d", octet, i/250, i%250+1),
								"mac": fmt.Sprintf("02:bb:%02x:%02x:%02x:%02x", octet, rand.IntN(256), i/256%256, i%256),
							},
						}}
						t0 := time.Now()
						if _, err := res.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
							failed.Store(err)
							return
						}
						lat[i] = time.Since(t0)
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			cpu1 := cpuTimes(b)
			b.StopTimer()
			profiled()
			if err, _ := failed.Load().(error); err != nil {
				b.Fatalf("create via %s: %v", p.name, err)
			}
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			r := benchResult{rate: float64(b.N) / elapsed.Seconds(), p50: lat[b.N/2], p99: lat[b.N*99/100], cpu: map[string]time.Duration{}}
			var total time.Duration
			for name, t := range cpu1 {
				r.cpu[name] = (t - cpu0[name]) / time.Duration(b.N)
				total += r.cpu[name]
			}
			r.cpu["total"] = total
			results[p.name] = r
			b.ReportMetric(r.rate, "creates/s")
			b.ReportMetric(float64(r.p50.Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(r.p99.Microseconds())/1000, "p99-ms")
			for name, t := range r.cpu {
				b.ReportMetric(float64(t.Microseconds())/1000, name+"-cpu-ms/op")
			}
			// Clean up so repeated runs start from the same state, and let the
			// servers finish reacting to it (watchers, operators, GC) so the
			// next path does not pay for this one.
			_ = res.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
			waitIdle(b)
		})
	}
	base := results["crd"]
	if base.rate == 0 {
		return
	}
	for _, n := range []string{"direct", "aggregated"} {
		r, ok := results[n]
		if !ok {
			continue
		}
		b.Logf("%-10s %7.0f creates/s = %.2fx the CRD (%.0f/s); p50 %v (CRD %v), p99 %v (CRD %v); CPU per create %v = %.2fx the CRD's (%v)",
			n, r.rate, r.rate/base.rate, base.rate, r.p50.Round(time.Microsecond*100), base.p50.Round(time.Microsecond*100),
			r.p99.Round(time.Microsecond*100), base.p99.Round(time.Microsecond*100),
			r.cpu["total"].Round(time.Microsecond*10), float64(r.cpu["total"])/float64(base.cpu["total"]), base.cpu["total"].Round(time.Microsecond*10))
	}
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
