package cluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Proc is one process of a test control plane, logging to a file.
type Proc struct {
	Name    string
	Log     string
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
}

// StartProc starts cmd with its output in logFile. The kernel kills the
// process if the test binary dies without stopping it.
func StartProc(name, logFile string, cmd *exec.Cmd) (*Proc, error) {
	f, err := os.Create(logFile)
	if err != nil {
		return nil, fmt.Errorf("creating %s's log: %w", name, err)
	}
	defer f.Close()
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Proc{Name: name, Log: logFile, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is how the process ended (nil while it runs or after a clean exit).
func (p *Proc) Err() error {
	if !p.Exited() {
		return nil
	}
	return p.waitErr
}

// Tail is the last n lines of the process's log, for error messages.
func (p *Proc) Tail(n int) string {
	b, _ := os.ReadFile(p.Log)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return fmt.Sprintf("--- last lines of %s:\n%s", p.Log, strings.Join(lines, "\n"))
}

// Stop sends SIGTERM and kills the process if it has not exited in time.
func (p *Proc) Stop() error {
	if p.Exited() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(stopTimeout):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return fmt.Errorf("%s ignored SIGTERM for %v: %w", p.Name, stopTimeout, ErrKilled)
}

// ErrKilled says a process did not exit on SIGTERM in time and was killed.
var ErrKilled = errors.New("killed")

// Signal sends sig to the running process.
func (p *Proc) Signal(sig os.Signal) error {
	if p.Exited() {
		return fmt.Errorf("%s has exited", p.Name)
	}
	return p.cmd.Process.Signal(sig)
}

// Kill sends SIGKILL (no cleanup in the process) and waits for it to end.
func (p *Proc) Kill() {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// clockTicks is the unit of /proc/<pid>/stat's CPU times (USER_HZ, 100 on Linux).
const clockTicks = 100

// CPUTime is the CPU time (user + system) the process has used so far.
func (p *Proc) CPUTime() (time.Duration, error) {
	if p.cmd.Process == nil {
		return 0, fmt.Errorf("%s was not started", p.Name)
	}
	return ProcessCPUTime(p.cmd.Process.Pid)
}

// ProcessCPUTime reads a process's user + system CPU time from /proc.
func ProcessCPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("reading CPU time of process %d: %w", pid, err)
	}
	// The command name (field 2) may hold spaces: count fields after its ")".
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("parsing /proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// After the name: state is f[0], utime is field 14 of the file (f[11]), stime f[12].
	if len(f) < 13 {
		return 0, fmt.Errorf("parsing /proc/%d/stat: %d fields", pid, len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parsing /proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}
