// Package fuzzer fills broker.mizar.dev objects with random values for the
// round-trip test, avoiding the zero values that decoding would default.
package fuzzer

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	runtimeserializer "k8s.io/apimachinery/pkg/runtime/serializer"
	"sigs.k8s.io/randfill"

	"mizar.dev/pkg/apis/broker"
)

// Funcs returns the custom fill functions for the group.
var Funcs = func(runtimeserializer.CodecFactory) []interface{} {
	return []interface{}{
		func(p *broker.ServicePlan, c randfill.Continue) {
			c.FillNoCustom(p)
			if p.Replicas == 0 {
				p.Replicas = 1
			}
			if p.MaxProvisioningDuration == nil {
				p.MaxProvisioningDuration = &metav1.Duration{Duration: time.Minute}
			}
			p.Storage = *resource.NewQuantity(c.Int63n(1<<40), resource.BinarySI)
			p.CPU = *resource.NewMilliQuantity(c.Int63n(64000), resource.DecimalSI)
			p.Memory = *resource.NewQuantity(c.Int63n(1<<36), resource.BinarySI)
		},
		// Raw JSON must stay JSON: a random byte string is not a document.
		func(r *runtime.RawExtension, c randfill.Continue) {
			r.Raw = []byte(fmt.Sprintf(`{"n":%d}`, c.Int63()))
		},
	}
}
