package e2e

import (
	"os/exec"
	"syscall"
)

// dieWithTest makes the kernel kill the server if the test process dies without
// running its cleanup (a panic, or go test's -timeout), so no server outlives it.
func dieWithTest(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
