package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"mizar.dev/pkg/apiserver"
	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/test/integration/fixtures"
)

const (
	// workers is how many clients create at once in the create benchmarks.
	workers = 16
	// rounds alternates apiserver and etcd phases, so a burst of noise from
	// elsewhere on the machine lands on both sides of a ratio instead of one.
	rounds = 4
	// idleWatchers stand for the node agents of other droplets in watch/field-selector.
	idleWatchers = 100
	// opTimeout bounds one create or one wait for a watch event.
	opTimeout = 30 * time.Second
	// benchPrefix keeps the baseline's keys out of the apiserver's own prefix.
	benchPrefix = "/mizar-bench/"
	// registryPrefix is where the server stores objects (--etcd-prefix's default for mizar).
	registryPrefix = apiserver.DefaultEtcdPrefix + "/"
)

// env is one server and a raw client of its etcd.
type env struct {
	srv  *apiservertest.Server
	etcd *clientv3.Client
	// run numbers each invocation of a sub-benchmark (b.N ramps up over several),
	// so every invocation creates objects and keys of its own.
	run atomic.Int64
	// dropletIPs numbers droplet addresses, which must be unique across runs.
	dropletIPs atomic.Uint32
}

// BenchmarkAPIServer starts one standalone server for all sub-benchmarks.
//
// The server runs in this process (apiservertest), not as a subprocess: it is the
// binary's code path (same options, embedded etcd), the data directory is ours so
// the baseline talks to the very same etcd member over its unix socket, and
// -cpuprofile covers the server. Client and server share the machine's cores
// either way; a subprocess would only add a second Go runtime competing for them.
func BenchmarkAPIServer(b *testing.B) {
	dir := b.TempDir()
	// Extra server flags, to compare configurations (feature gates, etcd options).
	e := &env{srv: apiservertest.Start(b, dir, strings.Fields(os.Getenv("MIZAR_BENCH_FLAGS"))...)}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{"unix://" + filepath.Join(dir, "etcd", "client.sock")},
		DialTimeout: 10 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		b.Fatalf("connecting to the server's etcd: %v", err)
	}
	b.Cleanup(func() { _ = cli.Close() })
	e.etcd = cli

	b.Run("create", func(b *testing.B) {
		b.Run("droplets", e.benchCreateDroplets)
		b.Run("endpoints", e.benchCreateEndpoints)
		b.Run("allocating", e.benchAllocating)
	})
	b.Run("watch", func(b *testing.B) {
		b.Run("all", func(b *testing.B) { e.benchWatch(b, false) })
		b.Run("field-selector", func(b *testing.B) { e.benchWatch(b, true) })
		b.Run("replay-memory", e.benchReplayMemory)
	})
	b.Run("replicas", benchReplicas)
}

// benchCreateDroplets creates Droplets: nothing allocated, one claim (the
// droplet's address) and the object: the baseline for allocating creates.
func (e *env) benchCreateDroplets(b *testing.B) {
	run := e.run.Add(1)
	c := e.srv.Client.NetworkingV1alpha1().Droplets()
	name := func(i int) string { return fmt.Sprintf("bench-%d-%d", run, i) }
	e.benchCreate(b, run, "droplets", name, func(ctx context.Context, i int) error {
		n := e.dropletIPs.Add(1)
		d := fixtures.Droplet(name(i), fmt.Sprintf("172.%d.%d.%d", 16+(n>>16)&15, (n>>8)&255, n&255))
		_, err := c.Create(ctx, d, metav1.CreateOptions{})
		return err
	})
}

// benchAllocating compares, in alternating rounds of one run, creates that
// allocate with creates that do not: droplets (one claim, nothing allocated),
// VPCs (lowest free VNI), and endpoints in a /16 subnet holding 100 and one
// holding 10,000 endpoints (lowest free address + MAC claim). Allocation should
// cost little beside a plain create, and nothing more in a fuller subnet.
func (e *env) benchAllocating(b *testing.B) {
	run := e.run.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := e.srv.Client.NetworkingV1alpha1()
	vpc := fmt.Sprintf("alloc-vpc-%d", run)
	if _, err := c.Vpcs().Create(ctx, fixtures.Vpc(vpc, "10.0.0.0/8", 0), metav1.CreateOptions{}); err != nil {
		b.Fatalf("creating vpc: %v", err)
	}
	subnet := func(existing int) string {
		name := fmt.Sprintf("alloc-%d-%d", run, existing)
		cidr := fmt.Sprintf("10.%d.0.0/16", (2*run+int64(existing%7))%256)
		if _, err := c.Subnets().Create(ctx, fixtures.Subnet(name, vpc, cidr), metav1.CreateOptions{}); err != nil {
			b.Fatalf("creating subnet %s: %v", cidr, err)
		}
		fill := func(ctx context.Context, i int) error {
			n := fmt.Sprintf("fill-%s-%d", name, i)
			_, err := c.Endpoints("bench").Create(ctx, fixtures.Endpoint("bench", n, name, ""), metav1.CreateOptions{})
			return err
		}
		if _, err := concurrently(0, existing, workers, make([]time.Duration, existing), fill); err != nil {
			b.Fatalf("filling subnet %s: %v", name, err)
		}
		return name
	}
	few, many := subnet(100), subnet(10000)
	if b.N > 65533-10000 {
		b.Fatalf("b.N=%d endpoints do not fit beside 10,000 in a /16; use a smaller -benchtime", b.N)
	}
	endpointIn := func(sn string) func(context.Context, int) error {
		return func(ctx context.Context, i int) error {
			n := fmt.Sprintf("b-%s-%d", sn, i)
			_, err := c.Endpoints("bench").Create(ctx, fixtures.Endpoint("bench", n, sn, ""), metav1.CreateOptions{})
			return err
		}
	}
	phases := []struct {
		name   string
		create func(context.Context, int) error
		wall   time.Duration
	}{
		{name: "droplets", create: func(ctx context.Context, i int) error {
			n := e.dropletIPs.Add(1)
			d := fixtures.Droplet(fmt.Sprintf("alloc-%d-%d", run, i), fmt.Sprintf("172.%d.%d.%d", 16+(n>>16)&15, (n>>8)&255, n&255))
			_, err := c.Droplets().Create(ctx, d, metav1.CreateOptions{})
			return err
		}},
		{name: "vpcs", create: func(ctx context.Context, i int) error {
			_, err := c.Vpcs().Create(ctx, fixtures.Vpc(fmt.Sprintf("alloc-%d-%d", run, i), "10.0.0.0/8", 0), metav1.CreateOptions{})
			return err
		}},
		{name: "endpoints@100", create: endpointIn(few)},
		{name: "endpoints@10000", create: endpointIn(many)},
	}
	lat := make([]time.Duration, b.N)
	b.ResetTimer()
	for r, n := 0, min(rounds, b.N); r < n; r++ {
		lo, hi := b.N*r/n, b.N*(r+1)/n
		// Rotate the order each round, so no phase always runs after the same one.
		for k := range phases {
			i := (k + r) % len(phases)
			wall, err := concurrently(lo, hi, workers, lat, phases[i].create)
			if err != nil {
				b.Fatalf("%s: %v", phases[i].name, err)
			}
			phases[i].wall += wall
		}
	}
	rate := func(i int) float64 { return float64(b.N) / phases[i].wall.Seconds() }
	for i := range phases {
		b.ReportMetric(rate(i), phases[i].name+"/s")
	}
	b.ReportMetric(rate(2)/rate(0), "endpoints@100/droplets")
	b.ReportMetric(rate(3)/rate(0), "endpoints@10000/droplets")
	b.ReportMetric(rate(3)/rate(2), "endpoints@10000/@100")
	b.ReportMetric(rate(1)/rate(0), "vpcs/droplets")
}

// benchCreateEndpoints creates Endpoints in one /16 Subnet: each create reads
// the subnet (from the cache), takes the lowest free address from the in-memory
// index and claims it with the MAC, then stores the object.
func (e *env) benchCreateEndpoints(b *testing.B) {
	run := e.run.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := e.srv.Client.NetworkingV1alpha1()
	vpc, subnet := fmt.Sprintf("bench-vpc-%d", run), fmt.Sprintf("bench-subnet-%d", run)
	// A /16 of its own per invocation: room for 65533 endpoints, none left from before.
	if _, err := c.Vpcs().Create(ctx, fixtures.Vpc(vpc, "10.0.0.0/8", 0), metav1.CreateOptions{}); err != nil {
		b.Fatalf("creating vpc: %v", err)
	}
	if _, err := c.Subnets().Create(ctx, fixtures.Subnet(subnet, vpc, fmt.Sprintf("10.%d.0.0/16", run%256)), metav1.CreateOptions{}); err != nil {
		b.Fatalf("creating subnet: %v", err)
	}
	if b.N > 65533 {
		b.Fatalf("b.N=%d endpoints do not fit in one /16 subnet; use a smaller -benchtime", b.N)
	}
	name := func(i int) string { return fmt.Sprintf("bench-%d-%d", run, i) }
	e.benchCreate(b, run, "endpoints", name, func(ctx context.Context, i int) error {
		_, err := c.Endpoints("bench").Create(ctx, fixtures.Endpoint("bench", name(i), subnet, ""), metav1.CreateOptions{})
		return err
	})
}

// benchCreate runs b.N apiserver creates and b.N etcd creates, in alternating
// rounds, on workers goroutines each, and reports both and their ratios. The
// benchmark timer covers only the apiserver phases, so ns/op is the server's.
func (e *env) benchCreate(b *testing.B, run int64, resource string, name func(int) string, create func(context.Context, int) error) {
	var value []byte // as large as a stored object; known after the first apiserver round
	etcdCreate := func(ctx context.Context, i int) error {
		return e.etcdCreate(ctx, fmt.Sprintf("%screate/%d/%d", benchPrefix, run, i), value)
	}
	apiLat, etcdLat := make([]time.Duration, b.N), make([]time.Duration, b.N)
	var apiWall, etcdWall time.Duration

	b.ResetTimer()
	b.StopTimer()
	for r, n := 0, min(rounds, b.N); r < n; r++ {
		lo, hi := b.N*r/n, b.N*(r+1)/n
		b.StartTimer()
		wall, err := concurrently(lo, hi, workers, apiLat, create)
		b.StopTimer()
		if err != nil {
			b.Fatalf("apiserver create: %v", err)
		}
		apiWall += wall
		if value == nil {
			size, err := e.storedSize(resource, name(lo))
			if err != nil {
				b.Fatal(err)
			}
			value = []byte(strings.Repeat("x", size))
		}
		if wall, err = concurrently(lo, hi, workers, etcdLat, etcdCreate); err != nil {
			b.Fatalf("etcd create: %v", err)
		}
		etcdWall += wall
	}
	e.deleteBaselineKeys(b, fmt.Sprintf("%screate/%d/", benchPrefix, run))

	apiRate, etcdRate := float64(b.N)/apiWall.Seconds(), float64(b.N)/etcdWall.Seconds()
	b.ReportMetric(apiRate, "api-creates/s")
	b.ReportMetric(etcdRate, "etcd-creates/s")
	b.ReportMetric(apiRate/etcdRate, "creates/s-ratio")
	b.ReportMetric(float64(len(value)), "value-bytes")
	reportLatencies(b, apiLat, etcdLat)
}

// benchWatch measures, one create at a time, the time from just before a create
// to the ADDED event at a watcher opened beforehand. With selector the watcher
// selects spec.droplet=<target> while idleWatchers more select other droplets,
// as node agents do: the watch cache's spec.droplet index hands each event only
// to the watchers of its droplet.
func (e *env) benchWatch(b *testing.B, selector bool) {
	run := e.run.Add(1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := e.srv.Client.NetworkingV1alpha1().Dividers()
	target := fmt.Sprintf("bench-w-%d", run)

	open := func(fieldSelector string) watch.Interface {
		opts := metav1.ListOptions{FieldSelector: fieldSelector}
		list, err := c.List(ctx, opts)
		if err != nil {
			b.Fatalf("listing dividers (%q): %v", fieldSelector, err)
		}
		opts.ResourceVersion = list.ResourceVersion
		w, err := c.Watch(ctx, opts)
		if err != nil {
			b.Fatalf("watching dividers (%q): %v", fieldSelector, err)
		}
		b.Cleanup(w.Stop)
		return w
	}
	var w watch.Interface
	var idle []watch.Interface
	if selector {
		w = open("spec.droplet=" + target)
		for j := 0; j < idleWatchers; j++ {
			idle = append(idle, open(fmt.Sprintf("spec.droplet=%s-idle-%d", target, j)))
		}
	} else {
		w = open("")
	}

	prefix := fmt.Sprintf("%swatch/%d/", benchPrefix, run)
	wch := e.etcd.Watch(clientv3.WithRequireLeader(ctx), prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	if resp := <-wch; !resp.Created {
		b.Fatalf("etcd watch on %s not created: %v", prefix, resp.Err())
	}

	name := func(i int) string { return fmt.Sprintf("%s-%d", target, i) }
	apiOp := func(ctx context.Context, i int) error {
		if _, err := c.Create(ctx, fixtures.Divider(name(i), "bench-vpc", target), metav1.CreateOptions{}); err != nil {
			return err
		}
		for {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					return errors.New("apiserver watch closed")
				}
				if m, err := metaOf(ev); ev.Type == watch.Added && err == nil && m.GetName() == name(i) {
					return nil
				}
			case <-ctx.Done():
				return fmt.Errorf("no ADDED event for %s: %w", name(i), ctx.Err())
			}
		}
	}
	var value []byte
	etcdOp := func(ctx context.Context, i int) error {
		key := fmt.Sprintf("%s%d", prefix, i)
		if err := e.etcdCreate(ctx, key, value); err != nil {
			return err
		}
		for {
			select {
			case resp, ok := <-wch:
				if !ok {
					return errors.New("etcd watch closed")
				}
				if err := resp.Err(); err != nil {
					return err
				}
				for _, ev := range resp.Events {
					if ev.Type == clientv3.EventTypePut && string(ev.Kv.Key) == key {
						return nil
					}
				}
			case <-ctx.Done():
				return fmt.Errorf("no etcd event for %s: %w", key, ctx.Err())
			}
		}
	}

	apiLat, etcdLat := make([]time.Duration, b.N), make([]time.Duration, b.N)
	b.ResetTimer()
	b.StopTimer()
	for r, n := 0, min(rounds, b.N); r < n; r++ {
		lo, hi := b.N*r/n, b.N*(r+1)/n
		b.StartTimer()
		_, err := concurrently(lo, hi, 1, apiLat, apiOp)
		b.StopTimer()
		if err != nil {
			b.Fatalf("apiserver create and watch: %v", err)
		}
		if value == nil {
			size, err := e.storedSize("dividers", name(lo))
			if err != nil {
				b.Fatal(err)
			}
			value = []byte(strings.Repeat("x", size))
		}
		if _, err := concurrently(lo, hi, 1, etcdLat, etcdOp); err != nil {
			b.Fatalf("etcd put and watch: %v", err)
		}
	}
	e.deleteBaselineKeys(b, prefix)

	// The idle watchers' selectors match nothing created here.
	for j, iw := range idle {
		select {
		case ev := <-iw.ResultChan():
			b.Errorf("idle watcher %d got a %s event", j, ev.Type)
		default:
		}
	}
	reportLatencies(b, apiLat, etcdLat)
}

// concurrently runs op(i) for every i in [lo, hi) on n goroutines, storing each
// latency in lat[i], and returns the wall time and the first error.
func concurrently(lo, hi, n int, lat []time.Duration, op func(context.Context, int) error) (time.Duration, error) {
	next := atomic.Int64{}
	next.Store(int64(lo))
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		failed   atomic.Bool
	)
	start := time.Now()
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !failed.Load() {
				i := int(next.Add(1) - 1)
				if i >= hi {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
				t0 := time.Now()
				err := op(ctx, i)
				lat[i] = time.Since(t0)
				cancel()
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("operation %d: %w", i, err)
					}
					mu.Unlock()
					failed.Store(true)
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start), firstErr
}

// etcdCreate is what the apiserver's storage does to create an object: put the
// key only if it does not exist, in one transaction.
func (e *env) etcdCreate(ctx context.Context, key string, value []byte) error {
	resp, err := e.etcd.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(value))).
		Commit()
	if err != nil {
		return fmt.Errorf("etcd create of %s: %w", key, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("etcd create of %s: key exists", key)
	}
	return nil
}

// storedSize is the size of the stored value of the object of resource named
// name: what the baseline puts, so both sides write as many bytes.
func (e *env) storedSize(resource, name string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	resp, err := e.etcd.Get(ctx, registryPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return 0, fmt.Errorf("listing keys under %s: %w", registryPrefix, err)
	}
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		if strings.Contains(key, "/"+resource+"/") && strings.HasSuffix(key, "/"+name) {
			obj, err := e.etcd.Get(ctx, key)
			if err != nil {
				return 0, fmt.Errorf("reading %s: %w", key, err)
			}
			if len(obj.Kvs) != 1 {
				return 0, fmt.Errorf("%s vanished", key)
			}
			return len(obj.Kvs[0].Value), nil
		}
	}
	return 0, fmt.Errorf("no key of %s %s under %s", resource, name, registryPrefix)
}

// deleteBaselineKeys keeps the baseline's keys from piling up in the server's
// etcd across invocations.
func (e *env) deleteBaselineKeys(b *testing.B, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if _, err := e.etcd.Delete(ctx, prefix, clientv3.WithPrefix()); err != nil {
		b.Fatalf("deleting %s: %v", prefix, err)
	}
}

func metaOf(ev watch.Event) (metav1.Object, error) {
	m, ok := ev.Object.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no object metadata", ev.Object)
	}
	return m, nil
}

// reportLatencies reports p50 and p99 of both sides in milliseconds, and api/etcd ratios.
func reportLatencies(b *testing.B, api, etcd []time.Duration) {
	a50, a99 := percentile(api, 0.50), percentile(api, 0.99)
	e50, e99 := percentile(etcd, 0.50), percentile(etcd, 0.99)
	b.ReportMetric(ms(a50), "api-p50-ms")
	b.ReportMetric(ms(a99), "api-p99-ms")
	b.ReportMetric(ms(e50), "etcd-p50-ms")
	b.ReportMetric(ms(e99), "etcd-p99-ms")
	b.ReportMetric(float64(a50)/float64(e50), "p50-ratio")
	b.ReportMetric(float64(a99)/float64(e99), "p99-ratio")
}

// percentile is the nearest-rank p-quantile of ds (0 for none).
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(rank, len(s)-1))]
}
