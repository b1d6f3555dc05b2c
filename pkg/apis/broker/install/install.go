// Package install registers the broker.mizar.dev API group with a scheme.
package install

import (
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"

	"mizar.dev/pkg/apis/broker"
	"mizar.dev/pkg/apis/broker/v1alpha1"
)

// Install registers the internal and all external versions, preferring v1alpha1.
func Install(scheme *runtime.Scheme) {
	utilruntime.Must(broker.AddToScheme(scheme))
	utilruntime.Must(v1alpha1.AddToScheme(scheme))
	utilruntime.Must(scheme.SetVersionPriority(v1alpha1.SchemeGroupVersion))
}
