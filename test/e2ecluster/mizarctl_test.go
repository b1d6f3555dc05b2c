package e2ecluster

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"mizar.dev/test/cluster"
)

// agentHealthPort is the chart's agent.healthPort (values.yaml): where each
// agent serves /healthz, /metrics and the debug endpoints on its node's
// loopback.
const agentHealthPort = 9095

// checkMizarctl runs mizarctl as an operator would from their machine, with
// the cluster's admin kubeconfig (a client certificate, no token) and no
// --agent: it finds the agent pods, reaches each through a port-forward of
// the API server, and authenticates with a token it requests for the
// chart's ServiceAccount mizarctl. connectivity-test must pass with every
// node's droplet healthy, drops must answer for every droplet, and trace
// must follow a ping between two of the test's pods on different nodes to
// delivery. On a node, the agent's debug endpoints refuse a caller without
// a token (401, counted) while /healthz answers.
func (w *workload) checkMizarctl(ctx context.Context, t *testing.T) {
	e := w.e
	bin, err := cluster.Mizarctl(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	mizarctl := func(args ...string) (string, int) {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(cctx, bin, append([]string{"--kubeconfig", e.kubeconfig}, args...)...)
		out, err := cmd.CombinedOutput()
		t.Logf("mizarctl %s:\n%s", strings.Join(args, " "), out)
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			return string(out), ee.ExitCode()
		case err != nil:
			t.Fatalf("mizarctl %s: %v", strings.Join(args, " "), err)
		}
		return string(out), 0
	}
	nodes, err := e.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := len(nodes.Items)

	out, code := mizarctl("connectivity-test")
	if code != 0 || !strings.Contains(out, fmt.Sprintf("PASSED: %d/%d droplets healthy", n, n)) || !strings.Contains(out, "pod-pod") {
		t.Errorf("mizarctl connectivity-test: exit %d, want 0 and PASSED with %d/%d droplets healthy and pod-pod checks", code, n, n)
	}

	out, code = mizarctl("drops")
	if code != 0 {
		t.Errorf("mizarctl drops: exit %d, want 0", code)
	}
	for _, node := range nodes.Items {
		// The droplet of a node is named after it in-cluster.
		if !strings.Contains(out, node.Name+": ") || !strings.Contains(out, "drop events since its agent started") {
			t.Errorf("mizarctl drops has no answer from the agent of %s", node.Name)
		}
	}

	if len(w.pods) > 1 {
		a := w.pods[0]
		b := w.crossNodePeer(a)
		out, code = mizarctl("trace", w.ns+"/"+a.Name, "--to", w.ns+"/"+b.Name, "--proto", "icmp")
		if code != 0 || !strings.Contains(out, "Not dropped: pod at "+b.Spec.NodeName) {
			t.Errorf("mizarctl trace %s (node %s) -> %s (node %s): exit %d, want 0 and delivered at %s", a.Name, a.Spec.NodeName, b.Name, b.Spec.NodeName, code, b.Spec.NodeName)
		}
	}

	// On the node itself: no token, no debug endpoint.
	node := nodes.Items[0].Name
	get := func(path string) string {
		t.Helper()
		script := fmt.Sprintf(`exec 3<>/dev/tcp/127.0.0.1/%d && printf 'GET %s HTTP/1.0\r\n\r\n' >&3 && cat <&3`, agentHealthPort, path)
		out, err := e.node(ctx, node, "bash", "-c", script)
		if err != nil {
			t.Errorf("GET %s on node %s: %v", path, node, err)
		}
		return out
	}
	if out := get("/state"); !strings.Contains(firstLine(out), " 401 ") {
		t.Errorf("GET /state without a token on node %s: %q, want 401", node, firstLine(out))
	}
	if out := get("/healthz"); !strings.Contains(firstLine(out), " 200 ") {
		t.Errorf("GET /healthz on node %s: %q, want 200 (kubelet's probes send no token)", node, firstLine(out))
	}
	m := regexp.MustCompile(`(?m)^mizar_nodeagent_debug_requests_total\{path="/state",result="unauthenticated"\} ([1-9][0-9]*)$`).FindStringSubmatch(get("/metrics"))
	if m == nil {
		t.Errorf("the agent of %s did not count the refused /state in mizar_nodeagent_debug_requests_total", node)
	}
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return strings.TrimSpace(l)
}
