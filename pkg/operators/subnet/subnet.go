// Package subnet is the Subnet operator (the seed's Network operator): it waits
// for the subnet's VPC to be Provisioned, creates the subnet's bouncers, moves the
// subnet from Init to Provisioned once all of them are, and on deletion waits for
// the subnet's endpoints before it drains the bouncers.
package subnet

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/generated/clientset/versioned"
	informers "mizar.dev/pkg/generated/informers/externalversions"
	listers "mizar.dev/pkg/generated/listers/networking/v1alpha1"
	"mizar.dev/pkg/operators/owner"
	"mizar.dev/pkg/operators/reconcile"
)

// Condition types and reasons the Subnet operator writes.
const (
	ConditionVpcReady      = "VpcReady"
	ConditionBouncersReady = "BouncersReady"
	ConditionDeleting      = "Deleting"
	ConditionAddresses     = "AddressesAvailable"

	ReasonVpcNotFound       = "VpcNotFound"
	ReasonVpcNotProvisioned = "VpcNotProvisioned"
	ReasonVpcTerminating    = "VpcTerminating"
	ReasonOutsideVpc        = "CIDROutsideVpc"
	ReasonVpcProvisioned    = "VpcProvisioned"
	ReasonProvisioned       = "AllBouncersProvisioned"
	ReasonWaiting           = "BouncersNotProvisioned"
	ReasonEndpointsRemain   = "EndpointsRemain"
	ReasonDraining          = "DrainingBouncers"
	ReasonExhausted         = "SubnetExhausted"
	ReasonFree              = "AddressesFree"
)

// SubnetOperator is the one writer of a subnet's phase.
type SubnetOperator struct {
	client   versioned.Interface
	subnets  listers.SubnetLister
	vpcs     listers.VpcLister
	bouncers cache.SharedIndexInformer
	loop     *reconcile.Loop
	kind     owner.Kind[*v1alpha1.Subnet, *v1alpha1.Bouncer]

	// endpoints counts each subnet's endpoints, kept from the endpoint
	// informer's events: a reconcile per endpoint create must not copy the
	// subnet's every endpoint out of the index.
	mu        sync.Mutex
	endpoints map[string]map[string]bool // subnet -> endpoint keys
}

// New wires the operator to shared informers; call before the factory starts.
func New(client versioned.Interface, f informers.SharedInformerFactory) (*SubnetOperator, error) {
	n := f.Networking().V1alpha1()
	o := &SubnetOperator{
		client:    client,
		subnets:   n.Subnets().Lister(),
		vpcs:      n.Vpcs().Lister(),
		bouncers:  n.Bouncers().Informer(),
		endpoints: map[string]map[string]bool{},
	}
	o.loop = reconcile.New("subnet-operator", o.Reconcile)
	o.kind = owner.Kind[*v1alpha1.Subnet, *v1alpha1.Bouncer]{
		Client:    client.NetworkingV1alpha1().Subnets(),
		DeepCopy:  (*v1alpha1.Subnet).DeepCopy,
		Status:    func(s *v1alpha1.Subnet) *v1alpha1.ProvisioningStatus { return &s.Status.ProvisioningStatus },
		Child:     "bouncer",
		ChildName: BouncerName,
		CreateChild: func(ctx context.Context, s *v1alpha1.Subnet, name string) error {
			_, err := client.NetworkingV1alpha1().Bouncers().Create(ctx, &v1alpha1.Bouncer{
				ObjectMeta: metav1.ObjectMeta{Name: name, OwnerReferences: []metav1.OwnerReference{
					*metav1.NewControllerRef(s, v1alpha1.SchemeGroupVersion.WithKind("Subnet"))}},
				Spec: v1alpha1.BouncerSpec{Subnet: s.Name},
			}, metav1.CreateOptions{})
			return err
		},
		DeleteChild: func(ctx context.Context, name string) error {
			return client.NetworkingV1alpha1().Bouncers().Delete(ctx, name, metav1.DeleteOptions{})
		},
		ChildState: func(b *v1alpha1.Bouncer) (v1alpha1.Phase, []metav1.Condition, string) {
			return b.Status.Phase, b.Status.Conditions, b.Spec.Droplet
		},
	}
	subnets := n.Subnets().Informer()
	for _, ix := range []struct {
		inf  cache.SharedIndexInformer
		name string
		fn   cache.IndexFunc
	}{
		{o.bouncers, reconcile.BySubnet, reconcile.BouncerBySubnet},
		{subnets, reconcile.ByVPC, reconcile.SubnetByVPC},
	} {
		if err := reconcile.AddIndex(ix.inf, ix.name, ix.fn); err != nil {
			return nil, err
		}
	}
	if _, err := subnets.AddEventHandler(o.loop.Handler()); err != nil {
		return nil, err
	}
	if _, err := o.bouncers.AddEventHandler(o.loop.MapHandler(func(obj any) []string {
		return []string{obj.(*v1alpha1.Bouncer).Spec.Subnet}
	})); err != nil {
		return nil, err
	}
	// Endpoints coming and going: address use, and a deleting subnet waits for
	// them. An endpoint's subnet never changes, so adds and deletes are all.
	if _, err := n.Endpoints().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { o.countEndpoint(obj, true) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			o.countEndpoint(obj, false)
		},
	}); err != nil {
		return nil, err
	}
	if _, err := n.Vpcs().Informer().AddEventHandler(o.loop.MapHandler(func(obj any) []string {
		var keys []string
		for _, s := range reconcile.ByIndex[*v1alpha1.Subnet](subnets, reconcile.ByVPC, obj.(*v1alpha1.Vpc).Name) {
			keys = append(keys, s.Name)
		}
		return keys
	})); err != nil {
		return nil, err
	}
	return o, nil
}

// countEndpoint records an endpoint added or deleted and queues its subnet.
func (o *SubnetOperator) countEndpoint(obj any, added bool) {
	ep := obj.(*v1alpha1.Endpoint)
	key := ep.Namespace + "/" + ep.Name
	o.mu.Lock()
	eps := o.endpoints[ep.Spec.Subnet]
	if added {
		if eps == nil {
			eps = map[string]bool{}
			o.endpoints[ep.Spec.Subnet] = eps
		}
		eps[key] = true
	} else {
		delete(eps, key)
		if len(eps) == 0 {
			delete(o.endpoints, ep.Spec.Subnet)
		}
	}
	o.mu.Unlock()
	o.loop.Queue.Add(ep.Spec.Subnet)
}

// endpointsOf returns how many endpoints a subnet has and one of them.
func (o *SubnetOperator) endpointsOf(subnet string) (n int, one string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for k := range o.endpoints[subnet] {
		one = k
		break
	}
	return len(o.endpoints[subnet]), one
}

// Run reconciles until ctx ends.
func (o *SubnetOperator) Run(ctx context.Context, workers int) { o.loop.Run(ctx, workers) }

// BouncerName is the name of a subnet's i-th bouncer.
func BouncerName(subnet string, i int32) string { return fmt.Sprintf("%s-b-%d", subnet, i) }

// Reconcile brings one subnet towards its spec.
func (o *SubnetOperator) Reconcile(ctx context.Context, name string) error {
	s, err := o.subnets.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	bouncers := o.ownBouncers(s)
	if s.DeletionTimestamp != nil {
		return o.drain(ctx, s, bouncers)
	}
	if s, err = o.kind.EnsureFinalizer(ctx, s); err != nil {
		return err
	}
	st := s.Status.DeepCopy()
	st.ObservedGeneration = s.Generation
	if st.Phase == "" {
		st.Phase = v1alpha1.PhaseInit
	}

	// Address use: a full subnet refuses new endpoints, and says so here too.
	used, _ := o.endpointsOf(s.Name)
	if free, ok := freeAddresses(s, used); ok {
		if free > 0 {
			reconcile.SetCondition(&st.Conditions, s.Generation, ConditionAddresses, true, ReasonFree, "the subnet has free addresses")
		} else {
			reconcile.SetCondition(&st.Conditions, s.Generation, ConditionAddresses, false, ReasonExhausted,
				fmt.Sprintf("every address of %s is in use: new endpoints are refused; delete unused endpoints or add a subnet", s.Spec.CIDR))
		}
	}

	// The VPC must be there and serving before the subnet's bouncers are worth creating.
	ok, reason, msg := o.vpcReady(s)
	reconcile.SetCondition(&st.Conditions, s.Generation, ConditionVpcReady, ok, reason, msg)
	if !ok {
		if st.Phase == v1alpha1.PhaseProvisioned && reason != ReasonVpcNotProvisioned {
			st.Phase = v1alpha1.PhaseFailed
		}
		return o.kind.WriteStatus(ctx, s, &st.ProvisioningStatus)
	}

	want := max(s.Spec.Bouncers, 1)
	ready, waiting, err := o.kind.Scale(ctx, s, want, bouncers)
	if err != nil {
		return err
	}
	if ready == want {
		st.Phase = v1alpha1.PhaseProvisioned
		reconcile.SetCondition(&st.Conditions, s.Generation, ConditionBouncersReady, true, ReasonProvisioned,
			fmt.Sprintf("%d of %d bouncers are Provisioned", ready, want))
	} else {
		reconcile.SetCondition(&st.Conditions, s.Generation, ConditionBouncersReady, false, ReasonWaiting,
			fmt.Sprintf("%d of %d bouncers are Provisioned; waiting for %s", ready, want, strings.Join(waiting, "; ")))
	}
	return o.kind.WriteStatus(ctx, s, &st.ProvisioningStatus)
}

// vpcReady says whether the subnet's VPC exists, is Provisioned and still
// contains the subnet (a VPC re-created with another CIDR may not).
func (o *SubnetOperator) vpcReady(s *v1alpha1.Subnet) (bool, string, string) {
	vpc, err := o.vpcs.Get(s.Spec.VPC)
	if err != nil {
		return false, ReasonVpcNotFound, fmt.Sprintf("VPC %s does not exist: create it, or delete this subnet and create it in an existing VPC", s.Spec.VPC)
	}
	if vpc.DeletionTimestamp != nil {
		return false, ReasonVpcTerminating, fmt.Sprintf("VPC %s is being deleted", vpc.Name)
	}
	if p, err := netip.ParsePrefix(vpc.Spec.CIDR); err == nil {
		if q, err := netip.ParsePrefix(s.Spec.CIDR); err == nil && (q.Bits() < p.Bits() || !p.Contains(q.Addr())) {
			return false, ReasonOutsideVpc, fmt.Sprintf("cidr %s is outside VPC %s (%s): delete this subnet and create it inside the VPC", s.Spec.CIDR, vpc.Name, vpc.Spec.CIDR)
		}
	}
	if vpc.Status.Phase != v1alpha1.PhaseProvisioned {
		return false, ReasonVpcNotProvisioned, fmt.Sprintf("VPC %s is %s, not yet Provisioned", vpc.Name, phaseOf(vpc.Status.Phase))
	}
	return true, ReasonVpcProvisioned, fmt.Sprintf("VPC %s is Provisioned", vpc.Name)
}

// drain runs the delete workflow: endpoints first, then the bouncers, then the subnet.
func (o *SubnetOperator) drain(ctx context.Context, s *v1alpha1.Subnet, bouncers []*v1alpha1.Bouncer) error {
	remain := ""
	if n, one := o.endpointsOf(s.Name); n > 0 {
		remain = fmt.Sprintf("waiting for %d endpoint(s) of the subnet to be deleted, e.g. %s", n, one)
	} else {
		// The informer may not have delivered an endpoint created just before
		// the subnet was marked: ask etcd (a list without resourceVersion is consistent).
		list, err := o.client.NetworkingV1alpha1().Endpoints(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("spec.subnet", s.Name).String(), Limit: 1})
		if err != nil {
			return fmt.Errorf("listing the endpoints of deleting subnet %s: %w", s.Name, err)
		}
		if len(list.Items) > 0 {
			remain = fmt.Sprintf("waiting for the endpoints of the subnet to be deleted, e.g. %s/%s", list.Items[0].Namespace, list.Items[0].Name)
		}
	}
	return o.kind.Drain(ctx, s, bouncers, ConditionDeleting, ReasonEndpointsRemain, remain, ReasonDraining)
}

func (o *SubnetOperator) ownBouncers(s *v1alpha1.Subnet) []*v1alpha1.Bouncer {
	var out []*v1alpha1.Bouncer
	for _, b := range reconcile.ByIndex[*v1alpha1.Bouncer](o.bouncers, reconcile.BySubnet, s.Name) {
		if reconcile.OwnedBy(b, s.UID) {
			out = append(out, b)
		}
	}
	return out
}

func phaseOf(p v1alpha1.Phase) string {
	if p == "" {
		return "new"
	}
	return string(p)
}

// freeAddresses is how many host addresses of the subnet no endpoint uses: all
// but the network, broadcast and gateway addresses.
func freeAddresses(s *v1alpha1.Subnet, used int) (int, bool) {
	p, err := netip.ParsePrefix(s.Spec.CIDR)
	if err != nil || !p.Addr().Is4() || p.Bits() > 30 {
		return 0, false
	}
	return (1 << (32 - p.Bits())) - 3 - used, true
}
