// Package chart renders mizar's Helm chart with every value set the tests
// know and runs each container's command and arguments against the real
// binaries: mizar-apiserver and mizar-nodeagent built from this tree, in
// their --check-flags mode (parse and validate, touch nothing), and the
// bundled etcd's flags against `etcd --help`. A renamed flag, a missing
// subcommand or a value the binary refuses fails here, not on a node.
//
//	go test ./test/chart -count=1 -v
package chart

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/yaml"

	"mizar.dev/pkg/nodeagent"
	"mizar.dev/test/cluster"
)

var bins map[string]string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if bins, err = cluster.Binaries("helm", "etcd"); err != nil {
		fmt.Fprintln(os.Stderr, "chart:", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "mizar-chart-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "chart:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	for name, pkg := range map[string]string{"mizar-apiserver": "mizar.dev/cmd/apiserver", "mizar-nodeagent": "mizar.dev/cmd/nodeagent"} {
		out := filepath.Join(dir, name)
		if b, err := exec.Command("go", "build", "-o", out, pkg).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "chart: building %s: %v\n%s", name, err, b)
			return 1
		}
		bins[name] = out
	}
	return m.Run()
}

// ValueSets are the chart configurations rendered here.
var ValueSets = map[string]string{
	"default": ``,
	"pod-network-external-etcd": `
apiserver: {hostNetwork: false, replicas: 3, port: 9443, extraArgs: ["--v=2"]}
etcd: {mode: external, servers: ["https://etcd-0.example:2379"], clientSecret: my-etcd-client, prefix: /mizar}
tls: {mode: secrets, existingServingSecret: my-serving, caBundle: Y2EK}
broker: {enabled: true}
agent: {mtu: 1400, underlay: eth1, xdpGeneric: true, cniBinDir: /usr/libexec/cni, cniConfDir: /etc/cni/conf.d, extraArgs: ["--v=4"]}
defaultVpc: {name: tenants, cidr: 10.100.0.0/16}
defaultSubnets: [{name: tenants-a, cidr: 10.100.0.0/24}, {name: tenants-b, cidr: 10.100.1.0/24}]
`,
	"pvc-cert-manager": `
tls: {mode: cert-manager, certManager: {issuerRef: {name: mizar-ca, kind: ClusterIssuer}}}
etcd: {bundled: {persistence: pvc, storage: 5Gi, storageClassName: fast}}
`,
	"network-policy": `
agent: {networkPolicy: true}
`,
	"broker-osb": `
broker: {enabled: true, fulfillment: true, osb: {enabled: true, port: 9444, namespace: brokers}}
`,
	"encrypted": `
agent: {encryption: {wireguard: true, prefix: 100.64.0.0/16}}
`,
	"emptydir-no-agent": `
etcd: {bundled: {persistence: emptyDir, clientPort: 32379, peerPort: 32380, metricsPort: 32381}}
agent: {enabled: false}
`,
}

func helmTemplate(t *testing.T, values string, extra ...string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"template", "mz", filepath.Join(cluster.RepoRoot(), "artifacts/charts/mizar"), "-n", "mizar-system", "-f", f}, extra...)
	cmd := exec.Command(bins["helm"], args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, errb.String())
	}
	return out.String()
}

// podSpecs decodes the rendered workloads' pod templates, by "Kind/name".
func podSpecs(t *testing.T, manifest string) (map[string]corev1.PodSpec, map[string]string) {
	t.Helper()
	specs := map[string]corev1.PodSpec{}
	configMaps := map[string]string{}
	for _, doc := range strings.Split(manifest, "\n---") {
		var meta struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil || meta.Kind == "" {
			continue
		}
		key := meta.Kind + "/" + meta.Metadata.Name
		switch meta.Kind {
		case "Deployment":
			var o appsv1.Deployment
			mustDecode(t, doc, &o)
			specs[key] = o.Spec.Template.Spec
		case "DaemonSet":
			var o appsv1.DaemonSet
			mustDecode(t, doc, &o)
			specs[key] = o.Spec.Template.Spec
		case "StatefulSet":
			var o appsv1.StatefulSet
			mustDecode(t, doc, &o)
			specs[key] = o.Spec.Template.Spec
		case "ConfigMap":
			var o corev1.ConfigMap
			mustDecode(t, doc, &o)
			for k, v := range o.Data {
				configMaps[key+"/"+k] = v
			}
		}
	}
	return specs, configMaps
}

func mustDecode(t *testing.T, doc string, into any) {
	t.Helper()
	if err := yaml.Unmarshal([]byte(doc), into); err != nil {
		t.Fatalf("decoding %s: %v", doc, err)
	}
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// argv is what kubelet runs: command + args with $(VAR) expanded from the
// container's env (fieldRefs get a sample value).
func argv(c corev1.Container) []string {
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.Value != "":
			env[e.Name] = e.Value
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			env[e.Name] = map[string]string{"spec.nodeName": "node-a", "metadata.namespace": "mizar-system"}[e.ValueFrom.FieldRef.FieldPath]
		}
	}
	var out []string
	for _, a := range append(append([]string{}, c.Command...), c.Args...) {
		out = append(out, varRef.ReplaceAllStringFunc(a, func(m string) string {
			if v, ok := env[varRef.FindStringSubmatch(m)[1]]; ok {
				return v
			}
			return m
		}))
	}
	return out
}

// check runs one container's command line; it returns what went wrong.
func check(t *testing.T, c corev1.Container) error {
	cmdline := argv(c)
	if len(cmdline) == 0 {
		return fmt.Errorf("container %s has no command: the images have no default entrypoint worth trusting", c.Name)
	}
	name := filepath.Base(cmdline[0])
	switch name {
	case "mizar-apiserver", "mizar-nodeagent":
		cmd := exec.Command(bins[name], append(cmdline[1:], "--check-flags")...)
		// The in-cluster environment the DaemonSet gives the agent.
		cmd.Env = append(os.Environ(), "NODE_NAME=node-a", "POD_NAMESPACE=mizar-system")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v\n%s", strings.Join(cmdline, " "), err, out)
		}
		return nil
	case "etcd":
		help, _ := exec.Command(bins["etcd"], "--help").CombinedOutput()
		for _, a := range cmdline[1:] {
			flag, _, _ := strings.Cut(a, "=")
			if !strings.HasPrefix(flag, "--") || !bytes.Contains(help, []byte("\n  "+flag+" ")) && !bytes.Contains(help, []byte("\n  "+flag+"\n")) {
				return fmt.Errorf("etcd does not know %s", flag)
			}
		}
		return nil
	}
	return fmt.Errorf("container %s runs %s, which this test cannot check", c.Name, cmdline[0])
}

func TestChartCommandsRunAgainstTheBinaries(t *testing.T) {
	for name, values := range ValueSets {
		t.Run(name, func(t *testing.T) {
			specs, configMaps := podSpecs(t, helmTemplate(t, values))
			if len(specs) == 0 {
				t.Fatal("no workloads rendered")
			}
			checked := 0
			for key, spec := range specs {
				for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
					if err := check(t, c); err != nil {
						t.Errorf("%s container %s: %v", key, c.Name, err)
					}
					checked++
				}
			}
			t.Logf("%d containers' command lines accepted", checked)
			for key, conflist := range configMaps {
				if strings.HasSuffix(key, ".conflist") {
					if err := nodeagent.CheckConflist([]byte(conflist)); err != nil {
						t.Errorf("%s: %v\n%s", key, err, conflist)
					}
				}
			}
		})
	}
}

// The harness itself: a flag the binaries do not know, a missing subcommand
// and a bad value each fail the check.
func TestCheckCatchesMistakes(t *testing.T) {
	for _, c := range []corev1.Container{
		{Name: "renamed-flag", Command: []string{"/mizar-nodeagent"}, Args: []string{"--node=x", "--cni-conf=/x"}},
		{Name: "missing-subcommand", Command: []string{"/mizar-nodeagent", "install-cni-v2", "--cni-bin-dir=/x"}},
		{Name: "bad-value", Command: []string{"/mizar-nodeagent"}, Args: []string{"--daemonset=a/b/c"}},
		{Name: "droplet-not-node", Command: []string{"/mizar-nodeagent"}, Args: []string{"--node-name=a", "--droplet=b"}},
		{Name: "apiserver-flag", Command: []string{"/mizar-apiserver"}, Args: []string{"--etcd-server=https://x"}},
		{Name: "apiserver-subnet-outside", Command: []string{"/mizar-apiserver"}, Args: []string{"--default-vpc=p=10.0.0.0/16", "--default-subnet=s=10.1.0.0/24"}},
		{Name: "apiserver-agent-sa", Command: []string{"/mizar-apiserver"}, Args: []string{"--node-agent-service-account=mizar-agent"}},
		{Name: "etcd-flag", Command: []string{"etcd"}, Args: []string{"--listen-clients=x"}},
	} {
		if err := check(t, c); err == nil {
			t.Errorf("%s: %v accepted", c.Name, argv(c))
		}
	}
}

// The conflist the agents install works as written: mizar's binary name,
// a default placement, 1.0.0, portmap chained, the MTU only when set.
func TestConflist(t *testing.T) {
	_, cms := podSpecs(t, helmTemplate(t, ValueSets["pod-network-external-etcd"]))
	conf := cms["ConfigMap/mz-cni/10-mizar.conflist"]
	for _, want := range []string{`"type": "mizar"`, `"vpc": "tenants"`, `"subnet": "tenants-a"`, `"cniVersion": "1.0.0"`, `"type": "portmap"`, `"mtu": 1400`} {
		if !strings.Contains(conf, want) {
			t.Errorf("conflist lacks %s:\n%s", want, conf)
		}
	}
	_, cms = podSpecs(t, helmTemplate(t, ""))
	if conf := cms["ConfigMap/mz-cni/10-mizar.conflist"]; strings.Contains(conf, "mtu") || !strings.Contains(conf, `"subnet": "pods-default"`) {
		t.Errorf("default conflist:\n%s", conf)
	}
}

// With the broker's OSB API on, the apiserver listens on the OSB port, reads
// "username:password" from the chart's Secret (a generated password of 32, or
// the one given), and the fulfillment operator may write workloads in the OSB
// namespace, which the chart creates, and nowhere else.
func TestBrokerOSB(t *testing.T) {
	manifest := helmTemplate(t, ValueSets["broker-osb"])
	var secret corev1.Secret
	var roleBindingNS, nsName string
	for _, doc := range strings.Split(manifest, "\n---") {
		var meta struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name, Namespace string
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			continue
		}
		switch {
		case meta.Kind == "Secret" && meta.Metadata.Name == "mz-osb":
			mustDecode(t, doc, &secret)
		case meta.Kind == "RoleBinding" && meta.Metadata.Name == "mz-broker-fulfillment":
			roleBindingNS = meta.Metadata.Namespace
		case meta.Kind == "Namespace":
			nsName = meta.Metadata.Name
		}
	}
	user, pass, ok := strings.Cut(string(secret.Data["credentials"]), ":")
	if !ok || user != "platform" || len(pass) != 32 {
		t.Errorf("Secret mz-osb credentials %q: want platform:<32 generated characters>", secret.Data["credentials"])
	}
	if roleBindingNS != "brokers" || nsName != "brokers" {
		t.Errorf("fulfillment RoleBinding in %q, Namespace %q: want both brokers", roleBindingNS, nsName)
	}
	specs, _ := podSpecs(t, manifest)
	args := strings.Join(argv(specs["Deployment/mz-apiserver"].Containers[0]), " ")
	for _, want := range []string{"--broker-fulfillment", "--broker-osb-address=0.0.0.0:9444", "--broker-osb-credentials-file=/etc/mizar/osb/credentials", "--broker-osb-namespace=brokers"} {
		if !strings.Contains(args, want) {
			t.Errorf("apiserver args lack %s: %s", want, args)
		}
	}
	given := helmTemplate(t, ValueSets["broker-osb"], "--set", "broker.osb.password=0123456789abcdefXYZ")
	if !strings.Contains(given, "credentials: cGxhdGZvcm06MDEyMzQ1Njc4OWFiY2RlZlhZWg==") {
		t.Errorf("a given password is not the Secret's")
	}
	if out := helmTemplate(t, ""); strings.Contains(out, "broker-osb") || strings.Contains(out, "mz-osb") {
		t.Errorf("the default values render the OSB API")
	}
}
