package v1alpha1

import (
	"net/netip"

	"k8s.io/apimachinery/pkg/runtime"
)

func addDefaultingFuncs(scheme *runtime.Scheme) error {
	return RegisterDefaults(scheme)
}

func SetDefaults_VpcSpec(obj *VpcSpec) {
	if obj.Dividers == 0 {
		obj.Dividers = 1
	}
}

func SetDefaults_SubnetSpec(obj *SubnetSpec) {
	if obj.Bouncers == 0 {
		obj.Bouncers = 1
	}
	if obj.Gateway == "" {
		// An unparsable CIDR is left for validation to report; no gateway is guessed.
		if p, err := netip.ParsePrefix(obj.CIDR); err == nil && p.Addr().Is4() {
			obj.Gateway = p.Masked().Addr().Next().String()
		}
	}
}

func SetDefaults_EndpointSpec(obj *EndpointSpec) {
	if obj.Interface == "" {
		obj.Interface = "eth0"
	}
}
