package install

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/apitesting/roundtrip"

	"mizar.dev/pkg/apis/broker/fuzzer"
)

// TestRoundTripTypes converts random objects internal -> v1alpha1 -> JSON and
// back and requires them unchanged: the generated conversions lose nothing.
func TestRoundTripTypes(t *testing.T) {
	roundtrip.RoundTripTestForAPIGroup(t, Install, fuzzer.Funcs)
}
