package registry

import (
	"context"

	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/apiserver/pkg/storage/names"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// strategy is the create/update/delete strategy of the main resource: it owns
// spec and metadata, never status.
type strategy[T runtime.Object, S, St any] struct {
	runtime.ObjectTyper
	names.NameGenerator
	kind *Kind[T, S, St]
}

var (
	_ rest.RESTCreateStrategy  = &strategy[runtime.Object, struct{}, struct{}]{}
	_ rest.RESTUpdateStrategy  = &strategy[runtime.Object, struct{}, struct{}]{}
	_ rest.ResetFieldsStrategy = &strategy[runtime.Object, struct{}, struct{}]{}
	_ rest.RESTUpdateStrategy  = &statusStrategy[runtime.Object, struct{}, struct{}]{}
	_ rest.ResetFieldsStrategy = &statusStrategy[runtime.Object, struct{}, struct{}]{}
	_ rest.RESTDeleteStrategy  = &strategy[runtime.Object, struct{}, struct{}]{}
)

func (s *strategy[T, S, St]) NamespaceScoped() bool { return s.kind.Namespaced }

// GetResetFields: status is written only through /status.
func (s *strategy[T, S, St]) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	return map[fieldpath.APIVersion]*fieldpath.Set{
		fieldpath.APIVersion(s.kind.Version): fieldpath.NewSet(fieldpath.MakePathOrDie("status")),
	}
}

func (s *strategy[T, S, St]) PrepareForCreate(_ context.Context, obj runtime.Object) {
	t := must[T](obj)
	s.kind.resetStatus(t)
	objectMeta(obj).SetGeneration(1)
	s.kind.setReady(t, 1)
}

func (s *strategy[T, S, St]) PrepareForUpdate(_ context.Context, obj, old runtime.Object) {
	t, o := must[T](obj), must[T](old)
	*s.kind.Status(t) = *s.kind.Status(o)
	if s.kind.specChanged(t, o) {
		objectMeta(obj).SetGeneration(objectMeta(old).GetGeneration() + 1)
	}
}

func (s *strategy[T, S, St]) Validate(_ context.Context, obj runtime.Object) field.ErrorList {
	t := must[T](obj)
	return append(s.kind.Validate(t), validateSize(obj, s.kind.Status(t))...)
}

func (s *strategy[T, S, St]) ValidateUpdate(_ context.Context, obj, old runtime.Object) field.ErrorList {
	t := must[T](obj)
	return append(s.kind.ValidateUpdate(t, must[T](old)), validateSize(obj, s.kind.Status(t))...)
}

func (s *strategy[T, S, St]) WarningsOnCreate(context.Context, runtime.Object) []string { return nil }
func (s *strategy[T, S, St]) WarningsOnUpdate(context.Context, runtime.Object, runtime.Object) []string {
	return nil
}
func (s *strategy[T, S, St]) Canonicalize(runtime.Object)    {}
func (s *strategy[T, S, St]) AllowCreateOnUpdate() bool      { return false }
func (s *strategy[T, S, St]) AllowUnconditionalUpdate() bool { return true }

// statusStrategy is the update strategy of /status: it owns status, never spec.
type statusStrategy[T runtime.Object, S, St any] struct {
	*strategy[T, S, St]
}

func (s *statusStrategy[T, S, St]) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	return map[fieldpath.APIVersion]*fieldpath.Set{
		fieldpath.APIVersion(s.kind.Version): fieldpath.NewSet(
			fieldpath.MakePathOrDie("spec"),
			fieldpath.MakePathOrDie("metadata", "labels"),
			fieldpath.MakePathOrDie("metadata", "annotations"),
		),
	}
}

func (s *statusStrategy[T, S, St]) PrepareForUpdate(_ context.Context, obj, old runtime.Object) {
	t, o := must[T](obj), must[T](old)
	*s.kind.Spec(t) = *s.kind.Spec(o)
	// A status writer reports on the object as it is; it cannot relabel it.
	m, om := objectMeta(obj), objectMeta(old)
	m.SetLabels(om.GetLabels())
	m.SetAnnotations(om.GetAnnotations())
	m.SetGeneration(om.GetGeneration())
	s.kind.setReady(t, om.GetGeneration(), o)
}

func (s *statusStrategy[T, S, St]) ValidateUpdate(_ context.Context, obj, old runtime.Object) field.ErrorList {
	t := must[T](obj)
	errs := apimachineryvalidation.ValidateObjectMetaUpdate(objectMeta(obj), objectMeta(old), field.NewPath("metadata"))
	errs = append(errs, s.kind.ValidateStatus(t)...)
	return append(errs, validateSize(obj, s.kind.Status(t))...)
}

func (s *statusStrategy[T, S, St]) WarningsOnUpdate(context.Context, runtime.Object, runtime.Object) []string {
	return nil
}
