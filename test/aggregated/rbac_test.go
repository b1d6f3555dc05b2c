package aggregated

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestEditorsHaveNoNetworkPowers: through the aggregator, with the roles of
// artifacts/deploy/rbac.yaml folded into the built-in edit role by
// kube-controller-manager, a namespace editor orders services (ServiceInstance,
// ServiceBinding) and reads endpoints, but cannot create or change an Endpoint,
// write any /status or touch the placement kinds, in its namespace or, bound
// cluster-wide, anywhere.
func TestEditorsHaveNoNetworkPowers(t *testing.T) {
	k := newKC(t, kubectls[0].path, cl.AdminKubeconfig)
	s := suffix()
	ns, editor, clusterEditor := "edit-"+s, "editor-"+s, "cluster-editor-"+s
	k.ok("create", "namespace", ns)
	t.Cleanup(func() { k.run("", "delete", "namespace", ns, "--wait=false") })
	k.ok("create", "rolebinding", "editor", "--clusterrole=edit", "--user="+editor, "-n", ns)
	k.ok("create", "clusterrolebinding", clusterEditor, "--clusterrole=edit", "--user="+clusterEditor)
	t.Cleanup(func() { k.run("", "delete", "clusterrolebinding", clusterEditor) })

	a, b := rand.IntN(200)+20, rand.IntN(250)
	vpc, subnet, class := "edit-"+s, "edit-"+s, "edit-"+s
	t.Cleanup(func() {
		k.run("", "delete", "serviceclass", class, "--ignore-not-found", "--wait=false")
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
	endpoint := func(name string) string {
		return fmt.Sprintf(`apiVersion: networking.mizar.dev/v1alpha1
kind: Endpoint
metadata: {name: %s, namespace: %s}
spec: {subnet: %s, droplet: node-edit, pod: %s, mac: "02:ed:%02x:%02x:00:%02x"}
`, name, ns, subnet, name, a, b, len(name))
	}
	k.okIn(endpoint("by-agent"), "create", "-f", "-")
	data, err := os.ReadFile(filepath.Join(repoRoot, "artifacts/broker/mysql-class.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	classYAML := strings.Replace(string(data), "\n  name: mysql\n", "\n  name: "+class+"\n", 1)
	classYAML = strings.ReplaceAll(classYAML, "4d9c2a3e-", fmt.Sprintf("%08x-", rand.Uint32()))
	k.okIn(classYAML, "create", "-f", "-")

	// kube-controller-manager folds mizar-edit into edit within seconds.
	deadline := time.Now().Add(60 * time.Second)
	for k.run("", "auth", "can-i", "create", "serviceinstances.broker.mizar.dev", "-n", ns, "--as="+editor).stdout != "yes" {
		if time.Now().After(deadline) {
			t.Fatalf("edit does not include mizar-edit 60 s after start")
		}
		time.Sleep(time.Second)
	}

	// What editors need: order a service and bind it, read the network.
	as := "--as=" + editor
	k.okIn(fmt.Sprintf("apiVersion: broker.mizar.dev/v1alpha1\nkind: ServiceInstance\nmetadata: {name: db, namespace: %s}\nspec: {class: %s, plan: small}\n", ns, class),
		"create", "-f", "-", as)
	k.okIn(fmt.Sprintf("apiVersion: broker.mizar.dev/v1alpha1\nkind: ServiceBinding\nmetadata: {name: app, namespace: %s}\nspec: {instance: db}\n", ns),
		"create", "-f", "-", as)
	k.ok("get", "mep", "-n", ns, as)
	k.ok("get", "serviceinstance", "db", "-n", ns, "-o", "name", as)

	// What they must not do.
	status := `{"status":{"phase":"Provisioned"}}`
	if r := k.run(endpoint("by-editor"), "create", "-f", "-", as); r.err == nil || !strings.Contains(r.stderr, "(Forbidden)") {
		t.Errorf("an editor created an endpoint: %s", r)
	}
	k.forbidden("patch", "mep", "by-agent", "-n", ns, "--type=merge", "-p", `{"spec":{"droplet":"elsewhere"}}`, as)
	k.forbidden("delete", "mep", "by-agent", "-n", ns, as)
	for _, obj := range []string{"mep/by-agent", "serviceinstance/db", "servicebinding/app"} {
		k.forbidden("patch", obj, "-n", ns, "--subresource=status", "--type=merge", "-p", status, as)
	}
	for _, user := range []string{editor, clusterEditor} {
		for _, obj := range []string{"vpc/" + vpc, "subnet/" + subnet} {
			k.forbidden("patch", obj, "--subresource=status", "--type=merge", "-p", status, "--as="+user)
			k.forbidden("delete", obj, "--as="+user)
		}
		if r := k.run(uniqueDroplet("edit-"+suffix()), "create", "-f", "-", "--as="+user); r.err == nil || !strings.Contains(r.stderr, "(Forbidden)") {
			t.Errorf("%s created a droplet: %s", user, r)
		}
		for _, kind := range []string{"bouncers", "dividers", "droplets"} {
			if got := k.run("", "auth", "can-i", "create", kind+".networking.mizar.dev", "--as="+user).stdout; got != "no" {
				t.Errorf("%s may create %s: %q", user, kind, got)
			}
		}
	}
	// Bound cluster-wide, still no endpoint in another tenant's namespace.
	if r := k.run(endpoint("by-cluster-editor"), "create", "-f", "-", "--as="+clusterEditor); r.err == nil || !strings.Contains(r.stderr, "(Forbidden)") {
		t.Errorf("a cluster-wide editor created an endpoint: %s", r)
	}
	k.ok("delete", "servicebinding", "app", "-n", ns, as)
	k.ok("delete", "serviceinstance", "db", "-n", ns, as, "--wait=false")
}
