package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestWaitForReady: every kind carries a Ready condition beside status.phase,
// so `kubectl wait --for=condition=Ready` works on each. The networking kinds'
// is derived by the server: False (the phase as its reason) from the create, True
// in the very write that makes the phase Provisioned, whoever writes it. The
// shared server runs no operators, so this test writes the phases as their
// writers would, through /status.
func TestWaitForReady(t *testing.T) {
	begin(t)
	o := newObjects("ready", 51)
	applyManifest(t, o)
	classFile, class := writeClass(t, o.prefix)
	mustKubectl(t, "create", "-f", classFile)
	orders := fmt.Sprintf(`apiVersion: broker.mizar.dev/v1alpha1
kind: ServiceInstance
metadata: {name: db, namespace: %[1]s}
spec: {class: %[2]s, plan: small}
---
apiVersion: broker.mizar.dev/v1alpha1
kind: ServiceBinding
metadata: {name: app, namespace: %[1]s}
spec: {instance: db}
`, o.namespace, class)
	mustKubectl(t, "create", "-f", writeFile(t, o.prefix+"-orders.yaml", orders))

	// A catalog entry is usable as stored: Ready from its create.
	mustKubectl(t, "wait", "--for=condition=Ready", "serviceclass/"+class, "--timeout=10s")

	// initial is Ready's reason before provisioning; "" for the broker's orders,
	// whose Ready the fulfillment operator writes with the phase (it does not run
	// here, so the test writes both as it would; test/integration/broker checks
	// the operator's own).
	type ref struct{ name, namespace, initial, patch string }
	refs := []ref{}
	networkPatch := `{"status":{"phase":"Provisioned"}}`
	for _, r := range o.refs() {
		ns := ""
		if strings.HasPrefix(r, "endpoint.") {
			ns = o.namespace
		}
		refs = append(refs, ref{r, ns, "Init", networkPatch})
	}
	brokerPatch := fmt.Sprintf(`{"status":{"phase":"Provisioned","conditions":[{"type":"Ready","status":"True","reason":"Provisioned",`+
		`"message":"every replica is ready","observedGeneration":1,"lastTransitionTime":%q}]}}`, time.Now().UTC().Format(time.RFC3339))
	refs = append(refs, ref{"serviceinstance.broker.mizar.dev/db", o.namespace, "", brokerPatch},
		ref{"servicebinding.broker.mizar.dev/app", o.namespace, "", brokerPatch})
	for _, r := range refs {
		t.Run(strings.SplitN(r.name, ".", 2)[0], func(t *testing.T) {
			ns := []string{}
			if r.namespace != "" {
				ns = []string{"-n", r.namespace}
			}
			if r.initial != "" {
				mustKubectl(t, append([]string{"wait", "--for=condition=Ready=False", r.name, "--timeout=10s"}, ns...)...)
			}
			if got := mustKubectl(t, append([]string{"get", r.name, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].reason}`}, ns...)...); got != r.initial {
				t.Errorf("Ready's reason before provisioning is %q, want %q", got, r.initial)
			}
			w := startKubectl(t, append([]string{"wait", "--for=condition=Ready", r.name, "--timeout=30s"}, ns...)...)
			mustKubectl(t, append([]string{"patch", r.name, "--subresource=status", "--type=merge", "-p", r.patch}, ns...)...)
			select {
			case <-w.exited:
			case <-time.After(30 * time.Second):
				t.Fatalf("kubectl wait --for=condition=Ready still running 30s after the phase became Provisioned:\n%v", w)
			}
			if w.err != nil {
				t.Fatalf("kubectl wait --for=condition=Ready: %v\n%v", w.err, w)
			}
			got := mustKubectl(t, append([]string{"get", r.name, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].reason}`}, ns...)...)
			if got != "Provisioned" {
				t.Errorf("Ready's reason once provisioned is %q, want Provisioned", got)
			}
		})
	}
}

// writeClass writes the shipped mysql class under a name (and ids) of its own.
func writeClass(t *testing.T, prefix string) (file, name string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "artifacts", "broker", "mysql-class.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	name = prefix + "-mysql"
	y := strings.Replace(string(data), "\n  name: mysql\n", "\n  name: "+name+"\n", 1)
	y = strings.ReplaceAll(y, "4d9c2a3e-", fmt.Sprintf("%08x-", seq.Add(1)+0x5e0000))
	return writeFile(t, prefix+"-class.yaml", y), name
}
