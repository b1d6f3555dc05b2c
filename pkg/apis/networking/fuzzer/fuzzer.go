// Package fuzzer fills networking.mizar.dev objects with random values for the
// round-trip test, avoiding the zero values that decoding would default.
package fuzzer

import (
	runtimeserializer "k8s.io/apimachinery/pkg/runtime/serializer"
	"sigs.k8s.io/randfill"

	"mizar.dev/pkg/apis/networking"
)

// Funcs returns the custom fill functions for the group.
var Funcs = func(runtimeserializer.CodecFactory) []interface{} {
	return []interface{}{
		func(s *networking.VpcSpec, c randfill.Continue) {
			c.FillNoCustom(s)
			if s.Dividers == 0 {
				s.Dividers = 1
			}
		},
		func(s *networking.SubnetSpec, c randfill.Continue) {
			c.FillNoCustom(s)
			if s.Bouncers == 0 {
				s.Bouncers = 1
			}
			if s.Gateway == "" {
				s.Gateway = "gw"
			}
		},
		func(s *networking.EndpointSpec, c randfill.Continue) {
			c.FillNoCustom(s)
			if s.Interface == "" {
				s.Interface = "eth0"
			}
		},
	}
}
