// Package lifecycle adds what every networking.mizar.dev kind shares to its
// registry description: the Init phase on create, the Ready condition, status validation, the PHASE
// column and the status.phase field selector.
package lifecycle

import (
	"fmt"
	"maps"
	"reflect"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"mizar.dev/pkg/apis/networking"
	"mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/apis/networking/validation"
	"mizar.dev/pkg/registry"
)

// Apply completes k for a networking kind whose provisioning status is reached through status.
func Apply[T runtime.Object, S, St any](k registry.Kind[T, S, St], status func(T) *networking.ProvisioningStatus) *registry.Kind[T, S, St] {
	k.Version = v1alpha1.SchemeGroupVersion.String()
	k.InitStatus = func(obj T) { status(obj).Phase = networking.PhaseInit }
	k.Readiness = func(obj T) (*[]metav1.Condition, string, bool) {
		st := status(obj)
		return &st.Conditions, string(st.Phase), st.Phase == networking.PhaseProvisioned
	}
	k.ValidateStatus = func(obj T) field.ErrorList {
		var generation int64
		if m, err := meta.Accessor(obj); err == nil {
			generation = m.GetGeneration()
		}
		return validation.ValidateProvisioningStatus(status(obj), generation)
	}
	k.Fields = maps.Clone(k.Fields)
	k.Fields["status.phase"] = func(obj T) string { return string(status(obj).Phase) }
	mustMatchVersion(k.New(), k.Fields)
	k.Columns = append(k.Columns, registry.Column[T]{
		Name: "Phase", Type: "string", Description: "Lifecycle phase: Init, Provisioned, Terminating or Failed.",
		Value: func(obj T) any { return string(status(obj).Phase) },
	})
	return &k
}

// mustMatchVersion fails the program's start if the fields the registry can
// select on differ from those v1alpha1 accepts: a label the version accepts but
// the registry lacks would silently match nothing.
func mustMatchVersion[T any](obj runtime.Object, fields map[string]func(T) string) {
	kind := reflect.TypeOf(obj).Elem().Name()
	want := sets.New(v1alpha1.SelectableFields[kind]...)
	if got := sets.KeySet(fields); !got.Equal(want) {
		panic(fmt.Sprintf("registry fields of %s %v differ from v1alpha1.SelectableFields %v", kind, sets.List(got), sets.List(want)))
	}
}
