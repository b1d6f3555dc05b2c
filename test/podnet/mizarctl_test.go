package podnet

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// mizarctl runs the real mizarctl against the cluster's API and agents
// and returns its output and exit code.
func (c *podCluster) mizarctl(args ...string) (string, int) {
	c.t.Helper()
	full := []string{"--kubeconfig", filepath.Join(c.dir, "apiserver", "kubeconfig")}
	for _, n := range c.nodes {
		if n.health != "" {
			full = append(full, "--agent", n.name+"="+n.health)
		}
	}
	cmd := exec.Command(filepath.Join(c.bin, "mizarctl"), append(full, args...)...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	case err != nil:
		c.t.Fatalf("mizarctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), 0
}

// TestMizarctlTraceAndDrops: on the local cluster (real agents, CNI, API),
// mizarctl trace names the path of a packet the programs deliver and the
// node and reason of one they drop (an unknown destination, a spoofed
// source), and each answer is checked against a real packet: it arrives,
// or mizarctl drops shows the agent's drop event for it with the same node
// and reason.
func TestMizarctlTraceAndDrops(t *testing.T) {
	c := newPodCluster(t, 3)
	build(t, filepath.Join(c.bin, "mizarctl"), "mizar.dev/cmd/mizarctl")
	for _, n := range c.nodes {
		n.health = freeLoopbackAddr(t)
		c.startAgent(n)
	}
	_, bouncers := c.createVPC("vpc-a", "10.63.0.0/16", [2]string{"a1", "10.63.1.0/24"})
	p1 := c.addPod(c.nodes[0], "p1", "a1")
	p2 := c.addPod(c.nodes[1], "p2", "a1")
	bouncer := bouncers["a1"]

	t.Run("delivered", func(t *testing.T) {
		if err := ping(p1, p2.ip, 2); err != nil {
			t.Fatal(err)
		}
		out, code := c.mizarctl("trace", "default/p1", "--to", "default/p2", "--proto", "icmp")
		t.Logf("mizarctl trace:\n%s", out)
		if code != 0 || !strings.Contains(out, "Not dropped: pod at "+c.nodes[1].name) || !strings.Contains(out, "delivered to the pod") {
			t.Fatalf("trace p1 -> p2: exit %d, want 0 and delivered at %s", code, c.nodes[1].name)
		}
	})

	t.Run("unknown-destination", func(t *testing.T) {
		nobody := "10.63.1.250"
		start := time.Now()
		if err := ping(p1, nobody, 1); err == nil {
			t.Fatalf("ping of %s, which no pod has, was answered", nobody)
		}
		out, code := c.mizarctl("drops", "--since", (time.Since(start) + 2*time.Second).Round(time.Second).String(), "--wait", "3s")
		t.Logf("mizarctl drops:\n%s", out)
		if code != 0 || !hasLine(out, bouncer, "drop_unknown_dst", "icmp "+p1.ip+" -> "+nobody) {
			t.Fatalf("mizarctl drops shows no drop_unknown_dst at %s for the real ping", bouncer)
		}
		out, code = c.mizarctl("trace", "default/p1", "--to", nobody, "--proto", "icmp")
		t.Logf("mizarctl trace:\n%s", out)
		if code != 1 || !strings.Contains(out, "Dropped at "+bouncer+": drop_unknown_dst") {
			t.Fatalf("trace p1 -> %s: exit %d, want 1 and dropped at %s for drop_unknown_dst", nobody, code, bouncer)
		}
	})

	t.Run("spoofed-source", func(t *testing.T) {
		spoofed := "10.63.1.66"
		c.ip("-n", p1.netns, "addr", "add", spoofed+"/32", "dev", "eth0")
		// ARP keeps asking from the pod's own address (the program answers
		// no other).
		c.run("ip", "netns", "exec", p1.netns, "sysctl", "-qw", "net.ipv4.conf.all.arp_announce=2", "net.ipv4.conf.eth0.arp_announce=2")
		start := time.Now()
		if err := exec.Command("ip", "netns", "exec", p1.netns, "ping", "-n", "-q", "-c", "1", "-W", "1", "-I", spoofed, p2.ip).Run(); err == nil {
			t.Fatal("a ping from a spoofed source was answered")
		}
		out, code := c.mizarctl("drops", "--since", (time.Since(start) + 2*time.Second).Round(time.Second).String(), "--wait", "3s")
		t.Logf("mizarctl drops:\n%s", out)
		if code != 0 || !hasLine(out, c.nodes[0].name, "drop_spoof", "icmp "+spoofed+" -> "+p2.ip) {
			t.Fatalf("mizarctl drops shows no drop_spoof at %s for the real ping", c.nodes[0].name)
		}
		out, code = c.mizarctl("trace", "default/p1", "--to", "default/p2", "--proto", "icmp", "--src", spoofed)
		t.Logf("mizarctl trace:\n%s", out)
		if code != 1 || !strings.Contains(out, "Dropped at "+c.nodes[0].name+": drop_spoof") {
			t.Fatalf("trace of a spoofed packet: exit %d, want 1 and dropped at %s for drop_spoof", code, c.nodes[0].name)
		}
	})

	t.Run("sysdump", func(t *testing.T) { checkSysdump(t, c, p1, bouncer) })
}

// TestMizarctlConnectivityTest: mizarctl connectivity-test passes on the
// local cluster (pods of two VPCs on three nodes: pings within a VPC
// answered, across VPCs not) and, once an agent is stopped, fails with a
// table naming that droplet and the checks it could not run.
func TestMizarctlConnectivityTest(t *testing.T) {
	c := newPodCluster(t, 3)
	build(t, filepath.Join(c.bin, "mizarctl"), "mizar.dev/cmd/mizarctl")
	for _, n := range c.nodes {
		n.health = freeLoopbackAddr(t)
		c.startAgent(n)
	}
	c.createVPC("vpc-a", "10.64.0.0/16", [2]string{"a1", "10.64.1.0/24"})
	c.createVPC("vpc-b", "10.65.0.0/16", [2]string{"b1", "10.65.1.0/24"})
	for i, n := range c.nodes {
		c.addPod(n, fmt.Sprintf("ca%d", i+1), "a1")
	}
	c.addPod(c.nodes[0], "cb1", "b1")
	c.addPod(c.nodes[1], "cb2", "b1")

	out, code := c.mizarctl("connectivity-test")
	t.Logf("mizarctl connectivity-test:\n%s", out)
	// vpc-a: 3 x 2 pairs; vpc-b: 2; isolation a <-> b: 2 x 2 + 2 x 1... at least 8 answered and some isolation checks.
	if code != 0 || !strings.Contains(out, "PASSED: 3/3 droplets healthy") || strings.Count(out, "pod-pod") < 8 || !strings.Contains(out, "isolation") {
		t.Fatalf("connectivity-test on a healthy cluster: exit %d, want 0, PASSED with pod-pod and isolation checks", code)
	}

	stopped := c.nodes[2]
	c.stopAgent(stopped)
	out, code = c.mizarctl("connectivity-test")
	t.Logf("mizarctl connectivity-test, the agent of %s stopped:\n%s", stopped.name, out)
	if code != 1 || !strings.Contains(out, "FAILED: 2/3 droplets healthy") || !hasLine(out, stopped.name, "NOT ANSWERING", "FAIL") ||
		!hasLine(out, "pod-pod", stopped.name+"/default/ca3", "not run: the agent of "+stopped.name+" is not answering", "FAIL") {
		t.Fatalf("connectivity-test with the agent of %s stopped: exit %d, want 1 and a table naming it", stopped.name, code)
	}
}

// checkSysdump runs mizarctl sysdump and opens the tarball: the objects,
// status, every agent's maps, drops and metrics, and the logs given.
func checkSysdump(t *testing.T, c *podCluster, p1 *pod, bouncer string) {
	n1 := c.nodes[0]
	logs, _ := filepath.Glob(filepath.Join(n1.dir, "nodeagent-*.log"))
	if len(logs) == 0 {
		t.Fatalf("no agent log in %s", n1.dir)
	}
	out := filepath.Join(t.TempDir(), "dump.tar.gz")
	res, code := c.mizarctl("sysdump", "-o", out, "--log", n1.name+"="+logs[len(logs)-1])
	t.Log(res)
	if code != 0 {
		t.Fatalf("mizarctl sysdump: exit %d", code)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		_, name, _ := strings.Cut(h.Name, "/") // below mizar-sysdump-<time>/
		files[name] = string(b)
	}
	var names []string
	for n := range files {
		names = append(names, n)
	}
	t.Logf("sysdump holds %d files: %v; errors.txt: %s", len(files), names, files["errors.txt"])
	want := map[string][]string{
		"status.txt":                         {"Droplets (node agents): 3/3 Provisioned", n1.name},
		"objects/endpoints.json":             {p1.ip, `"pod": "p1"`},
		"objects/vpcs.json":                  {"vpc-a"},
		"objects/droplets.json":              {n1.name},
		"version.txt":                        {"mizarctl"},
		"agents/" + n1.name + "/state.txt":   {"## endpoints", p1.ip, "## pod_ifaces", "## links", "underlay_xdp"},
		"agents/" + n1.name + "/metrics.txt": {"mizar_dataplane_packets_total", "mizar_dataplane_drop_events_total"},
		"agents/" + n1.name + "/healthz.txt": {"ok"},
		"agents/" + bouncer + "/drops.json":  {"drop_unknown_dst"},
		"agents/" + n1.name + "/drops.json":  {"drop_spoof"},
		"logs/" + n1.name + ".log":           {"mizar-nodeagent running"},
	}
	for name, words := range want {
		body, ok := files[name]
		if !ok {
			t.Errorf("sysdump has no %s", name)
			continue
		}
		for _, w := range words {
			if !strings.Contains(body, w) {
				t.Errorf("sysdump %s lacks %q", name, w)
			}
		}
	}
}

// hasLine reports whether a line of out holds every one of words.
func hasLine(out string, words ...string) bool {
	for _, l := range strings.Split(out, "\n") {
		ok := true
		for _, w := range words {
			if !strings.Contains(l, w) {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}
