package aggregated

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"mizar.dev/pkg/nodeagent"
)

// TestAgentSeesItsDaemonSetDeleted: the agent tells mizar's removal (its
// DaemonSet deleted) from a restart (the DaemonSet stays) through a real
// kube-apiserver's watch, and still knows after its RBAC is gone, as with
// helm uninstall, which deletes the RBAC before the agents' pods stop.
func TestAgentSeesItsDaemonSetDeleted(t *testing.T) {
	admin := newKC(t, kubectls[0].path, cl.AdminKubeconfig)
	s := suffix()
	kept, removed := "agent-kept-"+s, "agent-removed-"+s
	for _, name := range []string{kept, removed} {
		admin.okIn(fmt.Sprintf(`apiVersion: apps/v1
kind: DaemonSet
metadata: {name: %[1]s, namespace: mizar-system}
spec:
  selector: {matchLabels: {app: %[1]s}}
  template:
    metadata: {labels: {app: %[1]s}}
    spec: {containers: [{name: agent, image: mizar.dev/mizar-nodeagent:dev}]}
`, name), "create", "-f", "-")
	}
	t.Cleanup(func() {
		admin.run("", "delete", "daemonset", "-n", "mizar-system", kept, removed, "--ignore-not-found")
	})
	cfg, err := clientcmd.BuildConfigFromFlags("", cl.AdminKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	wKept := nodeagent.WatchDaemonSet(ctx, client, "mizar-system", kept)
	wRemoved := nodeagent.WatchDaemonSet(ctx, client, "mizar-system", removed)
	time.Sleep(time.Second) // the watches' first lists
	admin.ok("delete", "daemonset", "-n", "mizar-system", removed, "--wait=false")
	// Seen by the watch, without asking again: a client with no rights at all
	// (the state of an agent after helm deleted its RBAC) gets the same answer.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return wRemoved.Deleted(ctx), nil
	})
	if err != nil {
		t.Fatalf("the deletion of %s was not seen: %v", removed, err)
	}
	if wKept.Deleted(ctx) {
		t.Errorf("%s, not deleted, reads as deleted", kept)
	}
	// A GET that is refused keeps the node's state.
	anon := kubernetes.NewForConfigOrDie(rest.AnonymousClientConfig(cfg))
	if nodeagent.WatchDaemonSet(ctx, anon, "mizar-system", kept).Deleted(ctx) {
		t.Errorf("a refused GET reads as deleted")
	}
}
