package apiserver

import (
	"os"
	"runtime/debug"
	"testing"
)

func TestApplyGCPercent(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	t.Setenv("GOGC", "")
	if err := os.Unsetenv("GOGC"); err != nil {
		t.Fatal(err)
	}
	if err := applyGCPercent(0); err == nil {
		t.Fatal("--gc-percent 0 accepted")
	}
	if err := applyGCPercent(250); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetGCPercent(100); got != 250 {
		t.Fatalf("GC percent %d, want 250", got)
	}
	// GOGC chosen by whoever started the server wins.
	t.Setenv("GOGC", "100")
	if err := applyGCPercent(300); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("GC percent %d with GOGC=100, want 100", got)
	}
}
