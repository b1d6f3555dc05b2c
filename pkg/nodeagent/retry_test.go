package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/rest"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"mizar.dev/pkg/generated/clientset/versioned"
)

func TestRetriableAPIError(t *testing.T) {
	gr := schema.GroupResource{Group: "networking.mizar.dev", Resource: "droplets"}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"503", apierrors.NewServiceUnavailable("no endpoints"), true},
		{"429", apierrors.NewTooManyRequests("slow down", 1), true},
		{"500", apierrors.NewInternalError(errors.New("boom")), true},
		{"504", apierrors.NewTimeoutError("later", 1), true},
		{"refused", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, true},
		{"reset", fmt.Errorf("read: %w", syscall.ECONNRESET), true},
		{"resource not served", notServedYet{apierrors.NewNotFound(gr, "")}, true},
		{"403", apierrors.NewForbidden(gr, "node-b", errors.New("not your droplet")), false},
		{"422", apierrors.NewInvalid(schema.GroupKind{Group: gr.Group, Kind: "Droplet"}, "a", field.ErrorList{field.Required(field.NewPath("spec", "ip"), "")}), false},
		{"404 object", apierrors.NewNotFound(gr, "a"), false},
		{"409", apierrors.NewAlreadyExists(gr, "a"), false},
		{"plain", errors.New("bad flag"), false},
	} {
		if got := retriableAPIError(c.err); got != c.want {
			t.Errorf("%s: retriableAPIError(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// TestUntilServedWaitsForTheServer drives a real client against an HTTP
// server that answers 503 (as kube-apiserver does for an APIService whose
// backend is not ready) before it serves, and one that refuses for good.
func TestUntilServedWaitsForTheServer(t *testing.T) {
	old := startupBackoff
	startupBackoff.Duration, startupBackoff.Cap = 10*time.Millisecond, 50*time.Millisecond
	t.Cleanup(func() { startupBackoff = old })

	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if calls.Add(1) <= 3 {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"ServiceUnavailable","code":503}`))
			return
		}
		if r.URL.Path == "/apis/networking.mizar.dev/v1alpha1/droplets/forbidden" {
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403}`))
			return
		}
		_, _ = w.Write([]byte(`{"kind":"Droplet","apiVersion":"networking.mizar.dev/v1alpha1","metadata":{"name":"a"}}`))
	}))
	defer srv.Close()
	client, err := versioned.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	get := func(name string) func() error {
		return func() error {
			_, err := client.NetworkingV1alpha1().Droplets().Get(ctx, name, metav1.GetOptions{})
			return err
		}
	}
	if err := untilServed(ctx, "test", get("a")); err != nil {
		t.Fatalf("untilServed after three 503s: %v", err)
	}
	if n := calls.Load(); n != 4 {
		t.Fatalf("want 4 requests (three 503s, then 200), got %d", n)
	}
	before := calls.Load()
	if err := untilServed(ctx, "test", get("forbidden")); !apierrors.IsForbidden(err) {
		t.Fatalf("a 403 must end at once, got %v", err)
	}
	if n := calls.Load() - before; n != 1 {
		t.Fatalf("a 403 was asked %d times, want 1", n)
	}
}
