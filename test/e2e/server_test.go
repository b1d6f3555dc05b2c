package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

const (
	startTimeout = time.Minute
	// stopTimeout is how long a SIGTERMed server may take before it is killed.
	stopTimeout = 30 * time.Second
)

// server is a standalone mizar-apiserver subprocess.
type server struct {
	dataDir    string
	kubeconfig string
	cmd        *exec.Cmd
	log        *lockedBuffer // its stdout and stderr

	exited  chan struct{} // closed once the process is reaped
	waitErr error         // cmd.Wait's result, set before exited closes
}

// startServer runs the binary standalone on dataDir (reusing what a previous run
// left there), with extra flags, and returns once /readyz answers ok through kubectl.
func startServer(dataDir string, extra ...string) (*server, error) {
	s := &server{dataDir: dataDir, kubeconfig: filepath.Join(dataDir, "kubeconfig"), log: &lockedBuffer{}, exited: make(chan struct{})}
	// The kubeconfig appears once this run listens; one left by a previous run
	// names a port that may be gone.
	if err := os.Remove(s.kubeconfig); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing the previous kubeconfig: %w", err)
	}
	// These tests write phases and placements by hand; operators would race them.
	args := append([]string{"--standalone", "--data-dir", dataDir, "--secure-port", "0", "--operators=false"}, extra...)
	if !slices.Contains(extra, "--etcd-servers") {
		// Only the embedded etcd has the flag (it is refused beside --etcd-servers).
		args = append(args, "--embedded-etcd-unsafe-no-fsync")
	}
	s.cmd = exec.Command(apiserverBin, args...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	dieWithTest(s.cmd)
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", apiserverBin, err)
	}
	go func() {
		s.waitErr = s.cmd.Wait()
		close(s.exited)
	}()

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	var last string
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		select {
		case <-s.exited:
			return false, fmt.Errorf("mizar-apiserver exited: %v", s.waitErr)
		default:
		}
		if _, err := os.Stat(s.kubeconfig); err != nil {
			last = "no kubeconfig yet"
			return false, nil
		}
		res := runKubectl(ctx, s.kubeconfig, nil, "get", "--raw", "/readyz")
		last = res.String()
		return res.err == nil && res.stdout == "ok", nil
	})
	if err != nil {
		err = fmt.Errorf("waiting for /readyz (last: %s): %w", last, err)
		select {
		case <-s.exited: // err already says how it exited
		default:
			err = errors.Join(err, s.stop())
		}
		return nil, fmt.Errorf("%w\n--- mizar-apiserver output:\n%s", err, s.output())
	}
	return s, nil
}

// stop sends SIGTERM and waits; a server still running after stopTimeout is
// killed. It reports anything but a clean exit. Safe to call more than once.
func (s *server) stop() error {
	select {
	case <-s.exited:
		return s.exitError()
	default:
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("sending SIGTERM: %w", err)
	}
	select {
	case <-s.exited:
		return s.exitError()
	case <-time.After(stopTimeout):
	}
	if err := s.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("killing after SIGTERM was ignored for %v: %w", stopTimeout, err)
	}
	<-s.exited
	return fmt.Errorf("did not exit within %v of SIGTERM and was killed", stopTimeout)
}

// kill ends the server with SIGKILL, as a crash would, and waits for it.
func (s *server) kill() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}

func (s *server) exitError() error {
	if s.waitErr != nil {
		return fmt.Errorf("mizar-apiserver exited: %w", s.waitErr)
	}
	return nil
}

// output is everything the server printed, for failure messages.
func (s *server) output() string { return s.log.From(0) }

// lockedBuffer collects a subprocess's output while tests read it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Len()
}

// From returns what was written from offset on, trimmed of trailing newlines.
func (b *lockedBuffer) From(offset int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.TrimRight(string(b.buf.Bytes()[offset:]), "\n")
}

func (b *lockedBuffer) Contains(s string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Contains(b.buf.Bytes(), []byte(s))
}
