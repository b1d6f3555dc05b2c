package apiserver

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"

	"k8s.io/client-go/rest"
)

// inProcessConfig is the loopback client config with its requests handed to
// the server's handler chain in this process (authentication by the loopback
// token, authorization, admission and audit as before) instead of being
// encrypted, framed as HTTP/2 and sent over a loopback TCP connection, only to
// be decrypted and unframed again by the same process.
func inProcessConfig(loopback *rest.Config, handler http.Handler) *rest.Config {
	cfg := rest.CopyConfig(loopback)
	// client-go refuses TLS options beside a custom transport; there is no
	// connection to secure.
	cfg.TLSClientConfig = rest.TLSClientConfig{}
	cfg.Host = "https://in-process"
	cfg.Transport = handlerTransport{handler}
	return cfg
}

// handlerTransport is an http.RoundTripper that serves each request with h.
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	sreq := req.Clone(req.Context())
	sreq.RequestURI = req.URL.RequestURI()
	sreq.RemoteAddr = "127.0.0.1:0"
	sreq.Proto, sreq.ProtoMajor, sreq.ProtoMinor = "HTTP/1.1", 1, 1
	if sreq.Host == "" {
		sreq.Host = req.URL.Host
	}
	if sreq.Body == nil {
		sreq.Body = http.NoBody
	}
	pr, pw := io.Pipe()
	w := &pipeResponseWriter{header: http.Header{}, body: pw, started: make(chan struct{}), ctx: sreq.Context(), served: make(chan struct{})}
	go func() {
		var err error
		defer close(w.served)
		defer func() {
			if r := recover(); r != nil {
				// As net/http's server does: a handler's panic breaks the
				// connection, here the response (or its body) fails.
				err = fmt.Errorf("serving %s %s in process: the handler panicked: %v", req.Method, req.URL.Path, r)
				if r == http.ErrAbortHandler {
					err = fmt.Errorf("serving %s %s in process: the handler aborted the response", req.Method, req.URL.Path)
				}
			}
			w.finish(err)
			_ = pw.CloseWithError(err) // nil: the reader sees io.EOF
		}()
		t.h.ServeHTTP(w, sreq)
	}()
	select {
	case <-w.started:
	case <-req.Context().Done():
		// The handler sees the same context end; its writes fail from now on.
		_ = pr.CloseWithError(req.Context().Err())
		return nil, req.Context().Err()
	}
	if w.err != nil {
		return nil, w.err
	}
	return &http.Response{
		Status: fmt.Sprintf("%d %s", w.code, http.StatusText(w.code)), StatusCode: w.code,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: w.sent, Body: pr, ContentLength: -1, Request: req,
	}, nil
}

// pipeResponseWriter hands the status and headers over once, then streams
// the body through the pipe: each write reaches the reader as it is made,
// so watches stream too and Flush has nothing to do.
type pipeResponseWriter struct {
	header  http.Header
	body    *io.PipeWriter
	once    sync.Once
	started chan struct{}
	// ctx is the request's; served closes when the handler returns.
	ctx    context.Context
	served chan struct{}
	// Set once, before started closes.
	code int
	sent http.Header
	err  error
}

func (w *pipeResponseWriter) Header() http.Header { return w.header }

func (w *pipeResponseWriter) WriteHeader(code int) {
	w.once.Do(func() {
		w.code, w.sent = code, w.header.Clone()
		close(w.started)
	})
}

func (w *pipeResponseWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(p)
}

func (w *pipeResponseWriter) Flush() {}

// CloseNotify reports the client gone when the request's context ends.
// k8s.io/apiserver's response writer wrappers keep Flush, which watches
// need, only for writers that are also CloseNotifiers, as net/http's are.
func (w *pipeResponseWriter) CloseNotify() <-chan bool {
	gone := make(chan bool, 1)
	go func() {
		select {
		case <-w.ctx.Done():
			gone <- true
		case <-w.served:
		}
	}()
	return gone
}

// finish answers a request whose handler returned (or panicked) without
// writing anything: 200 with an empty body, or err.
func (w *pipeResponseWriter) finish(err error) {
	w.once.Do(func() {
		w.code, w.sent, w.err = http.StatusOK, w.header.Clone(), err
		close(w.started)
	})
}

var _ interface {
	http.Flusher
	http.CloseNotifier
} = &pipeResponseWriter{}
