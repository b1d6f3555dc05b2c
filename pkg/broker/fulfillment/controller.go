// Package fulfillment is the broker's fulfillment operator: it turns each
// ServiceInstance (an order) into a Secret, a headless Service and a StatefulSet
// in the workload cluster, as a saga whose progress lives in the order's status.
// It is woken by watches only: on the order, on the Subnet an order waits for,
// and on the StatefulSets it made; timers exist only for backoff and deadlines.
package fulfillment

import (
	"context"
	"fmt"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	brokerv1 "mizar.dev/pkg/apis/broker/v1alpha1"
	networkingv1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/broker/saga"
	"mizar.dev/pkg/generated/clientset/versioned"
	brokerclient "mizar.dev/pkg/generated/clientset/versioned/typed/broker/v1alpha1"
	"mizar.dev/pkg/generated/informers/externalversions"
	brokerlisters "mizar.dev/pkg/generated/listers/broker/v1alpha1"
	networkinglisters "mizar.dev/pkg/generated/listers/networking/v1alpha1"
)

// ElectionKey is the etcd prefix mizar-apiserver replicas campaign under for
// running this operator: one leader advances orders at a time.
const ElectionKey = "/mizar/broker/fulfillment/leader"

// subnetIndex finds the orders waiting for a subnet.
const subnetIndex = "spec.subnet"

// Controller is the fulfillment operator.
type Controller struct {
	// Backoff for transient errors; zero uses saga.DefaultBackoff.
	Backoff saga.Backoff
	// Events, when set, gets the orders' StepRetrying, StepFailed and
	// StepNotUndone Events (events.go).
	Events record.EventRecorder

	orders    brokerclient.BrokerV1alpha1Interface
	workload  kubernetes.Interface
	instances brokerlisters.ServiceInstanceLister
	classes   brokerlisters.ServiceClassLister
	subnets   networkinglisters.SubnetLister
	byIndex   cache.Indexer
	queue     workqueue.TypedRateLimitingInterface[cache.ObjectName]

	bindingIndex cache.Indexer
	bindingQueue workqueue.TypedRateLimitingInterface[cache.ObjectName]
	synced       []cache.InformerSynced
	now          func() time.Time
	start        func(<-chan struct{})
}

// New wires the operator to mizar (orders, classes, subnets) and to the
// workload cluster (the StatefulSets it makes).
func New(mizar versioned.Interface, workload kubernetes.Interface) (*Controller, error) {
	mf := externalversions.NewSharedInformerFactory(mizar, 0)
	kf := kubeinformers.NewSharedInformerFactoryWithOptions(workload, 0,
		kubeinformers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelManagedBy + "=" + managedBy }))
	instInf := mf.Broker().V1alpha1().ServiceInstances()
	subnetInf := mf.Networking().V1alpha1().Subnets()
	classInf := mf.Broker().V1alpha1().ServiceClasses()
	stsInf := kf.Apps().V1().StatefulSets()
	bindInf := mf.Broker().V1alpha1().ServiceBindings()

	c := &Controller{
		orders:    mizar.BrokerV1alpha1(),
		workload:  workload,
		instances: instInf.Lister(),
		classes:   classInf.Lister(),
		subnets:   subnetInf.Lister(),
		byIndex:   instInf.Informer().GetIndexer(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[cache.ObjectName](),
			workqueue.TypedRateLimitingQueueConfig[cache.ObjectName]{Name: "fulfillment"}),
		bindingIndex: bindInf.Informer().GetIndexer(),
		bindingQueue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[cache.ObjectName](),
			workqueue.TypedRateLimitingQueueConfig[cache.ObjectName]{Name: "fulfillment-bindings"}),
		now: time.Now,
	}
	if err := bindInf.Informer().AddIndexers(cache.Indexers{instanceIndex: bindingInstanceKey}); err != nil {
		return nil, fmt.Errorf("indexing bindings by instance: %w", err)
	}
	if err := instInf.Informer().AddIndexers(cache.Indexers{subnetIndex: func(obj any) ([]string, error) {
		if in, ok := obj.(*brokerv1.ServiceInstance); ok && in.Spec.Subnet != "" {
			return []string{in.Spec.Subnet}, nil
		}
		return nil, nil
	}}); err != nil {
		return nil, fmt.Errorf("indexing orders by subnet: %w", err)
	}
	enqueue := func(obj any) {
		if key, err := cache.ObjectToName(obj); err == nil {
			c.queue.Add(key)
		}
	}
	handlers := []struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandler
	}{
		{instInf.Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc: func(o any) { enqueue(o); c.instanceChanged(o) },
			UpdateFunc: func(old, o any) {
				// Our own status writes come back as updates; acting on them would
				// skip the backoff. Only what someone else changes wakes the order.
				if ordered(old, o) {
					enqueue(o)
				}
				c.instanceChanged(o)
			},
			DeleteFunc: c.instanceChanged,
		}},
		{bindInf.Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { c.enqueueBinding(o) },
			UpdateFunc: func(_, o any) { c.enqueueBinding(o) },
		}},
		{subnetInf.Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc:    c.subnetChanged,
			UpdateFunc: func(_, o any) { c.subnetChanged(o) },
		}},
		// A class may arrive after an order that names it.
		{classInf.Informer(), cache.ResourceEventHandlerFuncs{}},
		{stsInf.Informer(), cache.ResourceEventHandlerFuncs{
			UpdateFunc: func(_, o any) { c.statefulSetChanged(o) },
			DeleteFunc: c.statefulSetChanged,
		}},
	}
	for _, h := range handlers {
		if _, err := h.inf.AddEventHandler(h.h); err != nil {
			return nil, fmt.Errorf("watching: %w", err)
		}
		c.synced = append(c.synced, h.inf.HasSynced)
	}
	c.start = func(stop <-chan struct{}) {
		mf.Start(stop)
		kf.Start(stop)
	}
	return c, nil
}

func (c *Controller) subnetChanged(obj any) {
	s, ok := obj.(*networkingv1.Subnet)
	if !ok {
		return
	}
	orders, err := c.byIndex.ByIndex(subnetIndex, s.Name)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	for _, o := range orders {
		if key, err := cache.ObjectToName(o); err == nil {
			c.queue.Add(key)
		}
	}
}

func (c *Controller) statefulSetChanged(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	sts, ok := obj.(*appsv1.StatefulSet)
	if !ok {
		return
	}
	if name := sts.Labels[LabelInstance]; name != "" {
		c.queue.Add(cache.ObjectName{Namespace: sts.Namespace, Name: name})
	}
}

// Run serves until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) error {
	defer utilruntime.HandleCrash()
	defer c.queue.ShutDown()
	defer c.bindingQueue.ShutDown()
	c.start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		// Stopped while starting is a stop like any other.
		return nil
	}
	klog.InfoS("Fulfillment operator started", "workers", workers)
	for i := 0; i < workers; i++ {
		go wait.UntilWithContext(ctx, c.worker, time.Second)
	}
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		for c.nextBinding(ctx) {
		}
	}, time.Second)
	<-ctx.Done()
	return nil
}

func (c *Controller) worker(ctx context.Context) {
	for c.next(ctx) {
	}
}

func (c *Controller) next(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	after, err := c.reconcile(ctx, key.Namespace, key.Name)
	if err != nil {
		// Conflicts and lost writes: the rate limiter spaces the retries.
		utilruntime.HandleError(fmt.Errorf("order %s: %w", key, err))
		c.queue.AddRateLimited(key)
		return true
	}
	c.queue.Forget(key)
	if after > 0 {
		c.queue.AddAfter(key, after)
	}
	return true
}

func (c *Controller) enqueueBinding(obj any) {
	if key, err := cache.ObjectToName(obj); err == nil {
		c.bindingQueue.Add(key)
	}
}

func (c *Controller) nextBinding(ctx context.Context) bool {
	key, quit := c.bindingQueue.Get()
	if quit {
		return false
	}
	defer c.bindingQueue.Done(key)
	if err := c.reconcileBinding(ctx, key.Namespace, key.Name); err != nil {
		utilruntime.HandleError(fmt.Errorf("binding %s: %w", key, err))
		c.bindingQueue.AddRateLimited(key)
		return true
	}
	c.bindingQueue.Forget(key)
	return true
}

// ordered reports whether an update of an order changed what its owner asks
// for: the spec (generation), deletion, or finalizers.
func ordered(oldObj, newObj any) bool {
	o, ok1 := oldObj.(*brokerv1.ServiceInstance)
	n, ok2 := newObj.(*brokerv1.ServiceInstance)
	if !ok1 || !ok2 {
		return true
	}
	return o.Generation != n.Generation || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil) ||
		!slices.Equal(o.Finalizers, n.Finalizers)
}
