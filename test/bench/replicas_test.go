package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/storage/etcd3/testserver"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"mizar.dev/pkg/apiserver"
	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/pkg/generated/clientset/versioned"
	"mizar.dev/pkg/operators"
	"mizar.dev/test/integration/fixtures"
)

// envInt is the integer in environment variable name, or def.
func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// selfRSS is this process's resident set size in bytes.
func selfRSS(b *testing.B) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatal("no VmRSS in /proc/self/status")
	return 0
}

func heapInuse() int64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

// benchReplayMemory: memory per replaying watch. A droplet bouncing a subnet of
// MIZAR_BENCH_REPLAY_ENDPOINTS (2,000) endpoints opens MIZAR_BENCH_REPLAY_WATCHES
// (100) watches of its slice at once, each read through its whole replay, per
// iteration. Reported: the peak growth of the Go heap in use and of RSS over
// the idle process, divided by the watches (client and server share the
// process, so the client's read buffers are in it: 64 KiB a watch), and the
// replays' p50/p99.
func (e *env) benchReplayMemory(b *testing.B) {
	endpoints := envInt(b, "MIZAR_BENCH_REPLAY_ENDPOINTS", 2000)
	watches := envInt(b, "MIZAR_BENCH_REPLAY_WATCHES", 100)
	run := e.run.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n := e.srv.Client.NetworkingV1alpha1()
	tag := fmt.Sprintf("replay-%d", run)
	vpc, subnet, replayer := tag+"-vpc", tag+"-net", tag+"-droplet"
	must := func(_ any, err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	must(n.Vpcs().Create(ctx, fixtures.Vpc(vpc, "10.0.0.0/8", 0), metav1.CreateOptions{}))
	must(n.Subnets().Create(ctx, fixtures.Subnet(subnet, vpc, fmt.Sprintf("10.%d.0.0/16", 100+run%100)), metav1.CreateOptions{}))
	ip := e.dropletIPs.Add(1)
	must(n.Droplets().Create(ctx, fixtures.Droplet(replayer, fmt.Sprintf("172.%d.%d.%d", 16+(ip>>16)&15, (ip>>8)&255, ip&255)), metav1.CreateOptions{}))
	must(n.Bouncers().Create(ctx, fixtures.Bouncer(tag+"-bouncer", subnet, replayer), metav1.CreateOptions{}))
	ns := tag
	for _, err := range fixtures.Race(workers, func(w int) error {
		for i := w; i < endpoints; i += workers {
			if _, err := n.Endpoints(ns).Create(ctx, fixtures.Endpoint(ns, fmt.Sprintf("ep-%d", i), subnet, ""), metav1.CreateOptions{}); err != nil {
				return err
			}
		}
		return nil
	}) {
		if err != nil {
			b.Fatalf("creating %d endpoints: %v", endpoints, err)
		}
	}
	path := filepath.Join(b.TempDir(), "droplet.kubeconfig")
	if err := apiserver.IssueDropletKubeconfig(e.srv.DataDir, replayer, path); err != nil {
		b.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		b.Fatal(err)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		b.Fatal(err)
	}
	url := cfg.Host + "/apis/networking.mizar.dev/v1alpha1/endpoints?watch=true&fieldSelector=" + fields.OneTermEqualSelector("spec.subnet", subnet).String()

	runtime.GC()
	time.Sleep(time.Second)
	idleHeap, idleRSS := heapInuse(), selfRSS(b)
	var peakHeap, peakRSS int64
	var replays []time.Duration
	var mu sync.Mutex
	b.ResetTimer()
	for range b.N {
		done := make(chan struct{})
		go func() {
			for {
				select {
				case <-done:
					return
				case <-time.After(50 * time.Millisecond):
				}
				h, r := heapInuse(), selfRSS(b)
				mu.Lock()
				peakHeap, peakRSS = max(peakHeap, h), max(peakRSS, r)
				mu.Unlock()
			}
		}()
		errs := fixtures.Race(watches, func(int) error {
			start := time.Now()
			for {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				resp, err := hc.Do(req)
				if err != nil {
					return err
				}
				if resp.StatusCode == http.StatusTooManyRequests {
					_ = resp.Body.Close() // queued full: try again, as an agent would
					time.Sleep(100 * time.Millisecond)
					continue
				}
				if resp.StatusCode != http.StatusOK {
					_ = resp.Body.Close()
					return fmt.Errorf("replay: %s", resp.Status)
				}
				sc := bufio.NewScanner(resp.Body)
				sc.Buffer(make([]byte, 64<<10), 4<<20)
				seen := 0
				for seen < endpoints && sc.Scan() {
					if bytes.Contains(sc.Bytes(), []byte(`"ADDED"`)) {
						seen++
					}
				}
				_ = resp.Body.Close()
				if seen < endpoints {
					return fmt.Errorf("replay ended after %d of %d endpoints", seen, endpoints)
				}
				mu.Lock()
				replays = append(replays, time.Since(start))
				mu.Unlock()
				return nil
			}
		})
		close(done)
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(peakHeap-idleHeap)/float64(watches), "heap-bytes/watch")
	b.ReportMetric(float64(peakRSS-idleRSS)/float64(watches), "rss-bytes/watch")
	b.ReportMetric(float64(peakRSS)/float64(idleRSS), "peak/idle-rss")
	b.ReportMetric(ms(percentile(replays, 0.50)), "replay-p50-ms")
	b.ReportMetric(ms(percentile(replays, 0.99)), "replay-p99-ms")
}

// benchReplicas: two replicas on one etcd (both in this process), the first
// one up running the operators. Reported, in one run:
//   - stale-create-ms: the next create of a replica that idled while the other
//     allocated MIZAR_BENCH_STALE_VALUES (10,000) VNIs, beside busy-create-ms,
//     the busy replica's own next create;
//   - leader-creates/s, other-creates/s and their p99s: an endpoint create
//     storm through both at once, 8 clients each, for 10 s. In one process
//     both replicas share the Go runtime, so the operators' CPU weighs on both
//     alike (test/e2e TestOperatorReplicaServesAsFast runs them as processes).
func benchReplicas(b *testing.B) {
	values := envInt(b, "MIZAR_BENCH_STALE_VALUES", 10000)
	cfg := testserver.NewTestConfig(b)
	endpoint := cfg.ListenClientUrls[0].String()
	testserver.RunEtcd(b, cfg)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cli.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	dir := b.TempDir()
	leader := apiservertest.Start(b, filepath.Join(dir, "leader"), "--etcd-servers", endpoint, "--operators=true")
	// The first replica up is elected; the second only campaigns.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		resp, err := cli.Get(ctx, operators.ElectionKey, clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count > 0, nil
	}); err != nil {
		b.Fatalf("the first replica was not elected: %v", err)
	}
	other := apiservertest.Start(b, filepath.Join(dir, "other"), "--etcd-servers", endpoint, "--operators=true")

	for range b.N {
		// The stale replica: other loads its index of VNIs, then idles.
		oc, lc := other.Client.NetworkingV1alpha1(), leader.Client.NetworkingV1alpha1()
		if _, err := oc.Vpcs().Create(ctx, fixtures.Vpc(fmt.Sprintf("stale-first-%d", b.N), "10.1.0.0/16", 0), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		for _, err := range fixtures.Race(workers, func(w int) error {
			for i := w; i < values; i += workers {
				if _, err := lc.Vpcs().Create(ctx, fixtures.Vpc(fmt.Sprintf("busy-%d-%d", b.N, i), "10.2.0.0/16", 0), metav1.CreateOptions{}); err != nil {
					return err
				}
			}
			return nil
		}) {
			if err != nil {
				b.Fatalf("allocating %d VNIs: %v", values, err)
			}
		}
		time.Sleep(time.Second)
		timed := func(c versioned.Interface, name string) time.Duration {
			start := time.Now()
			if _, err := c.NetworkingV1alpha1().Vpcs().Create(ctx, fixtures.Vpc(name, "10.3.0.0/16", 0), metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
			return time.Since(start)
		}
		stale := timed(other.Client, fmt.Sprintf("stale-next-%d", b.N))
		busy := timed(leader.Client, fmt.Sprintf("busy-next-%d", b.N))
		b.ReportMetric(ms(stale), "stale-create-ms")
		b.ReportMetric(ms(busy), "busy-create-ms")

		// The storm through both.
		tag := fmt.Sprintf("storm-%d", b.N)
		if _, err := oc.Subnets().Create(ctx, fixtures.Subnet(tag, fmt.Sprintf("stale-first-%d", b.N), "10.1.0.0/16"), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		var droplets []string
		for i := range 4 {
			d := fmt.Sprintf("%s-node-%d", tag, i)
			if _, err := oc.Droplets().Create(ctx, fixtures.Droplet(d, fmt.Sprintf("192.168.%d.%d", 95+b.N%100, i+1)), metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
			droplets = append(droplets, d)
		}
		const storm = 10 * time.Second
		stormCtx, stop := context.WithTimeout(ctx, storm)
		lat := [2][]time.Duration{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for r, c := range []versioned.Interface{leader.Client, other.Client} {
			for w := range 8 {
				wg.Go(func() {
					for i := 0; stormCtx.Err() == nil; i++ {
						ep := fixtures.Endpoint(tag, fmt.Sprintf("r%d-w%d-%d", r, w, i), tag, "")
						ep.Spec.Droplet = droplets[(w+i)%len(droplets)]
						start := time.Now()
						if _, err := c.NetworkingV1alpha1().Endpoints(tag).Create(ctx, ep, metav1.CreateOptions{}); err != nil {
							b.Errorf("storm create: %v", err)
							return
						}
						mu.Lock()
						lat[r] = append(lat[r], time.Since(start))
						mu.Unlock()
					}
				})
			}
		}
		wg.Wait()
		stop()
		b.ReportMetric(float64(len(lat[0]))/storm.Seconds(), "leader-creates/s")
		b.ReportMetric(float64(len(lat[1]))/storm.Seconds(), "other-creates/s")
		b.ReportMetric(ms(percentile(lat[0], 0.99)), "leader-p99-ms")
		b.ReportMetric(ms(percentile(lat[1], 0.99)), "other-p99-ms")
		b.ReportMetric(float64(percentile(lat[0], 0.99))/float64(percentile(lat[1], 0.99)), "p99-leader/other")
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
