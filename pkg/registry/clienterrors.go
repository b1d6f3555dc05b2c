package registry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/registry/rest"
)

// ClientErrors turns mistakes in update and patch requests that k8s.io/apiserver
// answers with a 500 or a message that hides the cause into a 4xx saying what is
// wrong. Each case is reported from inside the update callback, where the
// request's new object is first built:
//
//   - a resourceVersion that is not a number fails the store's strconv.ParseUint
//     (a 500) before any validation runs: it becomes a 400;
//   - server-side apply of a field the schema lacks fails building the typed
//     patch with a plain error, a 500 (upstream bug kubernetes/kubernetes#139253,
//     also #122480; fix proposed in PR #139255): it becomes a 400 here;
//   - a JSON patch that does not apply is answered "the server rejected our
//     request due to an error in our request", its cause dropped: the patch is
//     applied again to the stored object to recover the cause for the message.
type ClientErrors struct {
	// Encoder encodes a stored object as clients see it, so a JSON patch can be
	// re-applied to what the client patched.
	Encoder runtime.Encoder
	// NoGarbageCollector: no collector runs for this server (standalone), so
	// deletes that need one are refused (refuseWithoutCollector).
	NoGarbageCollector bool
}

// Wrap returns the main storage of a resource with the checks on its updates.
func (c ClientErrors) Wrap(r *REST) rest.Storage { return &checkedREST{REST: r, c: c} }

// WrapStatus returns a /status storage with the checks on its updates.
func (c ClientErrors) WrapStatus(r *StatusREST) rest.Storage {
	return &checkedStatusREST{StatusREST: r, c: c}
}

type checkedREST struct {
	*REST
	c ClientErrors
}

func (r *checkedREST) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc, updateValidation rest.ValidateObjectUpdateFunc, forceAllowCreate bool, options *metav1.UpdateOptions) (runtime.Object, bool, error) {
	return r.REST.Update(ctx, name, checkedInfo{objInfo, r.c}, createValidation, updateValidation, forceAllowCreate, options)
}

type checkedStatusREST struct {
	*StatusREST
	c ClientErrors
}

func (r *checkedStatusREST) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc, updateValidation rest.ValidateObjectUpdateFunc, forceAllowCreate bool, options *metav1.UpdateOptions) (runtime.Object, bool, error) {
	return r.StatusREST.Update(ctx, name, checkedInfo{objInfo, r.c}, createValidation, updateValidation, forceAllowCreate, options)
}

type checkedInfo struct {
	rest.UpdatedObjectInfo
	c ClientErrors
}

func (i checkedInfo) UpdatedObject(ctx context.Context, old runtime.Object) (runtime.Object, error) {
	obj, err := i.UpdatedObjectInfo.UpdatedObject(ctx, old)
	if err != nil {
		return obj, i.c.explain(ctx, old, err)
	}
	m, merr := meta.Accessor(obj)
	if merr != nil {
		return obj, nil
	}
	if rv := m.GetResourceVersion(); rv != "" {
		if _, perr := strconv.ParseUint(rv, 10, 64); perr != nil {
			return nil, apierrors.NewBadRequest(fmt.Sprintf(
				"metadata.resourceVersion %q is not a resourceVersion this server issued: send the value from the object as last read, or none for an unconditional update", rv))
		}
	}
	return obj, nil
}

// explain rewrites an error from building the new object, when it can say more.
func (c ClientErrors) explain(ctx context.Context, old runtime.Object, err error) error {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		if msg := err.Error(); strings.Contains(msg, "failed to create typed patch object") {
			// The cause follows the last ": " of "failed to create typed patch object (<gvk>): <path>: <problem>".
			cause := msg
			if _, after, ok := strings.Cut(msg, "): "); ok {
				cause = after
			}
			return apierrors.NewBadRequest("server-side apply: " + cause)
		}
		return err
	}
	s := status.Status()
	if s.Code != http.StatusUnprocessableEntity || s.Details == nil || len(s.Details.Causes) > 0 || s.Details.Name != "" {
		return err
	}
	patch, ok := jsonPatchFrom(ctx)
	if !ok || old == nil || c.Encoder == nil {
		return err
	}
	current, eerr := runtime.Encode(c.Encoder, old)
	if eerr != nil {
		return err
	}
	ops, derr := jsonpatch.DecodePatch(patch)
	if derr != nil {
		return err
	}
	if _, aerr := ops.Apply(current); aerr != nil {
		return &apierrors.StatusError{ErrStatus: metav1.Status{
			Status:  metav1.StatusFailure,
			Code:    http.StatusUnprocessableEntity,
			Reason:  metav1.StatusReasonInvalid,
			Message: "the JSON patch does not apply to the stored object: " + aerr.Error(),
		}}
	}
	return err
}

type jsonPatchKey struct{}

// WithJSONPatch keeps a request's JSON patch in its context, so an update that
// fails to apply it can report why.
func WithJSONPatch(ctx context.Context, patch []byte) context.Context {
	return context.WithValue(ctx, jsonPatchKey{}, patch)
}

func jsonPatchFrom(ctx context.Context) ([]byte, bool) {
	p, ok := ctx.Value(jsonPatchKey{}).([]byte)
	return p, ok
}
