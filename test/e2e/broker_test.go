package e2e

import (
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// TestBrokerKindsThroughKubectl applies the shipped catalog entry and an order
// with kubectl, and reads them back as a person would. Everything is deleted
// at the end: other tests list the whole mizar category.
func TestBrokerKindsThroughKubectl(t *testing.T) {
	begin(t)
	_, file, _, _ := runtime.Caller(0)
	classYAML, err := os.ReadFile(filepath.Join(filepath.Dir(file), "../../artifacts/broker/mysql-class.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	class, ns := unique("mysql"), unique("shop")
	classFile := writeFile(t, "class.yaml", strings.Replace(string(classYAML), "name: mysql\n", "name: "+class+"\n", 1))
	mustKubectl(t, "apply", "-f", classFile)
	t.Cleanup(func() { kubectl(t, "delete", "serviceclass", class, "--ignore-not-found") })

	order := func(name, params string) string {
		return "apiVersion: broker.mizar.dev/v1alpha1\nkind: ServiceInstance\nmetadata:\n  name: " + name + "\n  namespace: " + ns +
			"\nspec:\n  class: " + class + "\n  plan: ha\n  parameters: " + params + "\n"
	}
	t.Cleanup(func() { kubectl(t, "delete", "serviceinstances", "--all", "-n", ns) })
	bad := kubectlMustFail(t, "apply", "-f", writeFile(t, "bad.yaml", order("bad", `{"maxConnections": 1}`)))
	if !strings.Contains(bad.stderr, "spec.parameters.maxConnections") {
		t.Errorf("kubectl apply of bad parameters: %q does not name the field", bad.stderr)
	}
	mustKubectl(t, "apply", "-f", writeFile(t, "good.yaml", order("db", `{"database": "shop"}`)))

	// STEP is empty until the operator starts, so only the header splits cleanly.
	got := lines(mustKubectl(t, "get", "msi", "-n", ns))
	if want := []string{"NAME", "CLASS", "PLAN", "STEP", "PHASE", "AGE"}; len(got) != 2 || !slices.Equal(strings.Fields(got[0]), want) ||
		!strings.Contains(got[1], "Pending") {
		t.Errorf("kubectl get msi printed %q, want header %q and a Pending row", got, want)
	}
	if out := mustKubectl(t, "get", "mizar", "-n", ns, "-o", "name"); !strings.Contains(out, "serviceinstance.broker.mizar.dev/db") {
		t.Errorf("kubectl get mizar -n %s: %q", ns, out)
	}
	if out := mustKubectl(t, "get", "msc", class, "-o", "wide"); !strings.Contains(out, "small,ha") {
		t.Errorf("kubectl get msc -o wide: %q", out)
	}
	if out := mustKubectl(t, "explain", "serviceinstance.spec.deadline"); !strings.Contains(out, "deadline bounds provisioning") {
		t.Errorf("kubectl explain: %q", out)
	}
	mustKubectl(t, "delete", "serviceinstance", "db", "-n", ns)
}
