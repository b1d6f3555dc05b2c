package apiserver

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/endpoints/responsewriter"
	"k8s.io/client-go/rest"
)

// decorator is a response writer decorator like k8s.io/apiserver's filters'.
type decorator struct{ http.ResponseWriter }

func (d decorator) Unwrap() http.ResponseWriter { return d.ResponseWriter }

func TestInProcessTransport(t *testing.T) {
	release := make(chan struct{})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/echo":
			body, _ := io.ReadAll(r.Body)
			w.Header().Set("X-Seen", r.Method+" "+r.RequestURI+" "+r.Header.Get("Authorization")+" "+string(body))
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte("done"))
		case "/stream":
			_, _ = w.Write([]byte("first"))
			w.(http.Flusher).Flush()
			<-release // the client has the first part before the handler goes on
			_, _ = w.Write([]byte("second"))
		case "/panic-early":
			panic("boom")
		case "/panic-late":
			_, _ = w.Write([]byte("partial"))
			panic(http.ErrAbortHandler)
		case "/slow":
			<-r.Context().Done()
		case "/wrapped":
			// As k8s.io/apiserver's filters wrap it: a watch needs Flush through them.
			_, ok := responsewriter.WrapForHTTP1Or2(decorator{w}).(http.Flusher)
			w.Header().Set("X-Flusher", strconv.FormatBool(ok))
		}
	})
	cfg := inProcessConfig(&rest.Config{Host: "https://127.0.0.1:1", BearerToken: "loopback-token",
		TLSClientConfig: rest.TLSClientConfig{ServerName: "apiserver-loopback-client", CAData: []byte("unused")}}, handler)
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatalf("client for the in-process config: %v", err)
	}

	resp, err := client.Post("https://in-process/echo?x=1", "text/plain", strings.NewReader("order"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || string(body) != "done" || resp.Header.Get("X-Seen") != "POST /echo?x=1 Bearer loopback-token order" {
		t.Errorf("echo: %d %q, handler saw %q", resp.StatusCode, body, resp.Header.Get("X-Seen"))
	}

	resp, err = client.Get("https://in-process/stream")
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 5)
	if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "first" {
		t.Fatalf("the first part did not arrive while the handler ran: %q %v", first, err)
	}
	close(release)
	second, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(second) != "second" {
		t.Errorf("the second part: %q", second)
	}

	if _, err := client.Get("https://in-process/panic-early"); err == nil || !strings.Contains(err.Error(), "panicked: boom") {
		t.Errorf("a handler panic before the answer: %v", err)
	}
	resp, err = client.Get("https://in-process/panic-late")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(resp.Body); err == nil || string(b) != "partial" {
		t.Errorf("an aborted response should fail after its first part: %q %v", b, err)
	}
	resp.Body.Close()

	resp, err = client.Get("https://in-process/wrapped")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Header.Get("X-Flusher") != "true" {
		t.Errorf("the writer wrapped as k8s.io/apiserver wraps it lost http.Flusher: watches would fail")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "https://in-process/slow", nil)
	if _, err := client.Do(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a request whose context ends before the answer: %v", err)
	}
}
