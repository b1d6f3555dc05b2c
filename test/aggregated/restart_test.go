package aggregated

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"mizar.dev/test/cluster"
)

// TestMizarRestart: while mizar-apiserver is down kube-apiserver keeps serving
// everything else, the APIService turns Available=False and mizar's kinds answer
// 503; after a restart the APIService is Available again and the data is there.
func TestMizarRestart(t *testing.T) {
	k := newKC(t, kubectls[0].path, cl.AdminKubeconfig)
	name := "restart-" + suffix()
	k.okIn(uniqueDroplet(name), "create", "-f", "-")
	t.Cleanup(func() { k.run("", "delete", "droplet", name, "--ignore-not-found", "--wait=false") })

	stopped := time.Now()
	if err := cl.StopMizar(); errors.Is(err, cluster.ErrKilled) {
		// Slow graceful shutdown with proxied watches open is issue 6's to fix
		// and test; here only the restart matters.
		t.Logf("mizar-apiserver was killed after SIGTERM: %v", err)
	} else if err != nil {
		t.Fatalf("stopping mizar-apiserver: %v", err)
	}
	t.Logf("mizar-apiserver stopped in %v", time.Since(stopped).Round(time.Millisecond))
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			// Later tests need it; a failure here is this test's.
			if err := cl.StartMizar(context.Background()); err != nil {
				t.Errorf("restarting mizar-apiserver: %v", err)
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	if err := cl.WaitAPIService(ctx, false); err != nil {
		t.Fatalf("APIService did not turn Available=False with mizar-apiserver down: %v", err)
	}
	t.Logf("APIService Available=False %v after the stop", time.Since(start).Round(time.Millisecond))
	k.ok("get", "namespaces")
	k.ok("get", "clusterroles", "mizar-view")
	if r := k.run("", "get", "droplets"); r.err == nil || !strings.Contains(r.stderr, "ServiceUnavailable") && !strings.Contains(r.stderr, "the server is currently unable") {
		t.Errorf("kubectl get droplets with mizar-apiserver down: want 503, got %s", r)
	}

	start = time.Now()
	if err := cl.StartMizar(ctx); err != nil {
		t.Fatalf("restarting mizar-apiserver: %v", err)
	}
	restarted = true
	if err := cl.WaitAPIService(ctx, true); err != nil {
		t.Fatalf("APIService did not become Available again: %v", err)
	}
	t.Logf("APIService Available again %v after the restart", time.Since(start).Round(time.Millisecond))
	if got := k.ok("get", "droplet", name, "-o", "jsonpath={.metadata.name}"); got != name {
		t.Errorf("droplet after the restart: %q", got)
	}
}

// TestAggregatedClusterRoles: with kube-controller-manager running, mizar-view is
// folded into the built-in view role, so a user bound to view can list droplets.
func TestAggregatedClusterRoles(t *testing.T) {
	k := newKC(t, kubectls[0].path, cl.AdminKubeconfig)
	user := "view-" + suffix()
	k.ok("create", "clusterrolebinding", user, "--clusterrole=view", "--user="+user)
	t.Cleanup(func() { k.run("", "delete", "clusterrolebinding", user) })
	deadline := time.Now().Add(60 * time.Second)
	for {
		r := k.run("", "get", "droplets", "--as="+user)
		if r.err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a user bound to view still cannot list droplets after 60 s: %s", r)
		}
		time.Sleep(time.Second)
	}
	name := "view-" + suffix()
	if r := k.run(uniqueDroplet(name), "create", "-f", "-", "--as="+user); r.err == nil || !strings.Contains(r.stderr, "(Forbidden)") {
		k.run("", "delete", "droplet", name)
		t.Errorf("a user bound to view created a droplet: %s", r)
	}
}
