package aggregated

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// TestAgentNodeIdentity: node agents share one ServiceAccount, yet each may
// write only its own node's objects. kube-apiserver issues real bound tokens
// (TokenRequest bound to a pod on a node) that carry the node's name in the
// user's extra; the aggregator forwards it (X-Remote-Extra-Authentication.
// kubernetes.io%2fnode-name) and mizar-apiserver's dropletrestriction, told
// the agents' ServiceAccount by --node-agent-service-account, maps it to that
// node's Droplet. node-a's token is refused (403) on node-b's objects and
// allowed on its own; a token bound to no pod may write nothing.
func TestAgentNodeIdentity(t *testing.T) {
	admin := newKC(t, kubectls[0].path, cl.AdminKubeconfig)
	s := suffix()
	nodeA, nodeB := "node-a-"+s, "node-b-"+s
	vpc := "idvpc-" + s
	// The agents' RBAC exactly as shipped, then two nodes and an agent pod on each.
	admin.ok("apply", "-f", filepath.Join(repoRoot, "artifacts/deploy/agent-rbac.yaml"))
	t.Cleanup(func() {
		admin.run("", "delete", "droplet", nodeA, nodeB, "--ignore-not-found")
		admin.run("", "delete", "vpc", vpc, "--ignore-not-found")
		admin.run("", "delete", "pod", "-n", "mizar-system", "agent-"+nodeA, "agent-"+nodeB, "--ignore-not-found", "--grace-period=0", "--force")
		admin.run("", "delete", "node", nodeA, nodeB, "--ignore-not-found")
	})
	for _, n := range []string{nodeA, nodeB} {
		admin.okIn(fmt.Sprintf("apiVersion: v1\nkind: Node\nmetadata: {name: %s}\n", n), "create", "-f", "-")
		admin.okIn(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: agent-%s, namespace: mizar-system}
spec:
  nodeName: %s
  serviceAccountName: mizar-agent
  containers: [{name: agent, image: mizar.dev/mizar-nodeagent:dev}]
`, n, n), "create", "-f", "-")
	}
	admin.okIn(fmt.Sprintf("apiVersion: networking.mizar.dev/v1alpha1\nkind: Vpc\nmetadata: {name: %s}\nspec: {cidr: 10.211.0.0/16}\n", vpc), "create", "-f", "-")

	asToken := func(token string) kc {
		cfg, err := clientcmd.LoadFromFile(cl.AdminKubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		ctx := cfg.Contexts[cfg.CurrentContext]
		out := clientcmdapi.NewConfig()
		out.Clusters["c"] = cfg.Clusters[ctx.Cluster]
		out.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: token}
		out.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
		out.CurrentContext = "c"
		f := filepath.Join(t.TempDir(), "token.kubeconfig")
		if err := clientcmd.WriteToFile(*out, f); err != nil {
			t.Fatal(err)
		}
		return newKC(t, kubectls[0].path, f)
	}
	boundTo := func(pod string) kc {
		return asToken(admin.ok("create", "token", "mizar-agent", "-n", "mizar-system", "--bound-object-kind=Pod", "--bound-object-name="+pod, "--duration=10m"))
	}
	a, b := boundTo("agent-"+nodeA), boundTo("agent-"+nodeB)
	// The extra is really there: kube-apiserver says who the token is.
	if who := a.ok("auth", "whoami", "-o", "json"); !strings.Contains(who, `"authentication.kubernetes.io/node-name": [`) || !strings.Contains(who, `"`+nodeA+`"`) {
		t.Fatalf("node-a's token does not carry its node name: %q", who)
	}

	// Own droplet: allowed, spec and status.
	a.okIn(uniqueDroplet(nodeA), "create", "-f", "-")
	a.ok("patch", "droplet", nodeA, "--subresource=status", "--type=merge", "-p", `{"status":{"phase":"Provisioned"}}`)
	b.okIn(uniqueDroplet(nodeB), "create", "-f", "-")
	// node-a on node-b's objects: refused.
	a.forbidden("patch", "droplet", nodeB, "--type=merge", "-p", `{"spec":{"interface":"eth9"}}`)
	a.forbidden("patch", "droplet", nodeB, "--subresource=status", "--type=merge", "-p", `{"status":{"phase":"Provisioned"}}`)
	a.forbidden("delete", "droplet", nodeB)
	r := a.run(uniqueDroplet("node-c-"+s), "create", "-f", "-")
	if r.err == nil || !strings.Contains(r.stderr, "Forbidden") {
		t.Errorf("node-a created another node's droplet: %s", r)
	}
	// Nor any VPC (RBAC lets agents read them; admission refuses the write).
	a.forbidden("delete", "vpc", vpc)
	// A token of the agents' ServiceAccount bound to no pod names no node: no writes.
	unbound := asToken(admin.ok("create", "token", "mizar-agent", "-n", "mizar-system", "--duration=10m"))
	r = unbound.run("", "patch", "droplet", nodeB, "--subresource=status", "--type=merge", "-p", `{"status":{"phase":"Provisioned"}}`)
	if r.err == nil || !strings.Contains(r.stderr, "names no node") {
		t.Errorf("an unbound agent token wrote: %s", r)
	}
	// Nothing refused changed anything.
	if got := admin.ok("get", "droplet", nodeB, "-o", "jsonpath={.spec.interface}"); got != "eth0" {
		t.Errorf("node-b's droplet interface is %q after node-a's refused patch", got)
	}
	if got := admin.ok("get", "droplet", nodeA, "-o", "jsonpath={.status.phase}"); got != "Provisioned" {
		t.Errorf("node-a's droplet phase %q", got)
	}
	admin.ok("get", "vpc", vpc)
}
