package reconcile

import (
	"k8s.io/client-go/tools/cache"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
)

// Index names: the field an informer's objects are indexed by.
const (
	ByVPC     = "spec.vpc"
	BySubnet  = "spec.subnet"
	ByDroplet = "spec.droplet"
)

func one(v string) ([]string, error) { return []string{v}, nil }

// Index functions for the informers the operators share.
var (
	DividerByVPC      cache.IndexFunc = func(o any) ([]string, error) { return one(o.(*v1alpha1.Divider).Spec.VPC) }
	DividerByDroplet  cache.IndexFunc = func(o any) ([]string, error) { return one(o.(*v1alpha1.Divider).Spec.Droplet) }
	SubnetByVPC       cache.IndexFunc = func(o any) ([]string, error) { return one(o.(*v1alpha1.Subnet).Spec.VPC) }
	BouncerBySubnet   cache.IndexFunc = func(o any) ([]string, error) { return one(o.(*v1alpha1.Bouncer).Spec.Subnet) }
	BouncerByDroplet  cache.IndexFunc = func(o any) ([]string, error) { return one(o.(*v1alpha1.Bouncer).Spec.Droplet) }
	EndpointByDroplet cache.IndexFunc = func(o any) ([]string, error) {
		return one(o.(*v1alpha1.Endpoint).Spec.Droplet)
	}
)
