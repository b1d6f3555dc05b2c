// Package logtest captures klog's output in a test, to check that an outcome
// left the log line an operator would grep for.
package logtest

import (
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
	"k8s.io/klog/v2"
)

// Sink holds the lines logged since Capture.
type Sink struct {
	mu    sync.Mutex
	lines []string
}

// Capture routes klog (global and contextual loggers that fall back to it)
// into a Sink up to verbosity v until the test ends. klog is global: tests
// that capture must not run in parallel.
func Capture(t testing.TB, v int) *Sink {
	s := &Sink{}
	logger := funcr.New(func(prefix, args string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.lines = append(s.lines, strings.TrimSpace(prefix+" "+args))
	}, funcr.Options{Verbosity: v, LogTimestamp: false})
	klog.SetLoggerWithOptions(logger, klog.ContextualLogger(true))
	t.Cleanup(klog.ClearLogger)
	return s
}

// Lines returns the lines that contain every one of substrs.
func (s *Sink) Lines(substrs ...string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, l := range s.lines {
		ok := true
		for _, sub := range substrs {
			ok = ok && strings.Contains(l, sub)
		}
		if ok {
			out = append(out, l)
		}
	}
	return out
}
