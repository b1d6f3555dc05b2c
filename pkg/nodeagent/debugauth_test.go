package nodeagent

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"mizar.dev/pkg/agentapi"
	"mizar.dev/test/logtest"
	"mizar.dev/test/workloadcluster"
)

// DebugRBAC sets up in a real kube-apiserver what the chart does: the agent's
// ServiceAccount may review tokens and access (system:auth-delegator), the
// ServiceAccount mizarctl may use the debug endpoints (nonResourceURLs
// /mizar-agent/*), and "nobody" is a valid ServiceAccount with no grant. It
// returns each one's token and the agent's client.
func debugRBAC(t testing.TB, ctx context.Context, admin *rest.Config) (tokens map[string]string, agent kubernetes.Interface) {
	t.Helper()
	kc, err := kubernetes.NewForConfig(admin)
	if err != nil {
		t.Fatal(err)
	}
	const ns = "mizar-system"
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "mizar-agent-debug"},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{DebugPathPrefix + "/*"}, Verbs: []string{"get", "post"}}}}
	if _, err := kc.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bind := func(name, sa, clusterRole string) {
		b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}}}
		if _, err := kc.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	bind("mizar-agent:system:auth-delegator", "mizar-agent", "system:auth-delegator")
	bind("mizar-agent-debug", "mizarctl", "mizar-agent-debug")
	tokens = map[string]string{}
	for _, sa := range []string{"mizar-agent", "mizarctl", "nobody"} {
		if _, err := kc.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := kc.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tokens[sa] = tr.Status.Token
	}
	// QPS and burst: the agent's --kube-api-qps and --kube-api-burst.
	agentCfg := &rest.Config{Host: admin.Host, BearerToken: tokens["mizar-agent"], TLSClientConfig: admin.TLSClientConfig, QPS: 200, Burst: 400}
	if agent, err = kubernetes.NewForConfig(agentCfg); err != nil {
		t.Fatal(err)
	}
	return tokens, agent
}

// The agent's debug endpoints, guarded by --debug-auth against a real
// kube-apiserver (TokenReview, SubjectAccessReview with the agent's own
// ServiceAccount, bound as the chart binds it): the token of a ServiceAccount
// RBAC allows gets 200 (GET and POST), a valid token without the grant 403,
// no token or a garbage one 401, each answer with a body that says why,
// counted in mizar_nodeagent_debug_requests_total and, when refused, logged
// with the user; /metrics and /healthz answer without a token.
func TestDebugAuthAgainstKubeAPIServer(t *testing.T) {
	logs := logtest.Capture(t, 0)
	wc := workloadcluster.StartAPIServer(t)
	ctx := context.Background()
	tokens, agentClient := debugRBAC(t, ctx, wc.Admin)

	reg := newRegistry()
	auth, err := NewDebugAuth(agentClient, reg)
	if err != nil {
		t.Fatal(err)
	}
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			http.Error(w, "the caller's credential reached the handler", http.StatusTeapot)
			return
		}
		fmt.Fprintf(w, "served %s %s to %s\n", r.Method, r.URL.Path, DebugUser(r.Context()).GetName())
	})
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	for _, p := range []string{agentapi.PathDrops, agentapi.PathTraceUnderlay, agentapi.PathState} {
		mux.Handle(p, auth.Wrap(p, echo))
	}
	srv := httptest.NewServer(mux)
	defer srv.Close()

	do := func(method, path, token string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, strings.NewReader("frame"))
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	const mizarctl, nobody = "system:serviceaccount:mizar-system:mizarctl", "system:serviceaccount:mizar-system:nobody"
	cases := []struct {
		name, method, path, token string
		code                      int
		body                      string
	}{
		{"allowed GET", "GET", agentapi.PathDrops, tokens["mizarctl"], 200, "served GET /drops to " + mizarctl},
		{"allowed GET, cached", "GET", agentapi.PathDrops, tokens["mizarctl"], 200, "served GET /drops to " + mizarctl},
		{"allowed POST", "POST", agentapi.PathTraceUnderlay, tokens["mizarctl"], 200, "served POST /trace/underlay to " + mizarctl},
		{"system:masters", "GET", agentapi.PathState, workloadcluster.AdminToken, 200, "served GET /state to admin"},
		{"no grant", "GET", agentapi.PathDrops, tokens["nobody"], 403, `Forbidden: user "` + nobody + `" may not get /mizar-agent/drops`},
		{"no grant, POST", "POST", agentapi.PathTraceUnderlay, tokens["nobody"], 403, "may not post /mizar-agent/trace/underlay"},
		{"no token", "GET", agentapi.PathState, "", 401, "Unauthorized: the agent's debug endpoints need a Kubernetes bearer token"},
		{"garbage token", "GET", agentapi.PathDrops, "not-a-token", 401, "Unauthorized"},
		{"the agent's own token", "GET", agentapi.PathDrops, tokens["mizar-agent"], 403, "system:serviceaccount:mizar-system:mizar-agent"},
		{"healthz is open", "GET", "/healthz", "", 200, "ok"},
		{"metrics are open", "GET", "/metrics", "", 200, "mizar_nodeagent_debug_requests_total"},
	}
	for _, c := range cases {
		code, body := do(c.method, c.path, c.token)
		if code != c.code || !strings.Contains(body, c.body) {
			t.Errorf("%s: %s %s: %d %q, want %d with %q", c.name, c.method, c.path, code, strings.TrimSpace(body), c.code, c.body)
		}
	}

	_, metrics := do("GET", "/metrics", "")
	want := map[[2]string]float64{
		{agentapi.PathDrops, DebugAllowed}:           2,
		{agentapi.PathTraceUnderlay, DebugAllowed}:   1,
		{agentapi.PathState, DebugAllowed}:           1,
		{agentapi.PathDrops, DebugForbidden}:         2,
		{agentapi.PathTraceUnderlay, DebugForbidden}: 1,
		{agentapi.PathState, DebugUnauthenticated}:   1,
		{agentapi.PathDrops, DebugUnauthenticated}:   1,
		{agentapi.PathDrops, DebugAuthError}:         0,
	}
	for k, v := range want {
		re := regexp.MustCompile(`(?m)^mizar_nodeagent_debug_requests_total\{path="` + regexp.QuoteMeta(k[0]) + `",result="` + k[1] + `"\} (\S+)$`)
		m := re.FindStringSubmatch(metrics)
		if m == nil {
			t.Errorf("no series for path %s result %s in /metrics", k[0], k[1])
			continue
		}
		if got, _ := strconv.ParseFloat(m[1], 64); got != v {
			t.Errorf("mizar_nodeagent_debug_requests_total{path=%q,result=%q} = %v, want %v", k[0], k[1], got, v)
		}
	}
	if l := logs.Lines("Debug request refused", `"result"="forbidden"`, nobody, "/drops"); len(l) == 0 {
		t.Errorf("no log line names the forbidden user %s", nobody)
	}
	if l := logs.Lines("Debug request refused", `"result"="unauthenticated"`, "/state"); len(l) == 0 {
		t.Error("no log line for the request without a token")
	}
}

// What --debug-auth costs a debug request once its token's review and its
// decision are cached (every request but the first of a token within
// DebugAuthCacheTTL), against the same handler open, in one run; and the
// first request of a token, which asks kube-apiserver twice.
func BenchmarkDebugAuth(b *testing.B) {
	wc := workloadcluster.StartAPIServer(b)
	ctx := context.Background()
	tokens, agentClient := debugRBAC(b, ctx, wc.Admin)
	auth, err := NewDebugAuth(agentClient, nil)
	if err != nil {
		b.Fatal(err)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux := http.NewServeMux()
	mux.Handle("/open", ok)
	mux.Handle(agentapi.PathDrops, auth.Wrap(agentapi.PathDrops, ok))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	get := func(b *testing.B, path, token string) {
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("GET %s: %s", path, resp.Status)
		}
	}
	b.Run("open", func(b *testing.B) {
		for b.Loop() {
			get(b, "/open", "")
		}
	})
	b.Run("auth-cached", func(b *testing.B) {
		get(b, agentapi.PathDrops, tokens["mizarctl"])
		for b.Loop() {
			get(b, agentapi.PathDrops, tokens["mizarctl"])
		}
	})
	kc, err := kubernetes.NewForConfig(wc.Admin)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("auth-first", func(b *testing.B) {
		// A new token each time: a review and a decision from the API.
		for b.Loop() {
			b.StopTimer()
			tr, err := kc.CoreV1().ServiceAccounts("mizar-system").CreateToken(ctx, "mizarctl", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			get(b, agentapi.PathDrops, tr.Status.Token)
		}
	})
}
