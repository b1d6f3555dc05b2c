package nodeagent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"mizar.dev/pkg/dataplane"
)

const goodConflist = `{"cniVersion": "1.0.0", "name": "mizar", "plugins": [
  {"type": "mizar", "vpc": "pods", "subnet": "pods-default"},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}`

func TestInstallFileIsAtomicAndReplaces(t *testing.T) {
	src, bin := filepath.Join(t.TempDir(), "plugin"), t.TempDir()
	if err := os.WriteFile(src, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A running plugin's inode stays intact: the old file is renamed over, not rewritten.
	old := filepath.Join(bin, PluginName)
	if err := os.WriteFile(old, []byte("old"), 0o755); err != nil {
		t.Fatal(err)
	}
	held, err := os.Open(old)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := InstallFile(src, bin, PluginName, 0o755); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(old); string(b) != "new" {
		t.Errorf("installed plugin holds %q", b)
	}
	if st, _ := os.Stat(old); st.Mode().Perm() != 0o755 {
		t.Errorf("installed plugin mode %v", st.Mode())
	}
	if b := make([]byte, 3); func() bool { n, _ := held.ReadAt(b, 0); return n != 3 || string(b) != "old" }() {
		t.Errorf("the open old plugin was rewritten in place: %q", b)
	}
	// No temporary file is left, also after a failure.
	if err := InstallFile(filepath.Join(t.TempDir(), "missing"), bin, PluginName, 0o755); err == nil {
		t.Error("installing a missing file succeeded")
	}
	if ents, _ := os.ReadDir(bin); len(ents) != 1 {
		t.Errorf("bin dir holds %v", ents)
	}
	// If absent: a node's own portmap is kept.
	pm := filepath.Join(t.TempDir(), "portmap")
	if err := os.WriteFile(pm, []byte("ours"), 0o755); err != nil {
		t.Fatal(err)
	}
	if ok, err := InstallFileIfAbsent(pm, bin); !ok || err != nil {
		t.Errorf("portmap into an empty place: %v %v", ok, err)
	}
	if err := os.WriteFile(filepath.Join(bin, "portmap"), []byte("node's"), 0o755); err != nil {
		t.Fatal(err)
	}
	if ok, err := InstallFileIfAbsent(pm, bin); ok || err != nil {
		t.Errorf("portmap over the node's: %v %v", ok, err)
	}
	if b, _ := os.ReadFile(filepath.Join(bin, "portmap")); string(b) != "node's" {
		t.Errorf("the node's portmap was replaced: %q", b)
	}
}

func TestInstallConflistRefusesWhatKubeletCannotUse(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ conf, want string }{
		{`{"cniVersion": "1.0.0", "name": "m", "plugins": [{"type": "mizar-cni"}]}`, `"type": "mizar"`},
		{`{"cniVersion": "1.1.0", "name": "m", "plugins": [{"type": "mizar"}]}`, "1.1.0"},
		{`{"name": "m", "plugins": [`, "does not parse"},
	} {
		src := filepath.Join(t.TempDir(), "c.conflist")
		if err := os.WriteFile(src, []byte(c.conf), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := InstallConflist(src, dir, ConflistName); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %s", c.conf, err, c.want)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("a refused conflist left %v", ents)
	}
	src := filepath.Join(t.TempDir(), "c.conflist")
	if err := os.WriteFile(src, []byte(goodConflist), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := InstallConflist(src, dir, ConflistName); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, ConflistName)); string(b) != goodConflist {
		t.Errorf("installed conflist %q", b)
	}
}

// Uninstall removes the conflist, the plugin, the pins (on a real bpffs when
// root) and the state directories, and nothing else; a second run is a no-op.
func TestUninstall(t *testing.T) {
	conf, bin, state, run := t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()
	for p, data := range map[string]string{
		filepath.Join(conf, ConflistName): goodConflist, filepath.Join(conf, "99-other.conflist"): "{}",
		filepath.Join(bin, PluginName): "x", filepath.Join(bin, "loopback"): "x",
		filepath.Join(state, "cni", "a.json"): "{}", filepath.Join(run, "mizar", "delete-queue", "q"): "x",
	} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	u := Uninstall{ConfDir: conf, Conflist: ConflistName, BinDir: bin, Plugins: []string{PluginName},
		Dirs: []string{filepath.Join(state, "cni"), filepath.Join(run, "mizar")}}
	if os.Geteuid() == 0 {
		// A real pin root on bpffs (Purge refuses any other directory).
		u.PinRoot = filepath.Join("/sys/fs/bpf", "mzt-uninstall-"+filepath.Base(state))
		t.Cleanup(func() { _ = dataplane.Purge(u.PinRoot) })
		if err := os.MkdirAll(u.PinRoot, 0o700); err != nil {
			t.Skipf("no bpffs here: %v", err)
		}
	}
	for i := range 2 {
		if err := u.Run(); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
	}
	for _, gone := range []string{filepath.Join(conf, ConflistName), filepath.Join(bin, PluginName), filepath.Join(state, "cni"), filepath.Join(run, "mizar"), u.PinRoot} {
		if gone == "" {
			continue
		}
		if _, err := os.Stat(gone); !os.IsNotExist(err) {
			t.Errorf("%s is left (%v)", gone, err)
		}
	}
	for _, kept := range []string{filepath.Join(conf, "99-other.conflist"), filepath.Join(bin, "loopback")} {
		if _, err := os.Stat(kept); err != nil {
			t.Errorf("%s, not mizar's, was removed: %v", kept, err)
		}
	}
}
