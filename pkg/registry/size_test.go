package registry

import (
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"mizar.dev/pkg/apis/networking"
	"mizar.dev/pkg/apis/networking/validation"
)

func endpoint() *networking.Endpoint {
	return &networking.Endpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "ep", Namespace: "ns", Labels: map[string]string{"app": "db"}},
		Spec:       networking.EndpointSpec{Subnet: "s", Droplet: "d", Interface: "eth0", MAC: "02:00:00:00:00:01", IP: "10.0.0.5"},
	}
}

func TestValidateSize(t *testing.T) {
	big := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprintf("k%06d", i)] = strings.Repeat("v", 60)
		}
		return m
	}
	tests := []struct {
		name   string
		mutate func(*networking.Endpoint)
		field  string
	}{
		{"small", func(*networking.Endpoint) {}, ""},
		{"just under", func(e *networking.Endpoint) { e.Labels = big(13000) }, ""},
		{"labels", func(e *networking.Endpoint) { e.Labels = big(16000) }, "metadata.labels"},
		{"annotations", func(e *networking.Endpoint) { e.Annotations = big(16000) }, "metadata.annotations"},
		// 200 kB of control characters encode as 1.2 MB of \u0000 escapes.
		{"escaped", func(e *networking.Endpoint) { e.Annotations = map[string]string{"a": strings.Repeat("\x00", 200000)} }, "metadata.annotations"},
		{"escaped under", func(e *networking.Endpoint) { e.Annotations = map[string]string{"a": strings.Repeat("\x00", 150000)} }, ""},
		{"finalizers", func(e *networking.Endpoint) {
			for i := range 70000 {
				e.Finalizers = append(e.Finalizers, fmt.Sprintf("example.com/f-%d", i))
			}
		}, "metadata.finalizers"},
		{"status", func(e *networking.Endpoint) {
			for i := range 40 {
				e.Status.Conditions = append(e.Status.Conditions, metav1.Condition{Type: fmt.Sprint(i), Message: strings.Repeat("m", 30000)})
			}
		}, "status"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := endpoint()
			tc.mutate(e)
			errs := validateSize(e, &e.Status)
			if tc.field == "" {
				if len(errs) > 0 {
					t.Fatalf("want no error, got %v", errs)
				}
				return
			}
			if len(errs) != 1 || errs[0].Field != tc.field || errs[0].Type != field.ErrorTypeTooLong ||
				!strings.Contains(errs[0].Detail, fmt.Sprintf("over the limit of %d bytes", MaxObjectBytes)) {
				t.Fatalf("want one TooLong error on %s naming the limit, got %v", tc.field, errs)
			}
		})
	}
}

// BenchmarkValidateSize prices the size check every create and update pays,
// against the endpoint's own static validation as the baseline.
func BenchmarkValidateSize(b *testing.B) {
	e := endpoint()
	b.Run("baseline=ValidateEndpoint", func(b *testing.B) {
		for range b.N {
			_ = validation.ValidateEndpoint(e)
		}
	})
	b.Run("validateSize", func(b *testing.B) {
		for range b.N {
			_ = validateSize(e, &e.Status)
		}
	})
}
