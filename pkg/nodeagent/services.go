package nodeagent

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"mizar.dev/pkg/dataplane"
	"mizar.dev/pkg/services"
)

// The --services modes: who translates Services.
const (
	ServicesKubeProxy = "kube-proxy" // kube-proxy (the default): the programs carry no Service code
	ServicesBPF       = "bpf"        // mizar's pod program (pkg/services, dataplane.UpsertService)
)

// ServiceProgrammer is what the Service controller asks of the dataplane
// (pkg/dataplane's Datapath, loaded with Options.Services).
type ServiceProgrammer interface {
	SetServices(all []dataplane.Service) error
}

// ServiceOptions configure NewServiceController.
type ServiceOptions struct {
	// Workload is the cluster whose Services and EndpointSlices are
	// translated.
	Workload kubernetes.Interface
	DP       ServiceProgrammer
	// NodeName decides internalTrafficPolicy Local.
	NodeName string
	// Resync bounds how long a failed sync waits before the next try.
	Resync time.Duration
}

// ServiceController keeps the node's Service maps equal to what the
// workload cluster's Services and EndpointSlices say. Level triggered, as
// the policy controller: any change rebuilds the whole set (pkg/services)
// and SetServices writes it, ids kept, stale frontends removed.
type ServiceController struct {
	o       ServiceOptions
	factory kubeinformers.SharedInformerFactory
	svcs    corelisters.ServiceLister
	slices  discoverylisters.EndpointSliceLister
	synced  []cache.InformerSynced
	kick    chan struct{}

	mu        sync.Mutex
	frontends int
	lastErr   error
}

// NewServiceController sets up the informers; Run starts them.
func NewServiceController(o ServiceOptions) *ServiceController {
	if o.Resync <= 0 {
		o.Resync = 5 * time.Second
	}
	f := kubeinformers.NewSharedInformerFactory(o.Workload, 10*time.Minute)
	c := &ServiceController{o: o, factory: f, kick: make(chan struct{}, 1),
		svcs: f.Core().V1().Services().Lister(), slices: f.Discovery().V1().EndpointSlices().Lister()}
	poke := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.poke() },
		UpdateFunc: func(any, any) { c.poke() },
		DeleteFunc: func(any) { c.poke() },
	}
	for _, inf := range []cache.SharedIndexInformer{f.Core().V1().Services().Informer(), f.Discovery().V1().EndpointSlices().Informer()} {
		_, _ = inf.AddEventHandler(poke)
		c.synced = append(c.synced, inf.HasSynced)
	}
	return c
}

func (c *ServiceController) poke() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Run watches and programs until ctx ends.
func (c *ServiceController) Run(ctx context.Context) error {
	c.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return fmt.Errorf("services: informers did not sync: %w", ctx.Err())
	}
	klog.InfoS("Service controller started: the pod program translates Services", "node", c.o.NodeName)
	c.poke()
	retry := time.NewTimer(c.o.Resync)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.kick:
		case <-retry.C:
		}
		err := c.sync()
		c.mu.Lock()
		c.lastErr = err
		c.mu.Unlock()
		if err != nil {
			klog.ErrorS(err, "Programming Services failed; retrying", "in", c.o.Resync)
			retry.Reset(c.o.Resync)
		}
	}
}

// Status returns the frontends programmed by the last successful sync and
// the error of a later failed one.
func (c *ServiceController) Status() (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frontends, c.lastErr
}

func (c *ServiceController) sync() error {
	start := time.Now()
	svcs, err := c.svcs.List(labels.Everything())
	if err != nil {
		return err
	}
	ess, err := c.slices.List(labels.Everything())
	if err != nil {
		return err
	}
	built := services.Build(services.Input{Services: svcs, EndpointSlices: ess, NodeName: c.o.NodeName})
	if len(built) > dataplane.MaxServices {
		// Programmed in order; the rest stay with whatever serves them.
		klog.ErrorS(nil, "More Service ports than the maps hold; the rest are not translated", "ports", len(built), "max", dataplane.MaxServices)
		built = built[:dataplane.MaxServices]
	}
	all := make([]dataplane.Service, 0, len(built))
	for _, s := range built {
		all = append(all, dataplane.Service{Frontend: dataplane.Frontend{VIP: s.VIP, Port: s.Port, Proto: dataplane.Protocol(s.Proto)},
			Backends: s.Backends, AffinityTimeout: s.AffinityTimeout})
	}
	if err := c.o.DP.SetServices(all); err != nil {
		return fmt.Errorf("program Services: %w", err)
	}
	c.mu.Lock()
	c.frontends = len(all)
	c.mu.Unlock()
	klog.V(2).InfoS("Programmed Services", "frontends", len(all), "took", time.Since(start))
	return nil
}
