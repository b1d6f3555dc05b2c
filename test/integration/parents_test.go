package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"

	brokerv1 "mizar.dev/pkg/apis/broker/v1alpha1"
	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/test/integration/fixtures"
)

// parentRaces is how many times each parent delete races a child create.
const parentRaces = 40

var setupBackoff = wait.Backoff{Steps: 30, Duration: 10 * time.Millisecond, Factor: 1.3, Jitter: 1}

// race is one parent delete racing one child create; exists reports whether
// the parent and the child are stored.
type race struct {
	name      string
	setupErr  error
	deleteErr error
	createErr error
	exists    func(ctx context.Context) (parent, child bool, err error)
}

// TestParentDeleteRacesChildCreate: a parent's delete and a child's create
// never both leave their mark so that the child outlives its parent. The
// child's create is written only if its parent is unchanged since it was
// checked, the parent holds the operators' finalizer from its create on, and
// the operators let it go only when etcd shows no child: each child created
// keeps its parent (Terminating) alive, each create after the delete is
// refused with a 4xx. Before, 11-20 of every 20-30 endpoints and up to 4 of 40
// subnets were orphaned.
func TestParentDeleteRacesChildCreate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s := apiservertest.Start(t, t.TempDir(), "--operators=true")
	c, b := s.Client.NetworkingV1alpha1(), s.Client.BrokerV1alpha1()
	const ns = "parents"
	u := runSuffix() // class names and OSB ids are cluster-wide

	mustCreate(t, func() error {
		_, err := c.Vpcs().Create(ctx, fixtures.Vpc("host-vpc", "10.60.0.0/16", 0), metav1.CreateOptions{})
		return err
	})
	mustCreate(t, func() error {
		_, err := c.Subnets().Create(ctx, fixtures.Subnet("host-net", "host-vpc", "10.60.0.0/20"), metav1.CreateOptions{})
		return err
	})

	pairs := map[string]func(i int) *race{
		"vpc/subnet": func(i int) *race {
			vpc, sn := fmt.Sprintf("rv-%d", i), fmt.Sprintf("rv-%d-net", i)
			r := &race{name: vpc}
			if _, r.setupErr = c.Vpcs().Create(ctx, fixtures.Vpc(vpc, fmt.Sprintf("10.%d.0.0/16", 100+i), 0), metav1.CreateOptions{}); r.setupErr != nil {
				return r
			}
			errs := fixtures.Race(2, func(j int) error {
				if j == 0 {
					lag(i)
					return c.Vpcs().Delete(ctx, vpc, metav1.DeleteOptions{})
				}
				_, err := c.Subnets().Create(ctx, fixtures.Subnet(sn, vpc, fmt.Sprintf("10.%d.1.0/24", 100+i)), metav1.CreateOptions{})
				return err
			})
			r.deleteErr, r.createErr = errs[0], errs[1]
			r.exists = func(ctx context.Context) (bool, bool, error) {
				return both(ctx, func() error { _, err := c.Vpcs().Get(ctx, vpc, metav1.GetOptions{}); return err },
					func() error { _, err := c.Subnets().Get(ctx, sn, metav1.GetOptions{}); return err })
			}
			return r
		},
		"subnet/endpoint": func(i int) *race {
			sn, ep := fmt.Sprintf("rs-%d", i), fmt.Sprintf("rs-%d-ep", i)
			r := &race{name: sn}
			// Subnets of one VPC created at once may answer 409 "kept changing".
			r.setupErr = retry.OnError(setupBackoff, apierrors.IsConflict, func() error {
				_, err := c.Subnets().Create(ctx, fixtures.Subnet(sn, "host-vpc", fmt.Sprintf("10.60.%d.0/24", 64+i)), metav1.CreateOptions{})
				return err
			})
			if r.setupErr != nil {
				return r
			}
			errs := fixtures.Race(2, func(j int) error {
				if j == 0 {
					lag(i)
					return c.Subnets().Delete(ctx, sn, metav1.DeleteOptions{})
				}
				e := fixtures.Endpoint(ns, ep, sn, "")
				e.Spec.Droplet = ""
				_, err := c.Endpoints(ns).Create(ctx, e, metav1.CreateOptions{})
				return err
			})
			r.deleteErr, r.createErr = errs[0], errs[1]
			r.exists = func(ctx context.Context) (bool, bool, error) {
				return both(ctx, func() error { _, err := c.Subnets().Get(ctx, sn, metav1.GetOptions{}); return err },
					func() error { _, err := c.Endpoints(ns).Get(ctx, ep, metav1.GetOptions{}); return err })
			}
			return r
		},
		"droplet/endpoint": func(i int) *race {
			drop, ep := fmt.Sprintf("rd-%d", i), fmt.Sprintf("rd-%d-ep", i)
			r := &race{name: drop}
			if _, r.setupErr = c.Droplets().Create(ctx, fixtures.Droplet(drop, fmt.Sprintf("192.168.70.%d", 10+i)), metav1.CreateOptions{}); r.setupErr != nil {
				return r
			}
			errs := fixtures.Race(2, func(j int) error {
				if j == 0 {
					lag(i)
					return c.Droplets().Delete(ctx, drop, metav1.DeleteOptions{})
				}
				e := fixtures.Endpoint(ns, ep, "host-net", "")
				e.Spec.Droplet = drop
				_, err := c.Endpoints(ns).Create(ctx, e, metav1.CreateOptions{})
				return err
			})
			r.deleteErr, r.createErr = errs[0], errs[1]
			r.exists = func(ctx context.Context) (bool, bool, error) {
				return both(ctx, func() error { _, err := c.Droplets().Get(ctx, drop, metav1.GetOptions{}); return err },
					func() error { _, err := c.Endpoints(ns).Get(ctx, ep, metav1.GetOptions{}); return err })
			}
			return r
		},
		"class/instance": func(i int) *race {
			class, in := fmt.Sprintf("rc-%d%s", i, u), fmt.Sprintf("rc-%d-order", i)
			r := &race{name: class}
			if _, r.setupErr = b.ServiceClasses().Create(ctx, serviceClass(class), metav1.CreateOptions{}); r.setupErr != nil {
				return r
			}
			errs := fixtures.Race(2, func(j int) error {
				// A class's delete lists its orders first (a consistent read,
				// tens of ms): the orders' creates are held back 0-195 ms, so
				// that some land before it and some after (on a quiet machine
				// about a third of them after; a busy one skews the mix).
				if j == 1 {
					time.Sleep(time.Duration(i%40) * 5 * time.Millisecond)
				}
				if j == 0 {
					return b.ServiceClasses().Delete(ctx, class, metav1.DeleteOptions{})
				}
				_, err := b.ServiceInstances(ns).Create(ctx, &brokerv1.ServiceInstance{
					ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: in},
					Spec:       brokerv1.ServiceInstanceSpec{Class: class, Plan: "small"},
				}, metav1.CreateOptions{})
				return err
			})
			r.deleteErr, r.createErr = errs[0], errs[1]
			r.exists = func(ctx context.Context) (bool, bool, error) {
				return both(ctx, func() error { _, err := b.ServiceClasses().Get(ctx, class, metav1.GetOptions{}); return err },
					func() error { _, err := b.ServiceInstances(ns).Get(ctx, in, metav1.GetOptions{}); return err })
			}
			return r
		},
	}
	for pair, run := range pairs {
		t.Run(pair, func(t *testing.T) {
			races := make([]*race, parentRaces)
			var wg sync.WaitGroup
			for i := range parentRaces {
				wg.Go(func() { races[i] = run(i) })
			}
			wg.Wait()
			for _, r := range races {
				if r.setupErr != nil {
					t.Fatalf("%s: creating the parent: %v", r.name, r.setupErr)
				}
			}
			created, refusals, kept := 0, map[string]int{}, 0
			for _, r := range races {
				if r.createErr != nil {
					refusals[string(apierrors.ReasonForError(r.createErr))]++
				}
				switch {
				case r.deleteErr == nil:
				case apierrors.IsInvalid(r.deleteErr) || apierrors.IsConflict(r.deleteErr):
					// A class that an order uses is not deleted.
					kept++
				default:
					t.Errorf("%s: delete of the parent: got %v, want success, 422 or 409", r.name, r.deleteErr)
				}
				switch {
				case r.createErr == nil:
					created++
				case apierrors.IsInvalid(r.createErr) || apierrors.IsConflict(r.createErr):
				default:
					t.Errorf("%s: create of the child: got %v, want success, 422 or 409", r.name, r.createErr)
				}
			}
			// A parent goes once its operator has drained it; one with a child
			// stays Terminating until the child goes.
			orphans, stuck := 0, 0
			err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
				orphans, stuck = 0, 0
				for _, r := range races {
					parent, child, err := r.exists(ctx)
					if err != nil {
						return false, err
					}
					if child && !parent {
						orphans++
					}
					if parent && !child {
						stuck++
					}
				}
				return orphans > 0 || stuck == 0, nil
			})
			if err != nil && orphans == 0 {
				t.Fatalf("%d of %d deleted parents without a child are still stored: %v", stuck, parentRaces, err)
			}
			t.Logf("%s: %d of %d children created, the others refused: %v; %d parent deletes refused", pair, created, parentRaces, refusals, kept)
			if orphans > 0 {
				t.Errorf("%d of %d children outlived their deleted parent", orphans, parentRaces)
			}
		})
	}
}

// serviceClass is a catalog entry with one plan, "small", and OSB ids of its own.
func serviceClass(name string) *brokerv1.ServiceClass {
	return &brokerv1.ServiceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: brokerv1.ServiceClassSpec{
			ID: name + "-id", Description: "a class raced by its orders", Image: "busybox:1.36",
			Plans: []brokerv1.ServicePlan{{Name: "small", ID: name + "-small", Description: "one replica", Replicas: 1,
				CPU: resource.MustParse("100m"), Memory: resource.MustParse("64Mi"), Storage: resource.MustParse("1Gi")}},
		},
	}
}

// lag delays a parent's delete by 0-27 ms, so that of the races some child
// creates land before the delete and some after: a child's create does more
// (reads, allocation) than a delete.
func lag(i int) { time.Sleep(time.Duration(i%10) * 3 * time.Millisecond) }

// both reports which of two objects exist.
func both(ctx context.Context, parent, child func() error) (bool, bool, error) {
	var out [2]bool
	for i, get := range []func() error{parent, child} {
		err := get()
		if err != nil && !apierrors.IsNotFound(err) {
			return false, false, err
		}
		out[i] = err == nil
	}
	return out[0], out[1], nil
}

// TestOperatorFinalizerStaysWhileDependantsRemain: the operators' finalizer
// cannot be taken off a VPC that is not being deleted, nor off a deleting VPC
// whose subnets remain (that removal orphaned them); once they are gone the
// VPC goes.
func TestOperatorFinalizerStaysWhileDependantsRemain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := apiservertest.Start(t, t.TempDir(), "--operators=true")
	c := s.Client.NetworkingV1alpha1()
	vpc, err := c.Vpcs().Create(ctx, fixtures.Vpc("held", "10.61.0.0/16", 0), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(vpc.Finalizers) != 1 {
		t.Fatalf("a VPC created with operators holds finalizers %v, want the operators' one", vpc.Finalizers)
	}
	if _, err := c.Subnets().Create(ctx, fixtures.Subnet("held-net", "held", "10.61.1.0/24"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	strip := func() error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			v, err := c.Vpcs().Get(ctx, "held", metav1.GetOptions{})
			if err != nil {
				return err
			}
			v.Finalizers = nil
			_, err = c.Vpcs().Update(ctx, v, metav1.UpdateOptions{})
			return err
		})
	}
	if err := strip(); !apierrors.IsInvalid(err) {
		t.Errorf("removing the finalizer of a VPC not being deleted: got %v, want 422", err)
	}
	if err := c.Vpcs().Delete(ctx, "held", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := strip(); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "held-net") {
		t.Errorf("removing the finalizer of a deleting VPC with a subnet: got %v, want 422 naming the subnet", err)
	}
	if err := c.Subnets().Delete(ctx, "held-net", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.Vpcs().Get(ctx, "held", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Errorf("the VPC did not go once its subnet went: %v", err)
	}
}
