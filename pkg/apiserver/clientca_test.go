package apiserver_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/pkg/pki"
)

// TestRemovedClientCAStopsAuthenticating replaces the client CA bundle of a
// running standalone server: the admin's certificate, verified (and cached)
// on every request before, is refused as soon as the server loads the new
// bundle, and accepted again once its CA is back.
func TestRemovedClientCAStopsAuthenticating(t *testing.T) {
	dir := shortDir(t)
	s := apiservertest.Start(t, dir)
	ctx := context.Background()
	list := func() error {
		_, err := s.Client.NetworkingV1alpha1().Vpcs().List(ctx, metav1.ListOptions{})
		return err
	}
	for range 3 {
		if err := list(); err != nil {
			t.Fatalf("as the admin: %v", err)
		}
	}
	caFile := filepath.Join(dir, "pki", "ca.crt")
	original, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "other")
	if _, err := pki.LoadOrCreateCA(other+".crt", other+".key", "another-ca"); err != nil {
		t.Fatal(err)
	}
	replace := func(path string) {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		// Written beside and renamed, as a rotation does, so the server never
		// reads half a file.
		if err := os.WriteFile(caFile+".new", b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(caFile+".new", caFile); err != nil {
			t.Fatal(err)
		}
	}
	replace(other + ".crt")
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 90*time.Second, true, func(context.Context) (bool, error) {
		err := list()
		return apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err), nil
	})
	if err != nil {
		t.Fatalf("the admin's certificate still authenticates after its CA left the bundle: %v", list())
	}
	// Refused on every request from now on, not only the first.
	for range 3 {
		if err := list(); !apierrors.IsUnauthorized(err) && !apierrors.IsForbidden(err) {
			t.Fatalf("after the CA left the bundle: %v", err)
		}
	}
	if err := os.WriteFile(other+".orig", original, 0o600); err != nil {
		t.Fatal(err)
	}
	replace(other + ".orig")
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 90*time.Second, true, func(context.Context) (bool, error) {
		return list() == nil, nil
	})
	if err != nil {
		t.Fatalf("the admin's certificate is not accepted after its CA came back: %v", list())
	}
}
