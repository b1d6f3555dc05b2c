// Package registry turns a Kind, the description of one resource, into the
// genericregistry stores that serve it and its /status subresource. Every mizar
// resource follows the same lifecycle rules (status reset on create, spec and
// status written through separate endpoints, generation bumped on spec change),
// so they are implemented once here instead of in every kind's package.
package registry

import (
	"fmt"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"mizar.dev/pkg/apis/conditions"
)

// Kind describes one resource. T is the internal object type (a pointer), S its
// spec and St its status.
type Kind[T runtime.Object, S, St any] struct {
	// Resource is the plural group resource, Singular its singular name.
	Resource schema.GroupResource
	Singular string
	// Version is the served version whose field sets the reset-field strategies name.
	Version    string
	Namespaced bool

	New     func() T
	NewList func() runtime.Object

	Spec   func(T) *S
	Status func(T) *St
	// InitStatus sets the status every new object starts with (phase Init) on the
	// otherwise zeroed status.
	InitStatus func(T)
	// Readiness, when set, names the object's conditions, phase and whether that
	// phase is Provisioned: the server keeps the Ready condition in step with the
	// phase in the very write that sets the phase (conditions.SetReady), so each
	// phase transition's one writer (DESIGN.md) writes Ready too, atomically. A
	// writer that sets Ready itself in that write keeps its own wording.
	Readiness func(T) (conds *[]metav1.Condition, phase string, provisioned bool)

	Validate       func(obj T) field.ErrorList
	ValidateUpdate func(obj, old T) field.ErrorList
	ValidateStatus func(obj T) field.ErrorList

	// Claims, when set, reserves the values the kind's objects must not share
	// and checks a new object against the objects it depends on.
	Claims *Claims[T]

	// Fields are the field selectors clients may use beyond metadata.name
	// and metadata.namespace.
	Fields map[string]func(T) string
	// IndexedFields are selectable fields the watch cache indexes for lists; the
	// first one also routes watch events, so per-node watchers cost O(their objects).
	IndexedFields []string

	ShortNames []string
	Columns    []Column[T]
}

// Column is one kubectl column shown between NAME and AGE.
type Column[T any] struct {
	Name        string
	Type        string // integer, number, string, boolean or date
	Description string
	Priority    int32 // 0: always shown; 1: only with -o wide
	Value       func(T) any
}

// Category is the kubectl category every mizar resource belongs to (kubectl get mizar).
const Category = "mizar"

func (k *Kind[T, S, St]) specChanged(obj, old T) bool {
	return !apiequality.Semantic.DeepEqual(k.Spec(obj), k.Spec(old))
}

func (k *Kind[T, S, St]) resetStatus(obj T) {
	*k.Status(obj) = *new(St)
	if k.InitStatus != nil {
		k.InitStatus(obj)
	}
}

// setReady derives the Ready condition from the phase the object carries,
// unless this write (stored is the object before it; none on create) set Ready
// itself.
func (k *Kind[T, S, St]) setReady(obj T, generation int64, stored ...T) {
	if k.Readiness == nil {
		return
	}
	conds, phase, provisioned := k.Readiness(obj)
	for _, old := range stored {
		if before, _, _ := k.Readiness(old); conditions.Written(*conds, *before) {
			return
		}
	}
	conditions.SetReady(conds, generation, phase, provisioned)
}

func must[T any](obj runtime.Object) T {
	t, ok := obj.(T)
	if !ok {
		// The store only ever hands us its own type; anything else is a wiring bug.
		panic(fmt.Sprintf("registry: unexpected object type %T", obj))
	}
	return t
}

func objectMeta(obj runtime.Object) *metav1.ObjectMeta {
	return must[metav1.ObjectMetaAccessor](obj).GetObjectMeta().(*metav1.ObjectMeta)
}
