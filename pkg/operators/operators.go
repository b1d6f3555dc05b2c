// Package operators runs mizar's cluster-wide operators (VPC, Subnet, Endpoint,
// Divider, Bouncer and Droplet placement) inside mizar-apiserver. Only the
// leader runs them (package leader: an election on mizar's own etcd).
package operators

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"mizar.dev/pkg/generated/clientset/versioned"
	informers "mizar.dev/pkg/generated/informers/externalversions"
	"mizar.dev/pkg/leader"
	"mizar.dev/pkg/operators/bouncer"
	"mizar.dev/pkg/operators/divider"
	"mizar.dev/pkg/operators/droplet"
	"mizar.dev/pkg/operators/endpoint"
	"mizar.dev/pkg/operators/phases"
	"mizar.dev/pkg/operators/subnet"
	"mizar.dev/pkg/operators/vpc"
)

// ElectionKey is the etcd prefix replicas campaign under.
const ElectionKey = "/mizar/operators/leader"

// Options configure a replica.
type Options struct {
	// Config reaches mizar-apiserver (the loopback config inside the server).
	Config *rest.Config
	// Etcd is mizar's own etcd, where the election runs.
	Etcd *clientv3.Client
	// Identity names this replica in the election; defaults to host and a random suffix.
	Identity string
	// LeaseTTL is how long a silent leader keeps leadership, in seconds; default 5.
	LeaseTTL int
	// Workers per operator; default 4.
	Workers int
	// EndpointWorkers is the Endpoint operator's, which has one key per endpoint
	// and as many endpoints in flight as CNI ADDs; default 16.
	EndpointWorkers int
	// ClientQPS and ClientBurst limit each operator's client; 0 keeps Config's.
	ClientQPS   float32
	ClientBurst int
	// OnLeading, if set, is told when this replica starts and stops leading.
	OnLeading func(leading bool)
	// Events, when set, is the cluster the operators post Kubernetes Events
	// to (core/v1): objects stuck in Init, agents not acknowledging.
	Events kubernetes.Interface
	// StuckAfter is how long an object may wait in Init before its Event
	// (phases.DefaultStuckAfter when 0).
	StuckAfter time.Duration
}

// Run campaigns for leadership until ctx ends and runs the operators while leading.
func Run(ctx context.Context, o Options) error {
	if o.Config == nil || o.Etcd == nil {
		return errors.New("operators: a client config and an etcd client are required")
	}
	if o.Workers == 0 {
		o.Workers = 4
	}
	if o.EndpointWorkers == 0 {
		o.EndpointWorkers = 16
	}
	return leader.Run(ctx, leader.Options{
		Etcd: o.Etcd, Key: ElectionKey, Name: "Operators",
		Identity: o.Identity, LeaseTTL: o.LeaseTTL, OnLeading: o.OnLeading,
	}, func(ctx context.Context) error { return runOperators(ctx, o) })
}

// runOperators starts the informers and every operator and blocks until ctx ends.
func runOperators(ctx context.Context, o Options) error {
	// Each operator writes with its own user agent: managedFields names it as the
	// manager of what it wrote, which is how tests check one writer per transition.
	clientFor := func(name string) (versioned.Interface, error) {
		cfg := rest.CopyConfig(o.Config)
		cfg.UserAgent = name
		if o.ClientQPS > 0 {
			cfg.QPS, cfg.Burst = o.ClientQPS, o.ClientBurst
		}
		return versioned.NewForConfig(cfg)
	}
	reader, err := clientFor("mizar-operators")
	if err != nil {
		return err
	}
	factory := informers.NewSharedInformerFactory(reader, 10*time.Minute)
	var events record.EventRecorder
	if o.Events != nil {
		b := record.NewBroadcaster(record.WithContext(ctx))
		b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: o.Events.CoreV1().Events("")})
		defer b.Shutdown()
		events = b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "mizar-operators"})
	}
	if _, err := phases.New(factory, events, o.StuckAfter); err != nil {
		return err
	}
	type runner interface{ Run(context.Context, int) }
	type running struct {
		runner
		workers int
	}
	var runners []running
	for _, mk := range []struct {
		name string
		new  func(versioned.Interface, informers.SharedInformerFactory) (runner, error)
	}{
		{"mizar-vpc-operator", func(c versioned.Interface, f informers.SharedInformerFactory) (runner, error) { return vpc.New(c, f) }},
		{"mizar-subnet-operator", func(c versioned.Interface, f informers.SharedInformerFactory) (runner, error) {
			return subnet.New(c, f)
		}},
		{"mizar-droplet-operator", func(c versioned.Interface, f informers.SharedInformerFactory) (runner, error) {
			return droplet.New(c, f)
		}},
		{"mizar-endpoint-operator", func(c versioned.Interface, f informers.SharedInformerFactory) (runner, error) {
			op, err := endpoint.New(c, f)
			if err == nil && events != nil {
				op.SetEvents(events, o.StuckAfter)
			}
			return op, err
		}},
		{"mizar-divider-operator", func(c versioned.Interface, f informers.SharedInformerFactory) (runner, error) {
			return divider.New(c, f)
		}},
		{"mizar-bouncer-operator", func(c versioned.Interface, f informers.SharedInformerFactory) (runner, error) {
			return bouncer.New(c, f)
		}},
	} {
		c, err := clientFor(mk.name)
		if err != nil {
			return err
		}
		r, err := mk.new(c, factory)
		if err != nil {
			return fmt.Errorf("%s: %w", mk.name, err)
		}
		workers := o.Workers
		if mk.name == "mizar-endpoint-operator" {
			workers = o.EndpointWorkers
		}
		runners = append(runners, running{r, workers})
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("informer of %v did not sync", typ)
		}
	}
	var wg sync.WaitGroup
	for _, r := range runners {
		wg.Go(func() { r.Run(ctx, r.workers) })
	}
	wg.Wait()
	return nil
}
