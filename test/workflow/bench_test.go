package workflow

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/generated/clientset/versioned"
)

// BenchmarkEndpointProvisioning measures the endpoint workflow at scale: one
// server with its operators and 10, 100 and 1000 in-process agents (the real
// agent code over recording dataplanes, each with its own droplet identity as
// real agents have). It reports the endpoint Init -> Provisioned latency (p50,
// p99, from the create's return: the object is stored), the create call's own
// p50 (allocation, not this workflow), how many endpoint watch events an agent
// that neither hosts nor bounces the endpoints receives per endpoint created,
// the process's CPU time per endpoint (server, etcd, operators and every agent
// share the process) and the server's write requests per endpoint.
//
//	MIZAR_WF_BENCH_DROPLETS=10,100,1000  droplet counts
//	MIZAR_WF_BENCH_ENDPOINTS=300          endpoints created per size
//	MIZAR_WF_BENCH_PROFILE=cpu.out        write a CPU profile of the creates (one file per size: cpu-<droplets>.out)
func BenchmarkEndpointProvisioning(b *testing.B) {
	sizes := envInts(b, "MIZAR_WF_BENCH_DROPLETS", []int{10, 100, 1000})
	endpoints := envInts(b, "MIZAR_WF_BENCH_ENDPOINTS", []int{300})[0]
	for _, n := range sizes {
		b.Run(fmt.Sprintf("droplets=%d", n), func(b *testing.B) {
			for range b.N {
				r := provisionAtScale(b, n, endpoints)
				b.ReportMetric(float64(r.p50.Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(r.p99.Microseconds())/1000, "p99-ms")
				b.ReportMetric(float64(r.createP50.Microseconds())/1000, "create-p50-ms")
				b.ReportMetric(r.uninvolved, "uninvolved-events/endpoint")
				b.ReportMetric(float64(r.cpu.Microseconds())/1000/float64(endpoints), "cpu-ms/endpoint")
				b.ReportMetric(r.writes/float64(endpoints), "writes/endpoint")
			}
		})
	}
}

// scaleResult is what one provisionAtScale run measured.
type scaleResult struct {
	p50, p99, createP50 time.Duration
	uninvolved          float64
	cpu                 time.Duration
	writes              float64
}

func provisionAtScale(b *testing.B, droplets, endpoints int) scaleResult {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	srv := startServer(b)
	c := srv.Client.NetworkingV1alpha1()
	p := uniq("bench")
	agents := make([]*runningAgent, droplets)
	for i := range droplets {
		name := fmt.Sprintf("%s-node%d", p, i)
		agents[i] = startAgent(b, dropletClient(b, srv.DataDir, name), name, i)
	}
	// Retried: under the load of a thousand registering agents the create lock's
	// etcd lease can lapse (the allocation rewrite replaces that lock).
	var vpc *v1alpha1.Vpc
	var sub *v1alpha1.Subnet
	var err error
	for range 5 {
		if vpc == nil {
			vpc, err = c.Vpcs().Create(ctx, &v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: p}, Spec: v1alpha1.VpcSpec{CIDR: "10.0.0.0/8"}}, metav1.CreateOptions{})
		}
		if vpc != nil {
			sub, err = c.Subnets().Create(ctx, &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: p + "-a"}, Spec: v1alpha1.SubnetSpec{VPC: p, CIDR: "10.0.0.0/16", Bouncers: 2}}, metav1.CreateOptions{})
			if err == nil {
				break
			}
		}
		b.Logf("creating the VPC and subnet: %v; retrying", err)
	}
	if err != nil {
		b.Fatal(err)
	}
	w, err := c.Subnets().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + sub.Name})
	if err != nil {
		b.Fatal(err)
	}
	for ev := range w.ResultChan() {
		if s, ok := ev.Object.(*v1alpha1.Subnet); ok && s.Status.Phase == v1alpha1.PhaseProvisioned {
			break
		}
	}
	w.Stop()

	// Endpoints go to droplets other than the relays' (the bouncers and the
	// VPC's dividers follow every endpoint) and one bystander's.
	bouncers, err := c.Bouncers().List(ctx, metav1.ListOptions{FieldSelector: "spec.subnet=" + sub.Name})
	if err != nil {
		b.Fatal(err)
	}
	dividers, err := c.Dividers().List(ctx, metav1.ListOptions{FieldSelector: "spec.vpc=" + vpc.Name})
	if err != nil {
		b.Fatal(err)
	}
	busy := map[string]bool{}
	for _, bn := range bouncers.Items {
		busy[bn.Spec.Droplet] = true
	}
	for _, d := range dividers.Items {
		busy[d.Spec.Droplet] = true
	}
	var bystander *runningAgent
	var hosts []string
	for _, a := range agents {
		switch {
		case busy[a.name]:
		case bystander == nil:
			bystander = a
		default:
			hosts = append(hosts, a.name)
		}
	}
	if bystander == nil || len(hosts) == 0 {
		b.Fatalf("need at least 5 droplets (2 bouncers, a divider, a bystander, a host), have %d", droplets)
	}

	ns := uniq("ns")
	started := make([]time.Time, endpoints)
	done := make([]time.Duration, endpoints)
	// A watch that resumes from its last resourceVersion: with 10,000 endpoints
	// and their status writes, the server may end a single watch on the way.
	initial, err := c.Endpoints(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	ew, err := watchtools.NewRetryWatcherWithContext(ctx, initial.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return c.Endpoints(ns).Watch(ctx, o)
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer ew.Stop()
	var mu sync.Mutex
	var creates []time.Duration
	early := map[int]time.Time{}
	provisioned := make(chan struct{})
	go func() {
		seen := 0
		for ev := range ew.ResultChan() {
			ep, ok := ev.Object.(*v1alpha1.Endpoint)
			if !ok || ev.Type == watch.Deleted || ep.Status.Phase != v1alpha1.PhaseProvisioned {
				continue
			}
			i, _ := strconv.Atoi(strings.TrimPrefix(ep.Name, "ep"))
			mu.Lock()
			switch {
			case started[i].IsZero(): // Provisioned before the create returned
				if _, ok := early[i]; !ok {
					early[i] = time.Now()
					seen++
				}
			case done[i] == 0:
				done[i] = time.Since(started[i])
				seen++
			}
			mu.Unlock()
			if seen == endpoints {
				close(provisioned)
				return
			}
		}
	}()
	before := bystander.agent.EndpointEvents()
	writesBefore := serverWrites(ctx, b, srv.Client)
	cpuBefore := processCPU(b)
	stopProfile := startProfile(b, droplets)
	defer stopProfile()
	b.ResetTimer()
	// A steady stream of creates from a few CNI-like callers.
	var wg sync.WaitGroup
	const callers = 8
	for k := range callers {
		wg.Go(func() {
			for i := k; i < endpoints; i += callers {
				t0 := time.Now()
				_, err := c.Endpoints(ns).Create(ctx, &v1alpha1.Endpoint{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ep%d", i)},
					Spec: v1alpha1.EndpointSpec{Subnet: sub.Name, Droplet: hosts[i%len(hosts)],
						MAC: fmt.Sprintf("02:42:%02x:%02x:%02x:01", i>>16&0xff, i>>8&0xff, i&0xff)},
				}, metav1.CreateOptions{})
				if err != nil {
					b.Error(err)
					return
				}
				// Init starts when the create returns: the object is stored.
				mu.Lock()
				creates = append(creates, time.Since(t0))
				started[i] = time.Now()
				if early, ok := early[i]; ok {
					done[i] = early.Sub(started[i])
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	select {
	case <-provisioned:
	case <-ctx.Done():
		b.Fatal("endpoints not all Provisioned in time")
	}
	b.StopTimer()
	stopProfile()
	r := scaleResult{
		uninvolved: float64(bystander.agent.EndpointEvents()-before) / float64(endpoints),
		cpu:        processCPU(b) - cpuBefore,
		writes:     serverWrites(ctx, b, srv.Client) - writesBefore,
	}
	mu.Lock()
	defer mu.Unlock()
	r.p50, r.p99, r.createP50 = percentile(done, 0.5), percentile(done, 0.99), percentile(creates, 0.5)
	return r
}

// processCPU is the user and system CPU time the process has used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serverWrites is how many write requests (create, update, patch, delete) the
// server has answered, from its own apiserver_request_total.
func serverWrites(ctx context.Context, b *testing.B, c versioned.Interface) float64 {
	body, err := c.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		b.Fatalf("reading the server's metrics: %v", err)
	}
	var n float64
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		if !slices.ContainsFunc([]string{"POST", "PUT", "PATCH", "DELETE"}, func(v string) bool {
			return strings.Contains(line, `verb="`+v+`"`)
		}) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			b.Fatalf("metrics line %q: %v", line, err)
		}
		n += v
	}
	if n == 0 {
		b.Fatal("the server's metrics count no writes: apiserver_request_total missing?")
	}
	return n
}

// startProfile writes a CPU profile of the measured part when
// MIZAR_WF_BENCH_PROFILE names a file; the returned func stops it.
func startProfile(b *testing.B, droplets int) func() {
	path := os.Getenv("MIZAR_WF_BENCH_PROFILE")
	if path == "" {
		return func() {}
	}
	ext := filepath.Ext(path)
	path = fmt.Sprintf("%s-%d%s", strings.TrimSuffix(path, ext), droplets, ext)
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	// Called once the creates are done, and deferred in case the run fails.
	return sync.OnceFunc(func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Error(err)
		}
		b.Logf("CPU profile of %d droplets in %s", droplets, path)
	})
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

func envInts(b *testing.B, name string, def []int) []int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		out = append(out, n)
	}
	return out
}
