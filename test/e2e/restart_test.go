package e2e

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

// identity prints what must survive a restart unchanged: every object's
// identity, version and spec (allocated VNI and IP included).
const identity = `jsonpath={range .items[*]}{.kind}/{.metadata.name} uid={.metadata.uid} rv={.metadata.resourceVersion} spec={.spec}{"\n"}{end}`

func TestRestartKeepsObjects(t *testing.T) {
	begin(t)
	o := newObjects("rst", 47)
	path := applyManifest(t, o)
	before := mustKubectl(t, "get", "-f", path, "-o", identity)
	if n := len(lines(before)); n != 6 {
		t.Fatalf("kubectl get -f %s printed %d objects, want 6:\n%s", path, n, before)
	}
	oldConfig, err := os.ReadFile(srv.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}

	if err := srv.stop(); err != nil {
		t.Fatalf("stopping mizar-apiserver with SIGTERM: %v\n%s", err, srv.output())
	}
	next, err := startServer(sharedDataDir)
	if err != nil {
		t.Fatalf("restarting mizar-apiserver on %s: %v", sharedDataDir, err)
	}
	srv = next

	newConfig, err := os.ReadFile(srv.kubeconfig)
	if err != nil {
		t.Fatalf("no kubeconfig after the restart: %v", err)
	}
	t.Logf("server before: %s; after: %s", serverURL(oldConfig), serverURL(newConfig))

	if after := mustKubectl(t, "get", "-f", path, "-o", identity); after != before {
		t.Errorf("objects changed across the restart:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	got := lines(mustKubectl(t, "get", "mizar", "-A", "-o", "name"))
	for _, ref := range o.refs() {
		if !slices.Contains(got, ref) {
			t.Errorf("after the restart kubectl get mizar -A does not list %s", ref)
		}
	}

	// Allocation state is rebuilt from the stored objects: a new endpoint in the
	// subnet gets the next address, not the first one again.
	second := fmt.Sprintf("apiVersion: networking.mizar.dev/v1alpha1\nkind: Endpoint\nmetadata:\n  name: %s-ep-2\n  namespace: %s\nspec:\n  subnet: %s\n  droplet: %s\n  mac: \"02:00:00:00:2f:22\"\n", o.prefix, o.namespace, o.subnet, o.droplet)
	mustKubectl(t, "apply", "-f", writeFile(t, "second.yaml", second))
	want := fmt.Sprintf("10.%d.1.3", o.octet)
	if ip := mustKubectl(t, "get", "mep", o.prefix+"-ep-2", "-n", o.namespace, "-o", "jsonpath={.spec.ip}"); ip != want {
		t.Errorf("an endpoint created after the restart got %q, want %s", ip, want)
	}
}

// serverURL is the kubeconfig's server line, for the log.
func serverURL(kubeconfig []byte) string {
	for _, l := range strings.Split(string(kubeconfig), "\n") {
		if s, ok := strings.CutPrefix(strings.TrimSpace(l), "server: "); ok {
			return s
		}
	}
	return "(none)"
}
