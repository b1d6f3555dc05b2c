package registry

import (
	"encoding/json"
	"math/rand"
	"net/netip"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/apitesting/fuzzer"
	"k8s.io/apimachinery/pkg/api/resource"
	metafuzzer "k8s.io/apimachinery/pkg/apis/meta/fuzzer"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"

	"mizar.dev/pkg/apis/broker"
	brokerfuzzer "mizar.dev/pkg/apis/broker/fuzzer"
	brokerinstall "mizar.dev/pkg/apis/broker/install"
	networkingfuzzer "mizar.dev/pkg/apis/networking/fuzzer"
	networkinginstall "mizar.dev/pkg/apis/networking/install"
)

// checkBound requires jsonSizeBound(v) to be at least v's encoded size.
func checkBound(t *testing.T, name string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	bound, ok := jsonSizeBound(v, 1<<40)
	if !ok || bound < len(b) {
		t.Fatalf("%s: bound %d (ok %v) under the encoded size %d: %s", name, bound, ok, len(b), b)
	}
}

// TestJSONSizeBoundFuzzed checks the bound on random objects of every internal
// kind mizar serves, with random metadata (managed fields, owner references,
// times, unicode strings).
func TestJSONSizeBoundFuzzed(t *testing.T) {
	scheme := runtime.NewScheme()
	networkinginstall.Install(scheme)
	brokerinstall.Install(scheme)
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	f := fuzzer.FuzzerFor(fuzzer.MergeFuzzerFuncs(metafuzzer.Funcs, networkingfuzzer.Funcs, brokerfuzzer.Funcs),
		rand.NewSource(seed), serializer.NewCodecFactory(scheme))
	kinds := 0
	for gvk := range scheme.AllKnownTypes() {
		if gvk.Version != runtime.APIVersionInternal || (gvk.Group != "networking.mizar.dev" && gvk.Group != "broker.mizar.dev") {
			continue
		}
		kinds++
		for i := range 50 {
			obj, err := scheme.New(gvk)
			if err != nil {
				t.Fatal(err)
			}
			f.Fill(obj)
			checkBound(t, gvk.Kind+" #"+string(rune('0'+i%10)), obj)
		}
	}
	if kinds < 10 {
		t.Fatalf("only %d internal kinds found", kinds)
	}
}

// TestJSONSizeBoundWorstCases checks the bound where encoding/json writes the
// most per byte: escaped control characters, invalid UTF-8, HTML characters
// and line separators, in strings, map keys and Marshalers' raw output.
func TestJSONSizeBoundWorstCases(t *testing.T) {
	nasty := strings.Repeat("\x00<>&\u2028\xff\"\\", 20)
	e := endpoint()
	e.Name = nasty
	e.Labels = map[string]string{nasty: nasty}
	e.Finalizers = []string{nasty, ""}
	e.ManagedFields = []metav1.ManagedFieldsEntry{{
		Manager: nasty, Time: &metav1.Time{Time: time.Now()},
		FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:spec":{"f:x":{}},"<&>":{}}`)},
	}}
	checkBound(t, "endpoint", e)

	inst := &broker.ServiceInstance{}
	inst.Spec.Parameters = &runtime.RawExtension{Raw: []byte(`{"a":"<<<<<<<<","b":[1,2,3]}`)}
	checkBound(t, "instance", inst)

	class := &broker.ServiceClass{}
	class.Spec.Plans = []broker.ServicePlan{{Name: nasty, Storage: resource.MustParse("10Gi"), CPU: resource.MustParse("1500m")}}
	checkBound(t, "class", class)

	type quoted struct {
		S string `json:"s,string"`
		I int64  `json:"i,string"`
	}
	checkBound(t, ",string", &quoted{S: nasty, I: -1 << 63})
	checkBound(t, "bytes", &struct{ B []byte }{B: []byte(nasty)})
	checkBound(t, "text keys", map[netip.Addr]string{netip.MustParseAddr("fe80::1"): nasty})
	checkBound(t, "nested", map[string]any{"a": []any{nasty, 1.5e300, nil, map[string]string{nasty: ""}}})
}

// TestJSONSizeBoundLimit: the walk stops at the limit, and what encoding/json
// refuses is left to it.
func TestJSONSizeBoundLimit(t *testing.T) {
	if _, ok := jsonSizeBound(strings.Repeat("x", 100), 100); ok {
		t.Fatal("a 100-byte string bounded within 100 bytes")
	}
	if _, ok := jsonSizeBound(map[string]any{"c": make(chan int)}, 1<<20); ok {
		t.Fatal("a channel bounded")
	}
}
