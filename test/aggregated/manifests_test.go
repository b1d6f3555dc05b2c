package aggregated

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestDeployManifests: every object in artifacts/deploy passes kube-apiserver's
// own validation and admission (server-side dry run; namespace and RBAC are
// applied for real at start-up, and mizar-apiserver running on them proves them).
func TestDeployManifests(t *testing.T) {
	k := newKC(t, kubectls[0].path, cl.AdminKubeconfig)
	out := k.ok("apply", "--dry-run=server", "-f", filepath.Join(repoRoot, "artifacts/deploy"))
	for _, want := range []string{
		"service/mizar-apiserver", "deployment.apps/mizar-apiserver", "poddisruptionbudget.policy/mizar-apiserver",
		"apiservice.apiregistration.k8s.io/v1alpha1.networking.mizar.dev",
		"daemonset.apps/mizar-agent", "configmap/mizar-cni", "clusterrole.rbac.authorization.k8s.io/mizar-view",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl apply --dry-run=server -f artifacts/deploy did not report %s:\n%s", want, out)
		}
	}
}
