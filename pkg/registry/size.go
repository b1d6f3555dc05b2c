package registry

import (
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"mizar.dev/pkg/etcd"
)

// MaxObjectBytes caps an object's encoded size. etcd refuses a write over its
// request limit (etcd.MaxRequestBytes) with an error the apiserver reports as a
// 500; this cap, a third below it, leaves room for the key, the transaction
// around the object and managed-field growth, so clients get a 422 instead.
const MaxObjectBytes = etcd.MaxRequestBytes * 2 / 3

// validateSize refuses an object whose encoding is over MaxObjectBytes, naming
// its largest part so the client knows what to trim.
func validateSize(obj runtime.Object, status any) field.ErrorList {
	size, err := encodedSize(obj)
	if err != nil || size <= MaxObjectBytes {
		// An object that cannot be encoded fails later with its own error.
		return nil
	}
	m := objectMeta(obj)
	parts := []struct {
		path *field.Path
		v    any
	}{
		{field.NewPath("metadata", "labels"), m.Labels},
		{field.NewPath("metadata", "annotations"), m.Annotations},
		{field.NewPath("metadata", "finalizers"), m.Finalizers},
		{field.NewPath("metadata", "managedFields"), m.ManagedFields},
		{field.NewPath("metadata", "ownerReferences"), m.OwnerReferences},
		{field.NewPath("status"), status},
	}
	largest, largestSize := field.NewPath("metadata"), 0
	for _, p := range parts {
		if n, err := encodedSize(p.v); err == nil && n > largestSize {
			largest, largestSize = p.path, n
		}
	}
	return field.ErrorList{{
		Type:     field.ErrorTypeTooLong,
		Field:    largest.String(),
		BadValue: field.OmitValueType{},
		Detail: fmt.Sprintf("the object is %d bytes encoded, over the limit of %d bytes; %s is its largest part (%d bytes)",
			size, MaxObjectBytes, largest, largestSize),
	}}
}

func encodedSize(v any) (int, error) {
	b, err := json.Marshal(v)
	return len(b), err
}
