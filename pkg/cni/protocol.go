// Package cni is mizar's CNI plugin and the protocol it speaks with the node
// agent. The plugin (cmd/cni) is thin, as Antrea's and Cilium's are: it parses
// the runtime's request, forwards it over the agent's unix socket, and prints
// the agent's answer in the spec version the runtime asked for. The agent owns
// every netns, link, BPF and API operation. This package imports neither the
// agent nor the dataplane; the agent imports it for Request, Reply and Serve.
package cni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/containernetworking/cni/pkg/types"
)

// DefaultSocket is where the node agent serves the plugin.
const DefaultSocket = "/var/run/mizar/cni.sock"

// Commands the agent answers; the paths are /v1/<command>.
const (
	CmdAdd    = "add"
	CmdDel    = "del"
	CmdCheck  = "check"
	CmdStatus = "status"
	CmdGC     = "gc"
)

// Request is one CNI invocation as the plugin received it.
type Request struct {
	Command     string `json:"command"`
	ContainerID string `json:"containerID,omitempty"`
	Netns       string `json:"netns,omitempty"`
	IfName      string `json:"ifName,omitempty"`
	// Args is CNI_ARGS, "K=V;K2=V2".
	Args string `json:"args,omitempty"`
	// Config is the plugin's configuration from stdin, with what the runtime
	// injected (prevResult, cni.dev/valid-attachments).
	Config json.RawMessage `json:"config,omitempty"`
}

// Reply is the agent's answer: a result (ADD: a types100 result) or a CNI error.
type Reply struct {
	Result json.RawMessage `json:"result,omitempty"`
	Error  *types.Error    `json:"error,omitempty"`
}

// Handler is what the agent implements. A non-nil *types.Error is sent to the
// runtime as it is; the handler picks the spec's code.
type Handler interface {
	Handle(ctx context.Context, req *Request) (json.RawMessage, *types.Error)
}

// Listen opens the agent's socket at path, readable and writable by root
// only: whoever can speak on it can create interfaces in any netns. A stale
// socket from an earlier run is replaced.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create the CNI socket's directory: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove the stale CNI socket %s: %w", path, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on the CNI socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("restrict the CNI socket %s to root: %w", path, err)
	}
	return l, nil
}

// Serve answers plugin requests on l with h until ctx ends. Requests are
// handled concurrently: nothing here serialises ADDs.
func Serve(ctx context.Context, l net.Listener, h Handler) error {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/{command}", func(w http.ResponseWriter, r *http.Request) {
		var req Request
		var rep Reply
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
			rep.Error = types.NewError(types.ErrDecodingFailure, "mizar-nodeagent could not decode the plugin's request", err.Error())
		} else {
			req.Command = r.PathValue("command")
			rep.Result, rep.Error = h.Handle(r.Context(), &req)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&rep)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving the CNI socket: %w", err)
	}
	return nil
}

// errAgentDown means the agent's socket could not be reached at all, as
// opposed to an answer that carried an error.
var errAgentDown = errors.New("mizar-nodeagent is not reachable")

// call sends req to the agent at socket and returns its reply.
func call(ctx context.Context, socket string, req *Request) (*Reply, error) {
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableKeepAlives: true,
	}}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://mizar-nodeagent/v1/"+req.Command, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(hr)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return nil, fmt.Errorf("%w at %s: %v", errAgentDown, socket, op.Err)
		}
		return nil, fmt.Errorf("talking to mizar-nodeagent at %s: %w", socket, err)
	}
	defer resp.Body.Close()
	var rep Reply
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&rep); err != nil {
		return nil, fmt.Errorf("decoding mizar-nodeagent's reply (HTTP %s): %w", resp.Status, err)
	}
	return &rep, nil
}
