package mizarctl_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"mizar.dev/pkg/agentapi"
	"mizar.dev/pkg/generated/clientset/versioned"
	"mizar.dev/pkg/mizarctl"
	"mizar.dev/pkg/nodeagent"
	"mizar.dev/test/workloadcluster"
)

// mizarctl against an agent with --debug-auth, both talking to a real
// kube-apiserver set up as the chart sets it up: mizarctl, whose kubeconfig
// is an admin's, requests a short-lived token for the ServiceAccount
// mizarctl and the agent serves it as that ServiceAccount (never as the
// admin, whose credential the agent does not see); without that
// ServiceAccount it sends the kubeconfig's own token; the token of a
// ServiceAccount without the grant is refused with 403, and no token at
// all (no kubeconfig) with 401, each error naming the agent and the cause.
func TestMizarctlAuthenticatesToAgents(t *testing.T) {
	wc := workloadcluster.StartAPIServer(t)
	ctx := context.Background()
	kc, err := kubernetes.NewForConfig(wc.Admin)
	if err != nil {
		t.Fatal(err)
	}
	ns := mizarctl.DefaultAgentNamespace
	srv, served := debugAuthAgent(t, ctx, kc, wc.Admin, ns, "nobody", "d1", 7)
	defer srv.Close()
	drops := func(cfg *rest.Config, sa string) ([]agentapi.DropsResponse, error) {
		a, err := mizarctl.ConnectAgents(ctx, cfg, mizarctl.AgentOptions{URLs: []string{"d1=" + srv.URL}, Namespace: ns, ServiceAccount: sa})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		// Twice: the second call sends the token the first one fetched.
		if _, err := mizarctl.Drops(ctx, a, time.Time{}, 0); err != nil {
			return nil, err
		}
		return mizarctl.Drops(ctx, a, time.Time{}, 0)
	}
	last := func() string {
		users := served()
		if len(users) == 0 {
			return ""
		}
		return users[len(users)-1]
	}

	rs, err := drops(wc.Admin, mizarctl.DefaultAgentServiceAccount)
	if err != nil || len(rs) != 1 || rs[0].Total != 7 {
		t.Fatalf("drops as an admin with the chart's ServiceAccount: %v, %+v", err, rs)
	}
	if got, want := last(), "system:serviceaccount:"+ns+":"+mizarctl.DefaultAgentServiceAccount; got != want {
		t.Errorf("the agent served %q, want the ServiceAccount %q (a short-lived token, not the admin's credential)", got, want)
	}
	if len(served()) != 2 {
		t.Errorf("the agent served %d calls, want 2", len(served()))
	}

	if _, err := drops(wc.Admin, "absent"); err != nil {
		t.Fatalf("drops with no ServiceAccount to request a token for: %v, want the kubeconfig's token sent", err)
	}
	if got := last(); got != "admin" {
		t.Errorf("without the ServiceAccount the agent served %q, want the kubeconfig's user admin", got)
	}

	noBearer := rest.AnonymousClientConfig(wc.Admin)
	_, err = drops(noBearer, "nobody")
	if err == nil || !strings.Contains(err.Error(), "agent of d1 (--agent): 401") {
		t.Errorf("drops with an anonymous kubeconfig: %v, want a 401 naming the agent", err)
	}
	nobody, err := mizarctl.AgentToken(wc.Admin, ns, "nobody")(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = drops(&rest.Config{Host: wc.Admin.Host, BearerToken: nobody, TLSClientConfig: wc.Admin.TLSClientConfig}, "nobody")
	if err == nil || !strings.Contains(err.Error(), "403 Forbidden") || !strings.Contains(err.Error(), "system:serviceaccount:"+ns+":nobody") {
		t.Errorf("drops with a ServiceAccount without the grant: %v, want 403 naming it", err)
	}
	_, err = drops(nil, "")
	if err == nil || !strings.Contains(err.Error(), "401 Unauthorized") || !strings.Contains(err.Error(), "bearer token") {
		t.Errorf("drops with no kubeconfig: %v, want 401 saying a bearer token is needed", err)
	}
}

// Without --agent, mizarctl finds the agent pods by label and names, per
// droplet (its node), why one cannot be reached: not Running, or no
// port-forward (here no kubelet runs, as none does in this test cluster).
// Pods of other labels or namespaces are not taken.
func TestForwardAgentsFindsPods(t *testing.T) {
	wc := workloadcluster.StartAPIServer(t)
	ctx := context.Background()
	kc, err := kubernetes.NewForConfig(wc.Admin)
	if err != nil {
		t.Fatal(err)
	}
	ns := mizarctl.DefaultAgentNamespace
	for _, n := range []string{ns, "elsewhere"} {
		if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		if _, err := kc.CoreV1().ServiceAccounts(n).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	pod := func(ns, name, node string, labels map[string]string, running bool) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}, Spec: corev1.PodSpec{NodeName: node, HostNetwork: true,
			Containers: []corev1.Container{{Name: "agent", Image: "agent", Command: []string{"/mizar-nodeagent"}, Args: []string{"--node-name=$(NODE_NAME)", "--health-addr=127.0.0.1:9095"}}}}}
		p, err := kc.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if running {
			p.Status.Phase = corev1.PodRunning
			if _, err := kc.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	agentLabels := map[string]string{"app.kubernetes.io/name": "mizar-agent"}
	pod(ns, "agent-a", "node-a", agentLabels, true)
	pod(ns, "agent-b", "node-b", agentLabels, false)
	pod(ns, "other", "node-c", map[string]string{"app": "other"}, true)
	pod("elsewhere", "agent-d", "node-d", agentLabels, true)

	c, err := versioned.NewForConfig(wc.Admin)
	if err != nil {
		t.Fatal(err)
	}
	a, err := mizarctl.ForwardAgents(ctx, wc.Admin, c, ns, mizarctl.DefaultAgentSelector)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if got := strings.Join(a.Names(), " "); got != "node-a node-b" {
		t.Fatalf("agents found: %q, want node-a node-b (the agent pods of %s, by node)", got, ns)
	}
	_, err = mizarctl.Drops(ctx, a, time.Time{}, 0)
	t.Logf("drops: %v", err)
	if err == nil || !strings.Contains(err.Error(), "agent of node-a: pod "+ns+"/agent-a on node node-a: port-forward") {
		t.Errorf("drops of an agent the API cannot forward to: %v, want the pod and the port-forward named", err)
	}
	if err == nil || !strings.Contains(err.Error(), "agent of node-b: pod "+ns+"/agent-b on node node-b: it is Pending, not Running") {
		t.Errorf("drops of a Pending agent: %v, want it named", err)
	}
	if _, err := mizarctl.ForwardAgents(ctx, wc.Admin, c, "elsewhere", "app=none"); err == nil || !strings.Contains(err.Error(), "no agent pods (app=none) in namespace elsewhere") {
		t.Errorf("no agent pods: %v, want an error naming the selector", err)
	}
}

// debugAuthAgent grants in namespace ns what the chart grants (the agent's
// ServiceAccount may review tokens; the ServiceAccount mizarctl may use
// /mizar-agent/*; extraSA gets nothing), and serves the agent's /drops
// behind its --debug-auth, answering droplet and total. served lists the
// users it served, in order.
func debugAuthAgent(t *testing.T, ctx context.Context, kc kubernetes.Interface, admin *rest.Config, ns, extraSA, droplet string, total uint64) (*httptest.Server, func() []string) {
	t.Helper()
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, sa := range []string{"agent", mizarctl.DefaultAgentServiceAccount, extraSA} {
		if _, err := kc.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kc.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "agent-debug"},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{nodeagent.DebugPathPrefix + "/*"}, Verbs: []string{"get", "post"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for role, sa := range map[string]string{"system:auth-delegator": "agent", "agent-debug": mizarctl.DefaultAgentServiceAccount} {
		if _, err := kc.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "test:" + sa},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	agentToken, err := mizarctl.AgentToken(admin, ns, "agent")(ctx)
	if err != nil {
		t.Fatal(err)
	}
	agentKube, err := kubernetes.NewForConfig(&rest.Config{Host: admin.Host, BearerToken: agentToken, TLSClientConfig: admin.TLSClientConfig})
	if err != nil {
		t.Fatal(err)
	}
	auth, err := nodeagent.NewDebugAuth(agentKube, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var users []string
	srv := httptest.NewServer(auth.Wrap(agentapi.PathDrops, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		users = append(users, nodeagent.DebugUser(r.Context()).GetName())
		mu.Unlock()
		_ = json.NewEncoder(w).Encode(agentapi.DropsResponse{Droplet: droplet, Total: total})
	})))
	return srv, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(users)
	}
}
