package nodeagent

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/safchain/ethtool"

	"mizar.dev/pkg/dataplane"
)

// TestVethUnderlayOffloads: on a veth underlay the agent turns the wire
// features off and records which; a restarted agent keeps the first record;
// uninstalling turns exactly those on again. Another kind of link is left
// as it is.
func TestVethUnderlayOffloads(t *testing.T) {
	requireRoot(t)
	nsPath := netnsAdd(t, "mzoff-"+suffix(t))
	if out, err := exec.Command("ip", "-n", filepath.Base(nsPath), "link", "add", "ul0", "type", "veth", "peer", "name", "ul1").CombinedOutput(); err != nil {
		t.Fatalf("ip link add: %v: %s", err, out)
	}
	features := func() map[string]bool {
		t.Helper()
		var have map[string]bool
		err := inHostNetns(nsPath, func() error {
			e, err := ethtool.NewEthtool()
			if err != nil {
				return err
			}
			defer e.Close()
			have, err = e.Features("ul0")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return have
	}
	before := features()
	var wasOn []string
	for f := range dataplane.WireFeatures {
		if before[f] {
			wasOn = append(wasOn, f)
		}
	}
	if len(wasOn) == 0 {
		t.Fatalf("a fresh veth has none of %v on: nothing to test", dataplane.WireFeatures)
	}
	state := t.TempDir()

	if err := completeVethFrames(nsPath, &Underlay{Name: "ul0", Kind: "bridge"}, state); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(state, offloadsFile)); !os.IsNotExist(err) {
		t.Fatalf("a non-veth underlay left a record (stat: %v)", err)
	}

	u := &Underlay{Name: "ul0", Kind: "veth"}
	if err := completeVethFrames(nsPath, u, state); err != nil {
		t.Fatal(err)
	}
	for f := range dataplane.WireFeatures {
		if features()[f] {
			t.Errorf("%s still on after completeVethFrames", f)
		}
	}
	first, err := os.ReadFile(filepath.Join(state, offloadsFile))
	if err != nil {
		t.Fatal(err)
	}
	// A restart finds them off: the record of the first run stays.
	if err := completeVethFrames(nsPath, u, state); err != nil {
		t.Fatal(err)
	}
	again, err := os.ReadFile(filepath.Join(state, offloadsFile))
	if err != nil || string(again) != string(first) {
		t.Fatalf("the record changed on restart: %s -> %s (%v)", first, again, err)
	}

	if err := restoreOffloads(nsPath, state); err != nil {
		t.Fatal(err)
	}
	after := features()
	for _, f := range wasOn {
		if !after[f] {
			t.Errorf("%s was on before mizar and is off after its uninstall", f)
		}
	}
}
