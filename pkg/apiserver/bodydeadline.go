package apiserver

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	"k8s.io/klog/v2"

	"mizar.dev/pkg/etcd"
)

// DefaultRequestBodyTimeout is how long a client may take to send a request's
// body (--request-body-timeout).
const DefaultRequestBodyTimeout = 10 * time.Second

// withBodyDeadline reads the body of every request that has one before the
// rest of the chain runs, within timeout, so that a slow sender holds no
// max-in-flight or priority-and-fairness slot while it trickles bytes: 250
// POSTs sending a byte every 5 s held all 200 mutating slots until the 60 s
// request timeout, and every other client's writes got 429. A body not
// received in time is answered 408; one over the request limit passes as
// read so far, and the chain answers it 413 as before.
func withBodyDeadline(h http.Handler, timeout time.Duration) http.Handler {
	if timeout <= 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Body == nil || req.Body == http.NoBody || req.ContentLength == 0 {
			h.ServeHTTP(w, req)
			return
		}
		rc := http.NewResponseController(w)
		// On a connection (HTTP/1 or an HTTP/2 stream) the deadline ends a
		// stalled read; ErrNotSupported is the in-process writer, whose body is
		// already in memory.
		hasDeadline := rc.SetReadDeadline(time.Now().Add(timeout)) == nil
		body, err := io.ReadAll(io.LimitReader(req.Body, etcd.MaxRequestBytes+1))
		if hasDeadline {
			_ = rc.SetReadDeadline(time.Time{})
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				klog.V(2).InfoS("Request body not received in time", "method", req.Method, "uri", req.RequestURI,
					"remote", req.RemoteAddr, "timeout", timeout, "read", len(body))
				status := apierrors.NewTimeoutError(fmt.Sprintf("the request body was not received within %v", timeout), 0)
				status.ErrStatus.Code = http.StatusRequestTimeout
				status.ErrStatus.Reason = "Timeout"
				responsewriters.ErrorNegotiated(status, Codecs, schema.GroupVersion{}, w, req)
				return
			}
			// A client gone: nothing to answer.
			klog.V(4).InfoS("Reading a request body", "err", err, "uri", req.RequestURI)
			return
		}
		rest := req.Body
		req.Body = readCloser{io.MultiReader(bytes.NewReader(body), rest), rest}
		h.ServeHTTP(w, req)
	})
}
