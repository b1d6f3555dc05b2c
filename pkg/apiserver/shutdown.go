package apiserver

import (
	"net/http"
	"strings"

	apirequest "k8s.io/apiserver/pkg/endpoints/request"
	genericapiserver "k8s.io/apiserver/pkg/server"
)

// shutdownEvent is the last event of a JSON watch that shutdown ends: clients
// (kubectl get -w, informers) see why the stream stopped instead of a silent end.
const shutdownEvent = `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",` +
	`"message":"mizar-apiserver is shutting down; watch again (another replica, or this one once it is back)",` +
	`"reason":"ServiceUnavailable","code":503}}` + "\n"

// buildHandlerChain is the generic chain with mizar's filters innermost:
// withShutdownNotice where the watch handler has just returned and the response
// is still open, withPatchDepthLimit and withJSONPatch where the body is
// about to be read.
func buildHandlerChain(h http.Handler, c *genericapiserver.Config) http.Handler {
	return genericapiserver.DefaultBuildHandlerChain(withShutdownNotice(withPatchDepthLimit(withJSONPatch(h))), c)
}

// withShutdownNotice ends a JSON watch that the server closed because it is
// shutting down (--shutdown-watch-termination-grace-period > 0) with an ERROR
// event. Other encodings are framed differently and just end.
func withShutdownNotice(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		h.ServeHTTP(w, req)
		info, ok := apirequest.RequestInfoFrom(req.Context())
		if !ok || info.Verb != "watch" {
			return
		}
		signal := apirequest.ServerShutdownSignalFrom(req.Context())
		if signal == nil {
			return
		}
		select {
		case <-signal.ShuttingDown():
		default:
			return
		}
		if req.Context().Err() != nil || !strings.HasPrefix(w.Header().Get("Content-Type"), "application/json") {
			return
		}
		if _, err := w.Write([]byte(shutdownEvent)); err != nil {
			return
		}
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	})
}
