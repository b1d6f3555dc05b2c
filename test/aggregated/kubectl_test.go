package aggregated

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// kc runs one kubectl binary against one kubeconfig.
type kc struct {
	t          *testing.T
	bin        string
	kubeconfig string
	cache      string
}

type result struct {
	stdout, stderr string
	err            error
}

func (r result) String() string {
	return fmt.Sprintf("err=%v\nstdout: %s\nstderr: %s", r.err, r.stdout, r.stderr)
}

func (k kc) run(stdin string, args ...string) result {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, k.bin, append([]string{"--kubeconfig", k.kubeconfig, "--cache-dir", k.cache}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return result{strings.TrimSpace(out.String()), strings.TrimSpace(errb.String()), err}
}

// ok runs kubectl and fails the test unless it succeeds.
func (k kc) ok(args ...string) string {
	k.t.Helper()
	r := k.run("", args...)
	if r.err != nil {
		k.t.Fatalf("kubectl %s: %s", strings.Join(args, " "), r)
	}
	return r.stdout
}

func (k kc) okIn(stdin string, args ...string) string {
	k.t.Helper()
	r := k.run(stdin, args...)
	if r.err != nil {
		k.t.Fatalf("kubectl %s: %s", strings.Join(args, " "), r)
	}
	return r.stdout
}

// forbidden runs kubectl and fails the test unless the server answered 403.
func (k kc) forbidden(args ...string) {
	k.t.Helper()
	r := k.run("", args...)
	if r.err == nil || !strings.Contains(r.stderr, "(Forbidden)") {
		k.t.Fatalf("kubectl %s: want Forbidden, got %s", strings.Join(args, " "), r)
	}
}

func newKC(t *testing.T, bin, kubeconfig string) kc {
	return kc{t: t, bin: bin, kubeconfig: kubeconfig, cache: t.TempDir()}
}

// suffix makes names unique across kubectl versions and repeated runs (-count=2).
func suffix() string { return fmt.Sprintf("%x", rand.Uint32()) }

// uniqueDroplet returns a droplet manifest with a random underlay IP and MAC.
func uniqueDroplet(name string) string {
	a, b := rand.IntN(250)+1, rand.IntN(250)+1
	return fmt.Sprintf(`apiVersion: networking.mizar.dev/v1alpha1
kind: Droplet
metadata: {name: %s}
spec: {node: %s, ip: 172.20.%d.%d, mac: "02:aa:00:00:%02x:%02x", interface: eth0}
`, name, name, a, b, a, b)
}

// TestKubectl is the user-facing suite, once per kubectl version (kubectl's
// supported skew against the v1.35 kube-apiserver).
func TestKubectl(t *testing.T) {
	if kubectlSkipped != "" {
		t.Run("kubectl-1.33", func(t *testing.T) { t.Skip(kubectlSkipped) })
	}
	for _, v := range kubectls {
		t.Run("kubectl-"+v.version, func(t *testing.T) {
			k := newKC(t, v.path, cl.AdminKubeconfig)
			out := k.ok("version", "--client", "-o", "json")
			if !strings.Contains(out, `"gitVersion": "v`+v.version+".") {
				t.Fatalf("kubectl %s reports another version:\n%s", v.path, out)
			}
			t.Run("Discovery", func(t *testing.T) { testDiscovery(t, v.path) })
			t.Run("CRUDWatch", func(t *testing.T) { testCRUDWatch(t, v.path) })
			t.Run("ServerSideApply", func(t *testing.T) { testSSA(t, v.path) })
			t.Run("ExplainAndCategory", func(t *testing.T) { testExplain(t, v.path) })
			t.Run("StatusPatchAndWait", func(t *testing.T) { testWait(t, v.path) })
			t.Run("CoreEndpoints", func(t *testing.T) { testCoreEndpoints(t, v.path) })
			t.Run("RBAC", func(t *testing.T) { testRBAC(t, v.path) })
		})
	}
}

// testDiscovery: kubectl api-resources through the aggregator lists exactly the
// kinds mizar-apiserver serves (asked directly, bypassing kube-apiserver).
func testDiscovery(t *testing.T, bin string) {
	k := newKC(t, bin, cl.AdminKubeconfig)
	direct := newKC(t, bin, cl.DirectKubeconfig)
	var list struct {
		Resources []struct {
			Name string `json:"name"`
			Kind string `json:"kind"`
		} `json:"resources"`
	}
	if err := json.Unmarshal([]byte(direct.ok("get", "--raw", "/apis/networking.mizar.dev/v1alpha1")), &list); err != nil {
		t.Fatalf("decoding mizar-apiserver's discovery: %v", err)
	}
	var want []string
	for _, r := range list.Resources {
		if !strings.Contains(r.Name, "/") {
			want = append(want, r.Name+".networking.mizar.dev")
		}
	}
	sort.Strings(want)
	for _, kind := range []string{"vpcs", "subnets", "droplets", "endpoints", "dividers", "bouncers"} {
		if !slices.Contains(want, kind+".networking.mizar.dev") {
			t.Errorf("mizar-apiserver does not serve %s (serves %v)", kind, want)
		}
	}
	got := strings.Fields(k.ok("api-resources", "--api-group=networking.mizar.dev", "-o", "name"))
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Errorf("kubectl api-resources through kube-apiserver lists %v, mizar-apiserver serves %v", got, want)
	}
	// The aggregated discovery document (what kubectl >= 1.30 asks for) has the group too.
	agg := k.ok("get", "--raw", "/apis")
	if !strings.Contains(agg, `"networking.mizar.dev"`) {
		t.Errorf("/apis through kube-apiserver lacks networking.mizar.dev:\n%.500s", agg)
	}
}

func testCRUDWatch(t *testing.T, bin string) {
	k := newKC(t, bin, cl.AdminKubeconfig)
	s := suffix()
	first, second := "crud-a-"+s, "crud-b-"+s
	t.Cleanup(func() { k.run("", "delete", "droplet", first, second, "--ignore-not-found", "--wait=false") })

	k.okIn(uniqueDroplet(first), "create", "-f", "-")
	if got := k.ok("get", "droplet", first, "-o", "jsonpath={.spec.node}"); got != first {
		t.Fatalf("get droplet %s: spec.node = %q", first, got)
	}

	// A watch started now must see the second create.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	w := exec.CommandContext(ctx, bin, "--kubeconfig", cl.AdminKubeconfig, "--cache-dir", k.cache,
		"get", "droplets", "--watch-only", "-o", "name")
	stdout, err := w.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var werr strings.Builder
	w.Stderr = &werr
	if err := w.Start(); err != nil {
		t.Fatalf("starting kubectl get --watch: %v", err)
	}
	defer func() { cancel(); _ = w.Wait() }()
	seen := make(chan string, 16)
	var once sync.Once
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			seen <- sc.Text()
		}
		once.Do(func() { close(seen) })
	}()
	// kubectl prints nothing until its watch is open; give it a moment, then
	// keep creating until the event shows up (no fixed sleep to get wrong).
	time.Sleep(time.Second)
	k.okIn(uniqueDroplet(second), "create", "-f", "-")
	for found := false; !found; {
		select {
		case line, ok := <-seen:
			if !ok {
				t.Fatalf("kubectl get --watch ended before the create showed up: %s", werr.String())
			}
			found = line == "droplet.networking.mizar.dev/"+second
		case <-ctx.Done():
			t.Fatalf("kubectl get --watch did not report %s within 60 s: %s", second, werr.String())
		}
	}

	names := strings.Fields(k.ok("get", "droplets", "-o", "name"))
	for _, n := range []string{first, second} {
		if !slices.Contains(names, "droplet.networking.mizar.dev/"+n) {
			t.Errorf("kubectl get droplets lacks %s: %v", n, names)
		}
	}
	k.ok("delete", "droplet", first)
	if r := k.run("", "get", "droplet", first); r.err == nil || !strings.Contains(r.stderr, "NotFound") {
		t.Errorf("get after delete: want NotFound, got %s", r)
	}
}

func testSSA(t *testing.T, bin string) {
	k := newKC(t, bin, cl.AdminKubeconfig)
	name := "ssa-" + suffix()
	t.Cleanup(func() { k.run("", "delete", "droplet", name, "--ignore-not-found", "--wait=false") })
	m := uniqueDroplet(name)
	out := k.okIn(m, "apply", "--server-side", "--field-manager=e2e", "-f", "-")
	if !strings.Contains(out, "serverside-applied") {
		t.Errorf("first server-side apply said %q", out)
	}
	// The second apply adds a label: only that changes, and the manager keeps ownership.
	m2 := strings.Replace(m, "metadata: {name: "+name+"}", "metadata: {name: "+name+", labels: {tier: e2e}}", 1)
	k.okIn(m2, "apply", "--server-side", "--field-manager=e2e", "-f", "-")
	if got := k.ok("get", "droplet", name, "-o", "jsonpath={.metadata.labels.tier}"); got != "e2e" {
		t.Errorf("label after the second apply = %q, want e2e", got)
	}
	mf := k.ok("get", "droplet", name, "--show-managed-fields", "-o", "jsonpath={range .metadata.managedFields[*]}{.manager}/{.operation} {end}")
	if strings.TrimSpace(mf) != "e2e/Apply" {
		t.Errorf("managedFields after two applies = %q, want one e2e/Apply entry", mf)
	}
	// Another manager changing an owned field conflicts.
	m3 := strings.Replace(m, "interface: eth0", "interface: eth9", 1)
	if r := k.run(m3, "apply", "--server-side", "--field-manager=other", "-f", "-"); r.err == nil || !strings.Contains(r.stderr, "conflict") {
		t.Errorf("apply by another manager of an owned field: want a conflict, got %s", r)
	}
}

func testExplain(t *testing.T, bin string) {
	k := newKC(t, bin, cl.AdminKubeconfig)
	out := k.ok("explain", "droplets.spec")
	for _, want := range []string{"GROUP:      networking.mizar.dev", "KIND:       Droplet", "ip", "mac"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl explain droplets.spec lacks %q:\n%s", want, out)
		}
	}
	name := "cat-" + suffix()
	t.Cleanup(func() { k.run("", "delete", "droplet", name, "--ignore-not-found", "--wait=false") })
	k.okIn(uniqueDroplet(name), "create", "-f", "-")
	// The "mizar" category spans every kind; the table has the kind's own columns.
	out = k.ok("get", "mizar", "-A")
	if !strings.Contains(out, "droplet.networking.mizar.dev/"+name) {
		t.Errorf("kubectl get mizar -A lacks the droplet:\n%s", out)
	}
	if out := k.ok("get", "mdrop", name); !strings.Contains(out, "NAME") || !strings.Contains(out, name) {
		t.Errorf("kubectl get mdrop (short name) printed:\n%s", out)
	}
}

func testWait(t *testing.T, bin string) {
	k := newKC(t, bin, cl.AdminKubeconfig)
	name := "wait-" + suffix()
	t.Cleanup(func() { k.run("", "delete", "droplet", name, "--ignore-not-found", "--wait=false") })
	k.okIn(uniqueDroplet(name), "create", "-f", "-")
	done := make(chan result, 1)
	go func() {
		done <- k.run("", "wait", "droplet/"+name, "--for=jsonpath={.status.phase}=Provisioned", "--timeout=60s")
	}()
	time.Sleep(500 * time.Millisecond)
	k.ok("patch", "droplet", name, "--subresource=status", "--type=merge", "-p", `{"status":{"phase":"Provisioned"}}`)
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("kubectl wait after the status patch: %s", r)
		}
	case <-time.After(70 * time.Second):
		t.Fatal("kubectl wait did not return")
	}
	// A spec patch through /status changes nothing in spec.
	k.ok("patch", "droplet", name, "--subresource=status", "--type=merge", "-p", `{"spec":{"interface":"eth7"}}`)
	if got := k.ok("get", "droplet", name, "-o", "jsonpath={.spec.interface}"); got != "eth0" {
		t.Errorf("spec.interface after a /status patch = %q, want eth0", got)
	}
}

// testCoreEndpoints: mizar's "endpoints" resource does not shadow the core one.
func testCoreEndpoints(t *testing.T, bin string) {
	k := newKC(t, bin, cl.AdminKubeconfig)
	out := k.ok("explain", "endpoints")
	if !strings.Contains(out, "KIND:       Endpoints") || !strings.Contains(out, "VERSION:    v1\n") || strings.Contains(out, "mizar") {
		t.Errorf("kubectl explain endpoints is not the core kind:\n%.400s", out)
	}
	// kubectl -v=6 logs the URL it asked: the core group, not mizar's.
	r := k.run("", "get", "endpoints", "-A", "-v=6")
	if r.err != nil || !strings.Contains(r.stderr, "/api/v1/endpoints") || strings.Contains(r.stderr, "/apis/networking.mizar.dev/v1alpha1/endpoints") {
		t.Errorf("kubectl get endpoints did not ask the core API: %s", r)
	}
	if r := k.run("", "get", "endpoints.networking.mizar.dev", "-A"); r.err != nil {
		t.Errorf("kubectl get endpoints.networking.mizar.dev: %s", r)
	}
}

// testRBAC: kube-apiserver's RBAC decides for mizar (delegated authorization),
// with the ClusterRoles shipped in artifacts/deploy/rbac.yaml.
func testRBAC(t *testing.T, bin string) {
	k := newKC(t, bin, cl.AdminKubeconfig)
	s := suffix()
	nobody, viewer, editor, netAdmin := "nobody-"+s, "viewer-"+s, "editor-"+s, "netadmin-"+s
	for user, role := range map[string]string{viewer: "mizar-view", editor: "mizar-edit", netAdmin: "mizar-network-admin"} {
		k.ok("create", "clusterrolebinding", user, "--clusterrole="+role, "--user="+user)
		t.Cleanup(func() { k.run("", "delete", "clusterrolebinding", user) })
	}
	name := "rbac-" + suffix()
	t.Cleanup(func() { k.run("", "delete", "droplet", name, "--ignore-not-found", "--wait=false") })

	k.forbidden("get", "droplets", "--as="+nobody)
	k.forbidden("get", "vpcs", "--as="+nobody)
	k.ok("get", "droplets", "--as="+viewer)
	k.ok("get", "endpoints.networking.mizar.dev", "-A", "--as="+viewer)
	r := k.run(uniqueDroplet(name), "create", "-f", "-", "--as="+viewer)
	if r.err == nil || !strings.Contains(r.stderr, "(Forbidden)") {
		t.Fatalf("mizar-view created a droplet: %s", r)
	}
	// Placement kinds belong to the node agents and operators, not to editors or
	// network administrators (TestEditorsHaveNoNetworkPowers covers the rest).
	for _, user := range []string{editor, netAdmin} {
		r := k.run(uniqueDroplet(name), "create", "-f", "-", "--as="+user)
		if r.err == nil || !strings.Contains(r.stderr, "(Forbidden)") {
			t.Fatalf("%s created a droplet: %s", user, r)
		}
	}
	vpc := "rbac-" + suffix()
	t.Cleanup(func() { k.run("", "delete", "vpc", vpc, "--ignore-not-found", "--wait=false") })
	k.okIn(fmt.Sprintf("apiVersion: networking.mizar.dev/v1alpha1\nkind: Vpc\nmetadata: {name: %s}\nspec: {cidr: 10.%d.0.0/16}\n", vpc, rand.IntN(200)+20),
		"create", "-f", "-", "--as="+netAdmin)
	k.forbidden("patch", "vpc", vpc, "--subresource=status", "--type=merge", "-p", `{"status":{"phase":"Provisioned"}}`, "--as="+netAdmin)
	k.ok("delete", "vpc", vpc, "--as="+netAdmin, "--wait=false")
}
