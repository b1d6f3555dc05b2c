// Package apiservertest runs a real standalone mizar-apiserver in the test
// process: the same options and code path as the binary, an embedded etcd in a
// data directory of the test's, and a free loopback port.
package apiservertest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"mizar.dev/pkg/apiserver"
	"mizar.dev/pkg/generated/clientset/versioned"
)

// Server is a running mizar-apiserver.
type Server struct {
	DataDir    string
	Kubeconfig string
	Config     *rest.Config
	Client     versioned.Interface

	cancel context.CancelFunc
	done   chan error
}

// Start runs a standalone server on dataDir with extra command-line flags and
// returns once /readyz passes. It is stopped when the test ends.
func Start(t testing.TB, dataDir string, flags ...string) *Server {
	t.Helper()
	return StartWithOptions(t, dataDir, func(*apiserver.Options) {}, flags...)
}

// New is Start for callers without a testing.TB (TestMain); they call Stop.
func New(dataDir string, flags ...string) (*Server, error) {
	return NewWithOptions(dataDir, func(*apiserver.Options) {}, flags...)
}

// StartWithOptions is Start with a hook that adjusts the options after the
// flags are parsed (e.g. to set Options.WrapStorage).
func StartWithOptions(t testing.TB, dataDir string, adjust func(*apiserver.Options), flags ...string) *Server {
	t.Helper()
	s, err := NewWithOptions(dataDir, adjust, flags...)
	if err != nil {
		t.Fatalf("starting mizar-apiserver: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stopping mizar-apiserver: %v", err)
		}
	})
	return s
}

// NewWithOptions is New with the options hook of StartWithOptions.
func NewWithOptions(dataDir string, adjust func(*apiserver.Options), flags ...string) (*Server, error) {
	opts := apiserver.NewOptions()
	fs := pflag.NewFlagSet("mizar-apiserver", pflag.ContinueOnError)
	opts.AddFlags(fs)
	// Operators are off unless a test asks for them (--operators=true): storage
	// tests write phases and placements by hand and must not race them.
	args := []string{"--standalone", "--data-dir", dataDir, "--secure-port", "0", "--operators=false"}
	if !slices.ContainsFunc(flags, func(f string) bool { return strings.HasPrefix(f, "--etcd-servers") }) {
		// Only the embedded etcd has fsync to skip; the server refuses the flag otherwise.
		args = append(args, "--embedded-etcd-unsafe-no-fsync")
	}
	args = append(args, flags...)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	adjust(opts)
	// The kubeconfig appears once this run listens; an old one names an old port.
	kubeconfig := opts.KubeconfigPath()
	if err := os.Remove(kubeconfig); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}

	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{DataDir: dataDir, Kubeconfig: kubeconfig, cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- opts.Run(ctx) }()

	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-s.done:
			s.done <- err
			return false, fmt.Errorf("server exited: %w", err)
		default:
		}
		if _, err := os.Stat(kubeconfig); err != nil {
			return false, nil
		}
		if s.Config == nil {
			cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
			if err != nil {
				return false, err
			}
			// Tests and benchmarks measure the server, not client-go's default 5 QPS limit.
			cfg.QPS, cfg.Burst = 1e6, 1e6
			s.Config = cfg
			if s.Client, err = versioned.NewForConfig(cfg); err != nil {
				return false, err
			}
		}
		body, err := s.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok", nil
	})
	if err != nil {
		stopErr := s.Stop()
		return nil, errors.Join(fmt.Errorf("waiting for readiness: %w", err), stopErr)
	}
	return s, nil
}

// Stop shuts the server down and waits for it, embedded etcd included. Safe to
// call more than once.
func (s *Server) Stop() error {
	if s.cancel == nil {
		return nil
	}
	s.cancel()
	s.cancel = nil
	select {
	case err := <-s.done:
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	case <-time.After(time.Minute):
		return errors.New("server did not stop within a minute")
	}
}
