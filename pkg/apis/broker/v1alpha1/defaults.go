package v1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// DefaultMaxProvisioningDuration bounds an order whose plan names no limit: an
// order never stays "provisioning" forever (broker notes §11).
const DefaultMaxProvisioningDuration = 30 * time.Minute

func addDefaultingFuncs(scheme *runtime.Scheme) error {
	return RegisterDefaults(scheme)
}

func SetDefaults_ServicePlan(obj *ServicePlan) {
	if obj.Replicas == 0 {
		obj.Replicas = 1
	}
	if obj.MaxProvisioningDuration == nil {
		obj.MaxProvisioningDuration = &metav1.Duration{Duration: DefaultMaxProvisioningDuration}
	}
}
