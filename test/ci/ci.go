// Package ci decides what a test does when something it needs is missing:
// it skips on a developer's machine, and fails under CI (CI=true), where a
// skipped test would pass unseen.
package ci

import (
	"os"
	"testing"
)

// Enforced reports whether missing prerequisites fail tests (CI=true).
func Enforced() bool { return os.Getenv("CI") == "true" }

// Unavailable ends t because a prerequisite is missing: why says which.
func Unavailable(t testing.TB, why string) {
	t.Helper()
	if Enforced() {
		t.Fatal(why + "; CI=true, so this fails instead of skipping")
	}
	t.Skip(why)
}

// RequireRoot ends t unless it runs as root; why says what needs root.
func RequireRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "needs root: "+why)
	}
}
