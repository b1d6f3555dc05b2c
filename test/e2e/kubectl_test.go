package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// kubectlTimeout bounds one kubectl call so a hung server fails the test.
const kubectlTimeout = time.Minute

// result is one finished kubectl run.
type result struct {
	args           []string
	stdout, stderr string
	code           int // exit status; -1 if it did not exit normally
	err            error
}

func (r result) String() string {
	return fmt.Sprintf("kubectl %s: %v\n--- stdout:\n%s\n--- stderr:\n%s", strings.Join(r.args, " "), r.errText(), r.stdout, r.stderr)
}

func (r result) errText() string {
	if r.err == nil {
		return "exit 0"
	}
	return r.err.Error()
}

// runKubectl runs the real kubectl against the server kubeconfig names.
func runKubectl(ctx context.Context, kubeconfig string, stdin []byte, args ...string) result {
	full := append([]string{"--kubeconfig", kubeconfig, "--cache-dir", kubectlCache}, args...)
	cmd := exec.CommandContext(ctx, kubectlBin, full...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	err := cmd.Run()
	r := result{args: args, stdout: stdout.String(), stderr: stderr.String(), code: -1, err: err}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		r.code = 0
	case errors.As(err, &exitErr):
		r.code = exitErr.ExitCode()
	}
	return r
}

// kubectl runs kubectl against the shared server.
func kubectl(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), kubectlTimeout)
	defer cancel()
	return runKubectl(ctx, srv.kubeconfig, nil, args...)
}

// mustKubectl runs kubectl and fails the test unless it exits 0; it returns stdout.
func mustKubectl(t *testing.T, args ...string) string {
	t.Helper()
	r := kubectl(t, args...)
	if r.err != nil {
		t.Fatalf("%v", r)
	}
	return r.stdout
}

// kubectlMustFail runs kubectl and fails the test if it exits 0 (or never ran).
func kubectlMustFail(t *testing.T, args ...string) result {
	t.Helper()
	r := kubectl(t, args...)
	if r.code <= 0 {
		t.Fatalf("expected a non-zero exit status: %v", r)
	}
	return r
}

// writeFile writes a manifest into the test's temporary directory.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// lines splits output into its non-empty lines.
func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// table is kubectl get's human-readable output split into cells. None of the
// values these tests print contain spaces, so whitespace separates cells.
type table struct {
	header []string
	rows   map[string][]string // by the NAME cell
}

func parseTable(t *testing.T, out string) table {
	t.Helper()
	ls := lines(out)
	if len(ls) == 0 {
		t.Fatalf("kubectl printed no table:\n%s", out)
	}
	tb := table{header: strings.Fields(ls[0]), rows: map[string][]string{}}
	name := indexOf(tb.header, "NAME")
	if name < 0 {
		t.Fatalf("no NAME column in %q", ls[0])
	}
	for _, l := range ls[1:] {
		cells := strings.Fields(l)
		if len(cells) != len(tb.header) {
			t.Fatalf("row %q has %d cells, header %q has %d", l, len(cells), ls[0], len(tb.header))
		}
		tb.rows[cells[name]] = cells
	}
	return tb
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// objects names the six objects of one manifest.
type objects struct {
	prefix                                       string
	vpc, subnet, droplet, divider, bouncer, endp string
	namespace                                    string
	// octet numbers the manifest's address ranges: 10.<octet>.0.0/16 etc.
	octet int
	// serial is unique per set in this test process: it keeps the droplet's
	// address, which must be unique in the store, apart across -count reruns.
	serial int32
}

// seq makes names unique per test run, so -count=N reruns create fresh objects.
var seq atomic.Int32

// unique is prefix made unique within this test process, e.g. cols1.
func unique(prefix string) string { return fmt.Sprintf("%s%d", prefix, seq.Add(1)) }

// newObjects names a fresh set of objects after prefix.
func newObjects(prefix string, octet int) objects {
	serial := seq.Add(1)
	prefix = fmt.Sprintf("%s%d", prefix, serial)
	return objects{
		prefix: prefix, octet: octet, serial: serial,
		vpc: prefix + "-vpc", subnet: prefix + "-subnet", droplet: prefix + "-node",
		divider: prefix + "-divider", bouncer: prefix + "-bouncer", endp: prefix + "-ep",
		namespace: prefix + "-ns",
	}
}

func (o objects) vpcCIDR() string    { return fmt.Sprintf("10.%d.0.0/16", o.octet) }
func (o objects) subnetCIDR() string { return fmt.Sprintf("10.%d.1.0/24", o.octet) }
func (o objects) gateway() string    { return fmt.Sprintf("10.%d.1.1", o.octet) }

// firstEndpointIP is what the server allocates first in a fresh subnet: the
// lowest host address that is not the gateway.
func (o objects) firstEndpointIP() string { return fmt.Sprintf("10.%d.1.2", o.octet) }
func (o objects) dropletIP() string       { return fmt.Sprintf("192.168.%d.%d", o.octet, 10+o.serial%240) }
func (o objects) dropletMAC() string      { return fmt.Sprintf("02:00:00:00:%02x:11", o.octet) }
func (o objects) endpointMAC() string     { return fmt.Sprintf("02:00:00:00:%02x:21", o.octet) }

// refs are kubectl's TYPE/NAME for each object, as -o name prints them.
func (o objects) refs() []string {
	return []string{
		"vpc.networking.mizar.dev/" + o.vpc,
		"subnet.networking.mizar.dev/" + o.subnet,
		"droplet.networking.mizar.dev/" + o.droplet,
		"divider.networking.mizar.dev/" + o.divider,
		"bouncer.networking.mizar.dev/" + o.bouncer,
		"endpoint.networking.mizar.dev/" + o.endp,
	}
}

// manifest is one object of every kind, in the order apply creates them.
func (o objects) manifest() string {
	return fmt.Sprintf(`apiVersion: networking.mizar.dev/v1alpha1
kind: Vpc
metadata:
  name: %[1]s
spec:
  cidr: %[2]s
---
apiVersion: networking.mizar.dev/v1alpha1
kind: Subnet
metadata:
  name: %[3]s
spec:
  vpc: %[1]s
  cidr: %[4]s
---
apiVersion: networking.mizar.dev/v1alpha1
kind: Droplet
metadata:
  name: %[5]s
spec:
  node: %[5]s
  ip: %[6]s
  mac: "%[7]s"
  interface: eth0
---
apiVersion: networking.mizar.dev/v1alpha1
kind: Divider
metadata:
  name: %[8]s
spec:
  vpc: %[1]s
  droplet: %[5]s
---
apiVersion: networking.mizar.dev/v1alpha1
kind: Bouncer
metadata:
  name: %[9]s
spec:
  subnet: %[3]s
  droplet: %[5]s
---
apiVersion: networking.mizar.dev/v1alpha1
kind: Endpoint
metadata:
  name: %[10]s
  namespace: %[11]s
spec:
  subnet: %[3]s
  pod: %[10]s-pod
  droplet: %[5]s
  mac: "%[12]s"
`, o.vpc, o.vpcCIDR(), o.subnet, o.subnetCIDR(), o.droplet, o.dropletIP(), o.dropletMAC(),
		o.divider, o.bouncer, o.endp, o.namespace, o.endpointMAC())
}

// applyManifest writes o's manifest and kubectl-applies it (client-side) once,
// checking that every object was created. It returns the manifest's path.
func applyManifest(t *testing.T, o objects) string {
	t.Helper()
	path := writeFile(t, o.prefix+".yaml", o.manifest())
	out := mustKubectl(t, "apply", "-f", path)
	var want []string
	for _, r := range o.refs() {
		want = append(want, r+" created")
	}
	if got := lines(out); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("kubectl apply printed\n%s\nwant\n%s", out, strings.Join(want, "\n"))
	}
	return path
}
