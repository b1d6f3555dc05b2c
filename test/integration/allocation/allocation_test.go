// Package allocation tests that allocated values (VNIs, addresses, subnet
// ranges, MACs, droplet addresses) stay unique on every path a create can take:
// create, server-side apply, concurrent replicas of either, and writes that etcd
// committed although the server was told they failed. It runs its own server,
// whose storage can be told to fail after committing.
package allocation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/storagebackend"

	"mizar.dev/pkg/apiserver"
	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/pkg/claim"
	"mizar.dev/pkg/etcd"
	ac "mizar.dev/pkg/generated/applyconfiguration/networking/v1alpha1"
	"mizar.dev/pkg/generated/clientset/versioned"
	"mizar.dev/test/integration/fixtures"
)

var (
	server *apiservertest.Server
	faults faultInjector
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "mizar-alloc-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	server, err = apiservertest.NewWithOptions(dir, func(o *apiserver.Options) {
		o.WrapStorage = faults.wrap
		o.ClaimRepairPeriod = 200 * time.Millisecond
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer server.Stop()
	return m.Run()
}

// faultInjector makes the storage of chosen resources report failure after etcd
// committed a create (as a lost reply or a dead leader would), or fail reads.
type faultInjector struct {
	mu sync.Mutex
	// commitThenFail: resource -> every how many creates the reply is "lost" (0: never).
	commitThenFail map[string]int64
	failGets       map[string]int64
	count          atomic.Int64
}

func (f *faultInjector) set(commitThenFail, failGets map[string]int64) func() {
	f.mu.Lock()
	f.commitThenFail, f.failGets = commitThenFail, failGets
	f.mu.Unlock()
	return func() { f.set(nil, nil) }
}

func (f *faultInjector) every(m func() map[string]int64, resource string) bool {
	f.mu.Lock()
	n := m()[resource]
	f.mu.Unlock()
	return n > 0 && f.count.Add(1)%n == 0
}

func (f *faultInjector) wrap(gr schema.GroupResource, s storage.Interface) storage.Interface {
	return &faultyStorage{Interface: s, resource: gr.Resource, f: f}
}

var errLostReply = errors.New("rpc error: code = Unavailable desc = error reading from server: EOF")

type faultyStorage struct {
	storage.Interface
	resource string
	f        *faultInjector
}

func (s *faultyStorage) Create(ctx context.Context, key string, obj, out runtime.Object, ttl uint64) error {
	err := s.Interface.Create(ctx, key, obj, out, ttl)
	if err == nil && s.f.every(func() map[string]int64 { return s.f.commitThenFail }, s.resource) {
		return errLostReply
	}
	return err
}

func (s *faultyStorage) GuaranteedUpdate(ctx context.Context, key string, destination runtime.Object, ignoreNotFound bool,
	preconditions *storage.Preconditions, tryUpdate storage.UpdateFunc, cachedExistingObject runtime.Object) error {
	err := s.Interface.GuaranteedUpdate(ctx, key, destination, ignoreNotFound, preconditions, tryUpdate, cachedExistingObject)
	if err == nil && s.f.every(func() map[string]int64 { return s.f.commitThenFail }, s.resource) {
		return errLostReply
	}
	return err
}

func (s *faultyStorage) Get(ctx context.Context, key string, opts storage.GetOptions, out runtime.Object) error {
	if s.f.every(func() map[string]int64 { return s.f.failGets }, s.resource) {
		return errLostReply
	}
	return s.Interface.Get(ctx, key, opts, out)
}

func client() versioned.Interface { return server.Client }

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// unique makes names of this run, so `go test -count=N` starts afresh each time.
func unique(t *testing.T, base string) string {
	return fmt.Sprintf("%s-%d", base, time.Now().UnixNano()%1e9)
}

var ipSeq atomic.Uint32

// uniqueIP returns droplet addresses (198.18.0.0/15, benchmarking space) no other
// test of this process and run uses; the base changes per run.
func uniqueIP() string {
	v := uint32(time.Now().UnixNano()/1e3)&0xffff<<8 + ipSeq.Add(1)
	return fmt.Sprintf("198.%d.%d.%d", 18+(v>>16)&1, (v>>8)&0xff, v&0xff)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// network creates a VPC with a subnet and returns their names.
func network(t *testing.T, ctx context.Context, cidr, subnetCIDR string) (string, string) {
	t.Helper()
	c := client().NetworkingV1alpha1()
	vpc, sn := unique(t, "vpc"), unique(t, "net")
	_, err := c.Vpcs().Create(ctx, fixtures.Vpc(vpc, cidr, 0), metav1.CreateOptions{})
	must(t, err)
	_, err = c.Subnets().Create(ctx, fixtures.Subnet(sn, vpc, subnetCIDR), metav1.CreateOptions{})
	must(t, err)
	return vpc, sn
}

func applyEndpoint(ctx context.Context, c versioned.Interface, ns, name, subnet string) error {
	_, err := c.NetworkingV1alpha1().Endpoints(ns).Apply(ctx,
		ac.Endpoint(name, ns).WithSpec(ac.EndpointSpec().WithSubnet(subnet).WithDroplet("node-1").WithPod(name).
			WithMAC(fixtures.MAC(ns+"/"+name))),
		metav1.ApplyOptions{FieldManager: "test", Force: true})
	return err
}

// assertDistinctAddresses lists the subnet's endpoints and fails on a shared IP.
func assertDistinctAddresses(t *testing.T, ctx context.Context, subnet string, want int) {
	t.Helper()
	eps, err := client().NetworkingV1alpha1().Endpoints("").List(ctx, metav1.ListOptions{FieldSelector: "spec.subnet=" + subnet})
	must(t, err)
	seen := map[string]string{}
	for _, ep := range eps.Items {
		if prev, dup := seen[ep.Spec.IP]; dup {
			t.Errorf("address %s is held by both %s and %s/%s", ep.Spec.IP, prev, ep.Namespace, ep.Name)
		}
		seen[ep.Spec.IP] = ep.Namespace + "/" + ep.Name
	}
	if len(eps.Items) != want {
		t.Errorf("subnet %s has %d endpoints, want %d", subnet, len(eps.Items), want)
	}
}

// TestRacingServerSideApplyCreates: server-side apply creates run BeginCreate
// inside the update, before the write; they must still never share a value.
func TestRacingServerSideApplyCreates(t *testing.T) {
	ctx := testContext(t)
	c := client()
	_, sn := network(t, ctx, "10.90.0.0/16", "10.90.1.0/26")
	ns := unique(t, "ssa")
	errs := fixtures.Race(40, func(i int) error { return applyEndpoint(ctx, c, ns, fmt.Sprintf("ep-%d", i), sn) })
	for i, err := range errs {
		if err != nil {
			t.Errorf("apply %d: %v", i, err)
		}
	}
	assertDistinctAddresses(t, ctx, sn, 40)

	// Overlapping subnets applied at once: exactly one is stored.
	vpc, _ := network(t, ctx, "10.91.0.0/16", "10.91.200.0/24")
	subnets := fixtures.Race(8, func(i int) error {
		_, err := c.NetworkingV1alpha1().Subnets().Apply(ctx, ac.Subnet(fmt.Sprintf("%s-o%d", vpc, i)).
			WithSpec(ac.SubnetSpec().WithVPC(vpc).WithCIDR(fmt.Sprintf("10.91.5.0/%d", 24+i%3))),
			metav1.ApplyOptions{FieldManager: "test", Force: true})
		return err
	})
	stored := 0
	for i, err := range subnets {
		switch {
		case err == nil:
			stored++
		case !apierrors.IsInvalid(err) && !apierrors.IsConflict(err):
			t.Errorf("subnet apply %d: %v, want success, 422 or 409", i, err)
		}
	}
	if stored != 1 {
		t.Errorf("%d overlapping subnets stored, want 1", stored)
	}

	// VPCs applied at once get distinct VNIs.
	base := unique(t, "vpc-ssa")
	vpcErrs := fixtures.Race(10, func(i int) error {
		_, err := c.NetworkingV1alpha1().Vpcs().Apply(ctx, ac.Vpc(fmt.Sprintf("%s-%d", base, i)).
			WithSpec(ac.VpcSpec().WithCIDR("10.0.0.0/16")), metav1.ApplyOptions{FieldManager: "test", Force: true})
		return err
	})
	vnis := map[int32]string{}
	for i, err := range vpcErrs {
		must(t, err)
		v, err := c.NetworkingV1alpha1().Vpcs().Get(ctx, fmt.Sprintf("%s-%d", base, i), metav1.GetOptions{})
		must(t, err)
		if prev, dup := vnis[v.Spec.VNI]; dup {
			t.Errorf("VNI %d given to %s and %s", v.Spec.VNI, prev, v.Name)
		}
		vnis[v.Spec.VNI] = v.Name
	}
}

// TestCommitReportedAsFailed: etcd commits a create but the server is told it
// failed (every third create and apply of endpoints and VPCs). The claims of
// such a create stay, so no later create hands its value out again. Reads of
// the subnet fail too; those creates hold nothing and answer 503 with
// Retry-After, which client-go retries.
func TestCommitReportedAsFailed(t *testing.T) {
	ctx := testContext(t)
	c := client()
	_, sn := network(t, ctx, "10.92.0.0/16", "10.92.1.0/25")
	ns := unique(t, "lost")
	defer faults.set(map[string]int64{"endpoints": 3, "vpcs": 3}, map[string]int64{"subnets": 5})()

	errs := fixtures.Race(60, func(i int) error {
		name := fmt.Sprintf("ep-%d", i)
		if i%2 == 0 {
			return applyEndpoint(ctx, c, ns, name, sn)
		}
		_, err := c.NetworkingV1alpha1().Endpoints(ns).Create(ctx, fixtures.Endpoint(ns, name, sn, ""), metav1.CreateOptions{})
		return err
	})
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
			if !apierrors.IsInternalError(err) && !apierrors.IsServiceUnavailable(err) && !apierrors.IsTimeout(err) {
				t.Errorf("want a 5xx for an injected storage failure, got %v", err)
			}
		}
	}
	if failed == 0 {
		t.Fatal("no create saw an injected failure; the test proves nothing")
	}
	faults.set(nil, nil)
	// Whatever etcd committed is there; every endpoint holds its own address.
	eps, err := c.NetworkingV1alpha1().Endpoints(ns).List(ctx, metav1.ListOptions{})
	must(t, err)
	stored := len(eps.Items)
	// More creates after the failures must not reuse a committed address.
	for i := range 30 {
		_, err := c.NetworkingV1alpha1().Endpoints(ns).Create(ctx, fixtures.Endpoint(ns, fmt.Sprintf("after-%d", i), sn, ""), metav1.CreateOptions{})
		must(t, err)
	}
	assertDistinctAddresses(t, ctx, sn, stored+30)
	t.Logf("%d of 60 creates saw a failure, %d were stored anyway", failed, stored)

	// The same for VNIs.
	defer faults.set(map[string]int64{"vpcs": 2}, nil)()
	base := unique(t, "vpc-lost")
	fixtures.Race(10, func(i int) error {
		_, err := c.NetworkingV1alpha1().Vpcs().Create(ctx, fixtures.Vpc(fmt.Sprintf("%s-%d", base, i), "10.0.0.0/16", 0), metav1.CreateOptions{})
		return err
	})
	faults.set(nil, nil)
	for i := range 5 {
		_, err := c.NetworkingV1alpha1().Vpcs().Create(ctx, fixtures.Vpc(fmt.Sprintf("%s-after-%d", base, i), "10.0.0.0/16", 0), metav1.CreateOptions{})
		must(t, err)
	}
	vpcs, err := c.NetworkingV1alpha1().Vpcs().List(ctx, metav1.ListOptions{})
	must(t, err)
	vnis := map[int32]string{}
	for _, v := range vpcs.Items {
		if prev, dup := vnis[v.Spec.VNI]; dup {
			t.Errorf("VNI %d held by %s and %s", v.Spec.VNI, prev, v.Name)
		}
		vnis[v.Spec.VNI] = v.Name
	}
}

// TestDuplicatesRefused: a requested value someone holds is a 422 naming the holder.
func TestDuplicatesRefused(t *testing.T) {
	ctx := testContext(t)
	c := client().NetworkingV1alpha1()
	_, sn := network(t, ctx, "10.93.0.0/16", "10.93.1.0/24")
	ns := unique(t, "dup")
	first := fixtures.Endpoint(ns, "first", sn, "10.93.1.10")
	_, err := c.Endpoints(ns).Create(ctx, first, metav1.CreateOptions{})
	must(t, err)

	sameIP := fixtures.Endpoint(ns, "same-ip", sn, "10.93.1.10")
	sameMAC := fixtures.Endpoint(ns, "same-mac", sn, "")
	sameMAC.Spec.MAC = first.Spec.MAC
	dropletIP := unique(t, "drop")
	taken, free1, free2 := uniqueIP(), uniqueIP(), uniqueIP()
	_, err = c.Droplets().Create(ctx, fixtures.Droplet(dropletIP+"-a", taken), metav1.CreateOptions{})
	must(t, err)
	for _, tc := range []struct {
		name   string
		create func() error
		field  string
	}{
		{"endpoint ip", func() error { _, err := c.Endpoints(ns).Create(ctx, sameIP, metav1.CreateOptions{}); return err }, "spec.ip"},
		{"endpoint mac", func() error { _, err := c.Endpoints(ns).Create(ctx, sameMAC, metav1.CreateOptions{}); return err }, "spec.mac"},
		{"droplet ip", func() error {
			_, err := c.Droplets().Create(ctx, fixtures.Droplet(dropletIP+"-b", taken), metav1.CreateOptions{})
			return err
		}, "spec.ip"},
	} {
		err := tc.create()
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.field+": Duplicate value") {
			t.Errorf("%s: got %v, want 422 Duplicate value at %s", tc.name, err, tc.field)
		}
	}
	// A droplet moving to a taken address is refused too; to a free one it is not.
	d, err := c.Droplets().Create(ctx, fixtures.Droplet(dropletIP+"-c", free1), metav1.CreateOptions{})
	must(t, err)
	d.Spec.IP = taken
	if _, err := c.Droplets().Update(ctx, d, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
		t.Errorf("moving a droplet onto a taken address: %v, want 422", err)
	}
	d.Spec.IP = free2
	_, err = c.Droplets().Update(ctx, d, metav1.UpdateOptions{})
	must(t, err)
}

// TestNothingLeftAfterDelete: deleting every object releases every claim.
func TestNothingLeftAfterDelete(t *testing.T) {
	ctx := testContext(t)
	c := client().NetworkingV1alpha1()
	etcdc, err := etcd.NewClient(storagebackend.TransportConfig{ServerList: []string{"unix://" + server.DataDir + "/etcd/client.sock"}})
	must(t, err)
	defer etcdc.Close()
	claims := func() []string {
		resp, err := etcdc.Get(ctx, "/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		must(t, err)
		var out []string
		for _, kv := range resp.Kvs {
			if strings.Contains(string(kv.Key), "/claims/") {
				out = append(out, string(kv.Key))
			}
		}
		return out
	}
	// Earlier tests of this package leave their objects (and claims) behind.
	before := strings.Join(claims(), "\n")
	vpc, sn := network(t, ctx, "10.94.0.0/16", "10.94.1.0/24")
	ns := unique(t, "gone")
	for i := range 5 {
		_, err := c.Endpoints(ns).Create(ctx, fixtures.Endpoint(ns, fmt.Sprintf("ep-%d", i), sn, ""), metav1.CreateOptions{})
		must(t, err)
		must(t, applyEndpoint(ctx, client(), ns, fmt.Sprintf("ssa-%d", i), sn))
	}
	drop := unique(t, "drop")
	_, err = c.Droplets().Create(ctx, fixtures.Droplet(drop, uniqueIP()), metav1.CreateOptions{})
	must(t, err)
	if n := len(claims()) - len(strings.Split(before, "\n")); n != 23 {
		t.Fatalf("%d claims were written for 10 endpoints, a subnet, a VPC and a droplet; want 23", n)
	}
	must(t, c.Endpoints(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
	must(t, c.Subnets().Delete(ctx, sn, metav1.DeleteOptions{}))
	must(t, c.Vpcs().Delete(ctx, vpc, metav1.DeleteOptions{}))
	must(t, c.Droplets().Delete(ctx, drop, metav1.DeleteOptions{}))
	if after := strings.Join(claims(), "\n"); after != before {
		t.Errorf("claims before:\n%s\nafter deleting everything created since:\n%s", before, after)
	}
}

// TestOrphanedClaims: a claim whose owner was never stored (a server died between
// claiming and writing) is taken over once older than claim.OrphanGrace; a
// younger one may belong to a create still in flight: a requested value answers
// 409, and allocation skips it.
func TestOrphanedClaims(t *testing.T) {
	ctx := testContext(t)
	c := client().NetworkingV1alpha1()
	_, sn := network(t, ctx, "10.95.0.0/16", "10.95.1.0/24")
	ns := unique(t, "orphan")
	_, err := c.Endpoints(ns).Create(ctx, fixtures.Endpoint(ns, "first", sn, "10.95.1.2"), metav1.CreateOptions{})
	must(t, err)
	etcdc, err := etcd.NewClient(storagebackend.TransportConfig{ServerList: []string{"unix://" + server.DataDir + "/etcd/client.sock"}})
	must(t, err)
	defer etcdc.Close()
	resp, err := etcdc.Get(ctx, "/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	must(t, err)
	var prefix string
	for _, kv := range resp.Kvs {
		if k, ok := strings.CutSuffix(string(kv.Key), "claims/ip/"+sn+"/10.95.1.2"); ok {
			prefix = k + "claims/"
		}
	}
	if prefix == "" {
		t.Fatal("no claim found for the first endpoint")
	}
	orphan := func(ip string, age time.Duration) {
		t.Helper()
		o := claim.Owner{Resource: "endpoints", Namespace: ns, Name: "never-stored-" + ip, UID: "gone", Time: time.Now().Add(-age)}
		v, err := json.Marshal(o)
		must(t, err)
		_, err = etcdc.Put(ctx, prefix+"ip/"+sn+"/"+ip, string(v))
		must(t, err)
	}
	orphan("10.95.1.3", claim.OrphanGrace+time.Minute)
	orphan("10.95.1.4", time.Second)

	// Old orphan: a requested address is taken over.
	_, err = c.Endpoints(ns).Create(ctx, fixtures.Endpoint(ns, "takes-old", sn, "10.95.1.3"), metav1.CreateOptions{})
	must(t, err)
	// Young claim: maybe a create in flight; the client may retry later.
	_, err = c.Endpoints(ns).Create(ctx, fixtures.Endpoint(ns, "takes-young", sn, "10.95.1.4"), metav1.CreateOptions{})
	if !apierrors.IsConflict(err) {
		t.Errorf("requesting an address claimed a second ago: %v, want 409", err)
	}
	// Allocation skips the young claim.
	ep, err := c.Endpoints(ns).Create(ctx, fixtures.Endpoint(ns, "allocated", sn, ""), metav1.CreateOptions{})
	must(t, err)
	if ep.Spec.IP != "10.95.1.5" {
		t.Errorf("allocated %s, want 10.95.1.5 (.2 and .3 are held, .4 is claimed by a create in flight)", ep.Spec.IP)
	}
}

// TestRepairDropsOrphans: the repair loop (every 200 ms here) drops an old claim
// whose owner does not exist, and keeps an old claim whose owner holds it.
func TestRepairDropsOrphans(t *testing.T) {
	ctx := testContext(t)
	c := client().NetworkingV1alpha1()
	_, sn := network(t, ctx, "10.96.0.0/16", "10.96.1.0/24")
	ns := unique(t, "repair")
	_, err := c.Endpoints(ns).Create(ctx, fixtures.Endpoint(ns, "live", sn, "10.96.1.2"), metav1.CreateOptions{})
	must(t, err)
	etcdc, err := etcd.NewClient(storagebackend.TransportConfig{ServerList: []string{"unix://" + server.DataDir + "/etcd/client.sock"}})
	must(t, err)
	defer etcdc.Close()
	resp, err := etcdc.Get(ctx, "/", clientv3.WithPrefix())
	must(t, err)
	var liveKey string
	var live claim.Owner
	for _, kv := range resp.Kvs {
		if strings.HasSuffix(string(kv.Key), "claims/ip/"+sn+"/10.96.1.2") {
			liveKey = string(kv.Key)
			must(t, json.Unmarshal(kv.Value, &live))
		}
	}
	if liveKey == "" {
		t.Fatal("no claim found for the live endpoint")
	}
	old := time.Now().Add(-claim.OrphanGrace - time.Minute)
	put := func(key string, o claim.Owner) {
		t.Helper()
		o.Time = old
		v, err := json.Marshal(o)
		must(t, err)
		_, err = etcdc.Put(ctx, key, string(v))
		must(t, err)
	}
	put(liveKey, live) // its owner holds it: kept however old
	orphanKey := strings.TrimSuffix(liveKey, "10.96.1.2") + "10.96.1.9"
	put(orphanKey, claim.Owner{Resource: "endpoints", Namespace: ns, Name: "never-stored", UID: "gone"})

	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := etcdc.Get(ctx, orphanKey)
		must(t, err)
		if len(r.Kvs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the repair loop did not drop an orphaned claim within 30 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	r, err := etcdc.Get(ctx, liveKey)
	must(t, err)
	if len(r.Kvs) == 0 {
		t.Fatal("the repair loop dropped the claim of a live endpoint")
	}
}

// TestClaimsWrittenWithTheObject: an allocated create is one etcd transaction:
// every claim of a created object (endpoint IP and MAC, VNI, subnet range,
// droplet address; by create and by server-side apply) was created at the
// object's own revision.
func TestClaimsWrittenWithTheObject(t *testing.T) {
	ctx := testContext(t)
	c := client().NetworkingV1alpha1()
	etcdc, err := etcd.NewClient(storagebackend.TransportConfig{ServerList: []string{"unix://" + server.DataDir + "/etcd/client.sock"}})
	must(t, err)
	defer etcdc.Close()
	vpcName, sn := unique(t, "vpc"), unique(t, "net")
	vpc, err := c.Vpcs().Create(ctx, fixtures.Vpc(vpcName, "10.97.0.0/16", 0), metav1.CreateOptions{})
	must(t, err)
	_, err = c.Subnets().Create(ctx, fixtures.Subnet(sn, vpcName, "10.97.1.0/24"), metav1.CreateOptions{})
	must(t, err)
	ns := unique(t, "onetxn")
	ep, err := c.Endpoints(ns).Create(ctx, fixtures.Endpoint(ns, "created", sn, ""), metav1.CreateOptions{})
	must(t, err)
	must(t, applyEndpoint(ctx, client(), ns, "applied", sn))
	applied, err := c.Endpoints(ns).Get(ctx, "applied", metav1.GetOptions{})
	must(t, err)
	droplet, err := c.Droplets().Create(ctx, fixtures.Droplet(unique(t, "drop"), uniqueIP()), metav1.CreateOptions{})
	must(t, err)

	resp, err := etcdc.Get(ctx, "/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	must(t, err)
	created := map[string]int64{} // claim key (after "/claims/") or object key -> create revision
	for _, kv := range resp.Kvs {
		if _, k, ok := strings.Cut(string(kv.Key), "/claims/"); ok {
			created[k] = kv.CreateRevision
		} else if i := strings.Index(string(kv.Key), "/networking.mizar.dev/"); i >= 0 {
			created[string(kv.Key)[i+1:]] = kv.CreateRevision
		}
	}
	for _, tc := range []struct {
		object string
		claims []string
	}{
		{"vpcs/" + vpcName, []string{fmt.Sprintf("vni/%d", vpc.Spec.VNI)}},
		{"subnets/" + sn, []string{"cidr/" + vpcName + "/10.97.1.0/24"}},
		{"endpoints/" + ns + "/created", []string{"ip/" + sn + "/" + ep.Spec.IP, "mac/" + sn + "/" + strings.ToLower(ep.Spec.MAC)}},
		{"endpoints/" + ns + "/applied", []string{"ip/" + sn + "/" + applied.Spec.IP, "mac/" + sn + "/" + strings.ToLower(applied.Spec.MAC)}},
		{"droplets/" + droplet.Name, []string{"droplet-ip/" + droplet.Spec.IP}},
	} {
		rev, ok := created["networking.mizar.dev/"+tc.object]
		if !ok {
			t.Errorf("no etcd key for %s", tc.object)
			continue
		}
		for _, k := range tc.claims {
			if crev, ok := created[k]; !ok {
				t.Errorf("%s: no claim %s", tc.object, k)
			} else if crev != rev {
				t.Errorf("%s: claim %s created at revision %d, the object at %d; want one transaction", tc.object, k, crev, rev)
			}
		}
	}
}
