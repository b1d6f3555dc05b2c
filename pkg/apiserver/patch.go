package apiserver

import (
	"bytes"
	"io"
	"mime"
	"net/http"

	"k8s.io/apimachinery/pkg/types"

	"mizar.dev/pkg/etcd"
	"mizar.dev/pkg/registry"
)

// withJSONPatch keeps the body of a JSON-patch request in its context, so the
// registry can say why a patch does not apply (k8s.io/apiserver drops the cause).
// Bodies over the request limit pass through untouched for the 413 downstream.
func withJSONPatch(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPatch || req.Body == nil {
			h.ServeHTTP(w, req)
			return
		}
		if mt, _, err := mime.ParseMediaType(req.Header.Get("Content-Type")); err != nil || mt != string(types.JSONPatchType) {
			h.ServeHTTP(w, req)
			return
		}
		body, err := io.ReadAll(io.LimitReader(req.Body, etcd.MaxRequestBytes+1))
		rest := req.Body
		req.Body = readCloser{io.MultiReader(bytes.NewReader(body), rest), rest}
		if err == nil && len(body) <= etcd.MaxRequestBytes {
			req = req.WithContext(registry.WithJSONPatch(req.Context(), body))
		}
		h.ServeHTTP(w, req)
	})
}

type readCloser struct {
	io.Reader
	io.Closer
}
