// Command pause is the kind node's sandbox ("pause") image: it holds a pod's
// namespaces open, reaps the orphans that share its PID namespace, and exits
// on SIGINT/SIGTERM, as Kubernetes' C pause (build/pause) does. Go, so the
// image is built from the module proxy like every other image here.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		// Reap every exited child (with a shared PID namespace, pause is PID 1).
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
