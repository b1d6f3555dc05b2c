package osb

import (
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
)

// KlogLogger is the slog.Logger the OSB library logs through: klog, as every
// other part of mizar-apiserver, under the name "osb".
func KlogLogger() *slog.Logger {
	return slog.New(logr.ToSlogHandler(klog.Background().WithName("osb")))
}

var (
	requestsTotal = metrics.NewCounterVec(&metrics.CounterOpts{
		Name:           "mizar_osb_requests_total",
		Help:           "Open Service Broker API requests, by operation (catalog, provision, update, deprovision, fetch_instance, last_operation, bind, unbind, fetch_binding, binding_last_operation, unknown) and HTTP status code.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"operation", "code"})
	requestSeconds = metrics.NewHistogramVec(&metrics.HistogramOpts{
		Name:           "mizar_osb_request_duration_seconds",
		Help:           "Time to answer an Open Service Broker API request, by operation.",
		Buckets:        []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		StabilityLevel: metrics.ALPHA,
	}, []string{"operation"})
	registerOnce sync.Once
)

// operation names an OSB request by the spec's operations; ids never become
// label values.
func operation(r *http.Request) string {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if len(parts) < 2 || parts[0] != "v2" {
		return "unknown"
	}
	switch {
	case len(parts) == 2 && parts[1] == "catalog" && r.Method == http.MethodGet:
		return "catalog"
	case parts[1] != "service_instances":
		return "unknown"
	case len(parts) == 3:
		switch r.Method {
		case http.MethodPut:
			return "provision"
		case http.MethodPatch:
			return "update"
		case http.MethodDelete:
			return "deprovision"
		case http.MethodGet:
			return "fetch_instance"
		}
	case len(parts) == 4 && parts[3] == "last_operation" && r.Method == http.MethodGet:
		return "last_operation"
	case len(parts) == 5 && parts[3] == "service_bindings":
		switch r.Method {
		case http.MethodPut:
			return "bind"
		case http.MethodDelete:
			return "unbind"
		case http.MethodGet:
			return "fetch_binding"
		}
	case len(parts) == 6 && parts[3] == "service_bindings" && parts[5] == "last_operation" && r.Method == http.MethodGet:
		return "binding_last_operation"
	}
	return "unknown"
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// instrument counts and times every request, refusals (401, 412, 413)
// included: it wraps the whole handler.
func instrument(next http.Handler) http.Handler {
	registerOnce.Do(func() { legacyregistry.MustRegister(requestsTotal, requestSeconds) })
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start, op := time.Now(), operation(r)
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		if sw.code == 0 {
			sw.code = http.StatusOK
		}
		requestsTotal.WithLabelValues(op, strconv.Itoa(sw.code)).Inc()
		requestSeconds.WithLabelValues(op).Observe(time.Since(start).Seconds())
	})
}
