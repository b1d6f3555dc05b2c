package workflow

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/storage/storagebackend"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/etcd"
	"mizar.dev/pkg/operators"
)

// replica is one operator replica running in the test process.
type replica struct {
	name   string
	cancel context.CancelFunc
	done   chan struct{}
	kill   func() // a crash: the etcd client dies without resigning
}

func TestLeaderFailover(t *testing.T) {
	ctx := testContext(t)
	srv := startServer(t, "--operators=false")
	c := srv.Client.NetworkingV1alpha1()
	p := uniq("fo")

	var mu sync.Mutex
	leading := map[string]bool{}
	leaders := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for n, l := range leading {
			if l {
				out = append(out, n)
			}
		}
		return out
	}
	startReplica := func(name string) *replica {
		client, err := etcd.NewClient(storagebackend.TransportConfig{
			ServerList: []string{"unix://" + filepath.Join(srv.DataDir, "etcd", "client.sock")}})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(context.Background())
		r := &replica{name: name, cancel: cancel, done: make(chan struct{})}
		r.kill = func() { _ = client.Close(); cancel(); <-r.done }
		go func() {
			defer close(r.done)
			_ = operators.Run(rctx, operators.Options{
				Config: srv.Config, Etcd: client, Identity: name, LeaseTTL: 3,
				OnLeading: func(l bool) {
					mu.Lock()
					defer mu.Unlock()
					if l {
						for other, ol := range leading {
							if ol {
								t.Errorf("%s leads while %s still leads", name, other)
							}
						}
					}
					leading[name] = l
				},
			})
		}()
		t.Cleanup(func() { cancel(); <-r.done; _ = client.Close() })
		return r
	}
	replicas := map[string]*replica{}
	for _, n := range []string{"replica-a", "replica-b"} {
		replicas[n] = startReplica(n)
	}
	eventually(t, ctx, "a leader", func() (bool, error) { return len(leaders()) == 1, nil })
	first := leaders()[0]

	for i := range 2 {
		startAgent(t, srv.Client, fmt.Sprintf("%s-node%d", p, i), i)
	}
	vpc, err := c.Vpcs().Create(ctx, &v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: p}, Spec: v1alpha1.VpcSpec{CIDR: "10.2.0.0/16"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subnets().Create(ctx, &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: p + "-a"}, Spec: v1alpha1.SubnetSpec{VPC: vpc.Name, CIDR: "10.2.1.0/24", Bouncers: 2}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Mid-workflow: the leader has started on the VPC (its dividers exist).
	eventually(t, ctx, "the VPC's divider created", func() (bool, error) {
		_, err := c.Dividers().Get(ctx, vpc.Name+"-d-0", metav1.GetOptions{})
		return err == nil, nil
	})
	replicas[first].kill()
	eventually(t, ctx, "the other replica leading", func() (bool, error) {
		l := leaders()
		return len(l) == 1 && l[0] != first, nil
	})
	eventually(t, ctx, "the workflow finished by the new leader", func() (bool, error) {
		s, err := c.Subnets().Get(ctx, sub.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		v, err := c.Vpcs().Get(ctx, vpc.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return s.Status.Phase == v1alpha1.PhaseProvisioned && v.Status.Phase == v1alpha1.PhaseProvisioned, nil
	})
}
