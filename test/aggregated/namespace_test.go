package aggregated

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// namespaceDeletion bounds `kubectl delete namespace`: kube-controller-manager
// finishes an empty namespace in seconds.
const namespaceDeletion = 60 * time.Second

// TestNamespaceDeletion: kube-controller-manager's namespace deleter asks every
// aggregated API with Accept: protobuf,json (kubernetes#86666). With mizar
// registered, deleting a namespace finishes, whether it holds mizar Endpoints or
// never held a mizar object, and the Endpoints are gone afterwards.
func TestNamespaceDeletion(t *testing.T) {
	k := newKC(t, kubectls[0].path, cl.AdminKubeconfig)
	s := suffix()
	a, b := rand.IntN(200)+20, rand.IntN(250)
	vpc, subnet := "nsdel-"+s, "nsdel-"+s
	t.Cleanup(func() {
		k.run("", "delete", "subnet", subnet, "--ignore-not-found", "--wait=false")
		k.run("", "delete", "vpc", vpc, "--ignore-not-found", "--wait=false")
	})
	k.okIn(fmt.Sprintf(`apiVersion: networking.mizar.dev/v1alpha1
kind: Vpc
metadata: {name: %s}
spec: {cidr: 10.%d.%d.0/24}
---
apiVersion: networking.mizar.dev/v1alpha1
kind: Subnet
metadata: {name: %s}
spec: {vpc: %s, cidr: 10.%d.%d.0/25}
`, vpc, a, b, subnet, vpc, a, b), "create", "-f", "-")

	withEndpoints, empty := "nsdel-mep-"+s, "nsdel-empty-"+s
	for _, ns := range []string{withEndpoints, empty} {
		k.ok("create", "namespace", ns)
		t.Cleanup(func() { k.run("", "delete", "namespace", ns, "--ignore-not-found", "--wait=false") })
	}
	for i := range 3 {
		k.okIn(fmt.Sprintf(`apiVersion: networking.mizar.dev/v1alpha1
kind: Endpoint
metadata: {name: pod-%d, namespace: %s}
spec: {subnet: %s, droplet: node-nsdel, pod: pod-%d, mac: "02:ee:%02x:%02x:00:%02x"}
`, i, withEndpoints, subnet, i, a, b, i), "create", "-f", "-")
	}
	if got := strings.Fields(k.ok("get", "mep", "-n", withEndpoints, "-o", "name")); len(got) != 3 {
		t.Fatalf("namespace %s holds %v, want 3 endpoints", withEndpoints, got)
	}

	for _, ns := range []string{empty, withEndpoints} {
		start := time.Now()
		r := k.run("", "delete", "namespace", ns, fmt.Sprintf("--timeout=%s", namespaceDeletion))
		if r.err != nil {
			cond := k.run("", "get", "namespace", ns, "-o", "jsonpath={.status.conditions}")
			t.Errorf("kubectl delete namespace %s did not finish in %v: %s\nconditions: %s", ns, namespaceDeletion, r, cond.stdout)
			continue
		}
		t.Logf("namespace %s deleted in %v", ns, time.Since(start).Round(time.Millisecond))
	}
	if got := k.ok("get", "mep", "-A", "--field-selector", "metadata.namespace="+withEndpoints, "-o", "name"); got != "" {
		t.Errorf("endpoints left after their namespace was deleted: %s", got)
	}
}
