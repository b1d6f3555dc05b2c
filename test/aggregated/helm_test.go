package aggregated

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

func chartDir() string { return filepath.Join(repoRoot, "artifacts/charts/mizar") }

func helm(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, helmBin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cl.AdminKubeconfig,
		"HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return result{strings.TrimSpace(out.String()), strings.TrimSpace(errb.String()), err}
}

// valueSets are the chart configurations the tests render; each is a values file.
var valueSets = map[string]string{
	// Defaults: generated TLS, bundled etcd, agent on.
	"default": ``,
	// Given Secrets, external etcd, broker on, agent off.
	"secrets-external-broker": `
tls: {mode: secrets, existingServingSecret: my-serving, caBundle: Y2EK}
etcd: {mode: external, servers: ["https://etcd-0.example:2379", "https://etcd-1.example:2379"], clientSecret: my-etcd-client, prefix: /mizar}
broker: {enabled: true}
agent: {enabled: false}
apiserver: {replicas: 3, extraArgs: ["--v=2"]}
`,
	// cert-manager issues everything, bundled etcd, agent with custom CNI dirs.
	"cert-manager": `
tls: {mode: cert-manager, certManager: {issuerRef: {name: mizar-ca, kind: ClusterIssuer}}}
agent: {cniBinDir: /usr/libexec/cni, cniConfDir: /etc/cni/conf.d, mtu: 8950}
`,
}

func valuesFile(t *testing.T, name string) string {
	f := filepath.Join(t.TempDir(), name+".yaml")
	if err := os.WriteFile(f, []byte(valueSets[name]), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

var (
	kindRe = regexp.MustCompile(`(?m)^kind: (\S+)$`)
	metaRe = regexp.MustCompile(`(?m)^metadata:\n((?:  .*\n)+)`)
	nameRe = regexp.MustCompile(`(?m)^  name: (\S+)$`)
	nsRe   = regexp.MustCompile(`(?m)^  namespace: (\S+)$`)
)

// objects lists "Kind/name" of every document in a rendered manifest, and the
// namespace of each (empty for cluster-scoped objects).
func objects(manifest string) ([]string, map[string]string) {
	var out []string
	ns := map[string]string{}
	for _, doc := range strings.Split(manifest, "\n---") {
		kind, meta := kindRe.FindStringSubmatch(doc), metaRe.FindStringSubmatch(doc+"\n")
		if kind == nil || meta == nil {
			continue
		}
		name := nameRe.FindStringSubmatch(meta[1])
		if name == nil {
			continue
		}
		o := kind[1] + "/" + name[1]
		out = append(out, o)
		if m := nsRe.FindStringSubmatch(meta[1]); m != nil {
			ns[o] = m[1]
		}
	}
	sort.Strings(out)
	return out, ns
}

func TestHelmChart(t *testing.T) {
	t.Run("Lint", func(t *testing.T) {
		for name := range valueSets {
			if r := helm(t, "lint", "--strict", chartDir(), "-f", valuesFile(t, name)); r.err != nil {
				t.Errorf("helm lint with %s values: %s", name, r)
			}
		}
	})

	t.Run("SchemaRefusesBadValues", func(t *testing.T) {
		for _, bad := range []struct{ set, want string }{
			{"tls.mode=self", "/tls/mode"},
			{"etcd.mode=external", "/etcd/servers"},
			{"agent.mtu=100", "/agent/mtu"},
			{"apiserver.replicas=0", "/apiserver/replicas"},
			{"tls.mode=secrets", "/tls"},
			{"image.tag=", "/image/tag"},
			{"etcd.servers[0]=http://insecure:2379,etcd.mode=external,etcd.clientSecret=x", "/etcd/servers/0"},
			{"typo=1", "'typo' not allowed"},
			// kube-apiserver's port on a control-plane node, where mizar-apiserver runs on the host network.
			{"apiserver.port=6443", "/apiserver/port"},
			{"etcd.bundled.persistence=nfs", "/etcd/bundled/persistence"},
			{"defaultSubnets=null", "defaultSubnets"},
		} {
			r := helm(t, "template", "x", chartDir(), "--set", bad.set)
			if r.err == nil || !strings.Contains(r.stderr, "values don't meet the specifications of the schema") || !strings.Contains(r.stderr, bad.want) {
				t.Errorf("helm template --set %s: want a schema error naming %s, got %s", bad.set, bad.want, r)
			}
		}
	})

	t.Run("Render", func(t *testing.T) {
		want := map[string]struct{ has, hasNot []string }{
			"default": {
				has: []string{"APIService/v1alpha1.networking.mizar.dev", "Deployment/mz-apiserver", "StatefulSet/mz-etcd", "DaemonSet/mz-agent", "Secret/mz-serving", "Secret/mz-etcd-client", "ClusterRole/mz-view", "ClusterRole/mz-edit", "ClusterRole/mz-agent", "Role/mz-agent",
					// agent.debugAuth: the agents review callers, and mizarctl's ServiceAccount may call.
					"ClusterRoleBinding/mz-agent:system:auth-delegator", "ClusterRole/mz-agent-debug", "ClusterRoleBinding/mz-agent-debug", "ServiceAccount/mizarctl"},
				// One replica beside the bundled etcd: no budget that would block every drain.
				hasNot: []string{"APIService/v1alpha1.broker.mizar.dev", "Certificate/mz-serving", "PodDisruptionBudget/mz-apiserver"},
			},
			"secrets-external-broker": {
				has:    []string{"APIService/v1alpha1.networking.mizar.dev", "APIService/v1alpha1.broker.mizar.dev", "Deployment/mz-apiserver", "PodDisruptionBudget/mz-apiserver"},
				hasNot: []string{"StatefulSet/mz-etcd", "DaemonSet/mz-agent", "Secret/mz-serving", "Secret/mz-etcd-client"},
			},
			"cert-manager": {
				has:    []string{"Certificate/mz-serving", "Certificate/mz-etcd-server", "Certificate/mz-etcd-client", "StatefulSet/mz-etcd", "DaemonSet/mz-agent"},
				hasNot: []string{"Secret/mz-serving"},
			},
		}
		for name, w := range want {
			r := helm(t, "template", "mz", chartDir(), "-n", "mizar-system", "-f", valuesFile(t, name))
			if r.err != nil {
				t.Errorf("helm template with %s values: %s", name, r)
				continue
			}
			objs, _ := objects(r.stdout)
			for _, o := range w.has {
				if !contains(objs, o) {
					t.Errorf("%s values: %s missing from %v", name, o, objs)
				}
			}
			for _, o := range w.hasNot {
				if contains(objs, o) {
					t.Errorf("%s values: unexpected %s", name, o)
				}
			}
			switch name {
			case "default":
				// The caBundle is the generated CA, and the serving cert names the Service.
				if !strings.Contains(r.stdout, "caBundle: ") || strings.Contains(r.stdout, "insecureSkipTLSVerify") {
					t.Errorf("default values: the APIService lacks a caBundle")
				}
				if !strings.Contains(r.stdout, "- --debug-auth\n") || !strings.Contains(r.stdout, `nonResourceURLs: ["/mizar-agent/*"]`) {
					t.Errorf("default values: the agents do not run with --debug-auth, or no role grants /mizar-agent/*")
				}
			case "secrets-external-broker":
				for _, s := range []string{"--etcd-servers=https://etcd-0.example:2379,https://etcd-1.example:2379", "secretName: my-serving", "secretName: my-etcd-client", "--etcd-prefix=/mizar", "caBundle: Y2EK", "replicas: 3"} {
					if !strings.Contains(r.stdout, s) {
						t.Errorf("secrets values: rendered chart lacks %q", s)
					}
				}
			case "cert-manager":
				for _, s := range []string{"cert-manager.io/inject-ca-from: mizar-system/mz-serving", "path: /usr/libexec/cni", `"mtu": 8950`} {
					if !strings.Contains(r.stdout, s) {
						t.Errorf("cert-manager values: rendered chart lacks %q", s)
					}
				}
			}
		}
	})

	t.Run("InstallUninstall", testHelmInstall)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// testHelmInstall installs the default chart into the local control plane, so
// kube-apiserver validates every object, upgrades it (same values, then a
// changed value, then a certificate rotation) and uninstalls it. A
// mizar-apiserver serving the certificate the release generated stands in
// for the release's pods (no kubelet runs here): the APIService must stay
// Available and every request through the aggregator succeed across the
// upgrades, and the generated certificates must not change unless rotated.
// The chart's APIService has the same name as the one the test cluster
// routes through, so that one is removed for the duration and restored afterwards.
func testHelmInstall(t *testing.T) {
	k := newKC(t, kubectls[0].path, cl.AdminKubeconfig)
	s := suffix()
	release, ns := "mz"+s, "mizar-helm-"+s
	k.ok("delete", "apiservice", "v1alpha1.networking.mizar.dev")
	t.Cleanup(func() {
		helm(t, "uninstall", release, "-n", ns)
		k.run("", "delete", "namespace", ns, "--wait=false")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := cl.ApplyAggregation(ctx); err != nil {
			t.Errorf("restoring the test cluster's APIService: %v", err)
		}
	})
	r := helm(t, "install", release, chartDir(), "-n", ns, "--create-namespace")
	if r.err != nil {
		t.Fatalf("helm install: %s", r)
	}
	if !strings.Contains(r.stdout, "helm uninstall") || !strings.Contains(r.stdout, "kubectl delete namespace") {
		t.Errorf("helm install's NOTES do not say what uninstall leaves and how to remove it:\n%s", r.stdout)
	}
	manifest := helm(t, "get", "manifest", release, "-n", ns)
	if manifest.err != nil {
		t.Fatalf("helm get manifest: %s", manifest)
	}
	objs, namespaces := objects(manifest.stdout)
	if len(objs) < 15 {
		t.Fatalf("helm installed only %d objects: %v", len(objs), objs)
	}
	for _, o := range objs {
		if r := k.run("", "get", o, "-n", namespaces[o], "-o", "name"); r.err != nil {
			t.Errorf("%s not found after helm install: %s", o, r)
		}
	}
	// The APIService points at the release's Service with the generated CA.
	if got := k.ok("get", "apiservice", "v1alpha1.networking.mizar.dev", "-o", "jsonpath={.spec.service.namespace}/{.spec.service.name}"); got != ns+"/"+release+"-apiserver" {
		t.Errorf("installed APIService points at %s", got)
	}

	// The release's certificate, served by a mizar-apiserver behind the release's Service.
	secret := func(name string) map[string]string {
		out := map[string]string{}
		for _, key := range []string{"ca.crt", "tls.crt", "tls.key"} {
			b64 := k.ok("get", "secret", name, "-n", ns, "-o", "jsonpath={.data."+strings.ReplaceAll(key, ".", "\\.")+"}")
			b, err := base64.StdEncoding.DecodeString(b64)
			if err != nil {
				t.Fatalf("secret %s %s: %v", name, key, err)
			}
			out[key] = string(b)
		}
		return out
	}
	caBundle := func() string {
		b, err := base64.StdEncoding.DecodeString(k.ok("get", "apiservice", "v1alpha1.networking.mizar.dev", "-o", "jsonpath={.spec.caBundle}"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	serving, etcdServer := secret(release+"-serving"), secret(release+"-etcd-server")
	if caBundle() != serving["ca.crt"] {
		t.Fatalf("the APIService's caBundle is not the serving Secret's CA")
	}
	dir := t.TempDir()
	for key, v := range serving {
		if err := os.WriteFile(filepath.Join(dir, key), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	port := 20000 + rand.IntN(20000)
	addr, err := cl.StartMizarWithCert(ctx, port, filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt"), release+"-apiserver."+ns+".svc")
	if err != nil {
		t.Fatal(err)
	}
	k.okIn(fmt.Sprintf(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %[1]s-apiserver-test
  namespace: %[2]s
  labels: {kubernetes.io/service-name: %[1]s-apiserver, endpointslice.kubernetes.io/managed-by: mizar-e2e}
addressType: IPv4
endpoints: [{addresses: ["%[3]s"], conditions: {ready: true}}]
ports: [{name: https, port: %[4]d, protocol: TCP}]
`, release, ns, addr, port), "apply", "-f", "-")
	if err := cl.WaitAPIService(ctx, true); err != nil {
		t.Fatalf("the release's APIService never became Available: %v", err)
	}

	// Requests through the aggregator, all along the upgrades.
	cfg, err := clientcmd.BuildConfigFromFlags("", cl.AdminKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var sent, failed atomic.Int64
	var firstFailure atomic.Value
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			sent.Add(1)
			resp, err := hc.Get(cfg.Host + "/apis/networking.mizar.dev/v1alpha1/vpcs?limit=1")
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
			}
			if err != nil {
				failed.Add(1)
				firstFailure.CompareAndSwap(nil, err.Error())
			}
		}
	}()
	for _, up := range [][]string{
		{"--reuse-values"},
		{"--reuse-values", "--set", "apiserver.extraArgs={--v=2}"},
		{"--reset-values", "--set", "agent.mtu=1400"},
	} {
		if r := helm(t, append([]string{"upgrade", release, chartDir(), "-n", ns}, up...)...); r.err != nil {
			t.Fatalf("helm upgrade %v: %s", up, r)
		}
		if got := secret(release + "-serving"); got["ca.crt"] != serving["ca.crt"] || got["tls.crt"] != serving["tls.crt"] || got["tls.key"] != serving["tls.key"] {
			t.Errorf("helm upgrade %v re-issued the serving certificate", up)
		}
		if got := secret(release + "-etcd-server"); got["ca.crt"] != etcdServer["ca.crt"] || got["tls.key"] != etcdServer["tls.key"] {
			t.Errorf("helm upgrade %v re-issued etcd's certificates", up)
		}
		if caBundle() != serving["ca.crt"] {
			t.Errorf("helm upgrade %v changed the APIService's caBundle", up)
		}
		if r := k.run("", "get", "apiservice", "v1alpha1.networking.mizar.dev", "-o", "jsonpath={.status.conditions[?(@.type=='Available')].status}"); r.stdout != "True" {
			t.Errorf("after helm upgrade %v the APIService is not Available: %s", up, r)
		}
	}
	// A deliberate rotation: a new CA and certificate, both CAs trusted, so the
	// backend still serving the old certificate is reached throughout.
	if r := helm(t, "upgrade", release, chartDir(), "-n", ns, "--reuse-values", "--set", "tls.rotate=true"); r.err != nil {
		t.Fatalf("helm upgrade tls.rotate=true: %s", r)
	}
	rotated := secret(release + "-serving")
	if rotated["ca.crt"] == serving["ca.crt"] || rotated["tls.crt"] == serving["tls.crt"] {
		t.Errorf("tls.rotate=true kept the old certificate")
	}
	if b := caBundle(); !strings.Contains(b, serving["ca.crt"]) || !strings.Contains(b, rotated["ca.crt"]) {
		t.Errorf("during the rotation the caBundle does not hold both CAs")
	}
	time.Sleep(2 * time.Second)
	close(stop)
	<-done
	t.Logf("%d requests through the aggregator during 3 upgrades and a rotation, %d failed", sent.Load(), failed.Load())
	if failed.Load() > 0 || sent.Load() < 10 {
		t.Errorf("%d of %d requests through the aggregator failed during the upgrades (first: %v)", failed.Load(), sent.Load(), firstFailure.Load())
	}
	if r := helm(t, "upgrade", release, chartDir(), "-n", ns, "--reuse-values", "--set", "tls.rotate=false"); r.err != nil {
		t.Fatalf("helm upgrade after the rotation: %s", r)
	}
	if got := secret(release + "-serving"); got["ca.crt"] != rotated["ca.crt"] || caBundle() != rotated["ca.crt"] {
		t.Errorf("after the rotation the new CA is not kept alone in the caBundle")
	}

	if r := helm(t, "uninstall", release, "-n", ns, "--wait"); r.err != nil {
		t.Fatalf("helm uninstall: %s", r)
	}
	for _, o := range objs {
		r := k.run("", "get", o, "-n", namespaces[o], "-o", "name")
		if r.err == nil || !strings.Contains(r.stderr, "NotFound") {
			t.Errorf("%s still there after helm uninstall: %s", o, fmt.Sprint(r))
		}
	}
}
