package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"k8s.io/klog/v2"

	"mizar.dev/pkg/dataplane"
)

// PluginName is the CNI plugin's file name on nodes: what a conflist's "type" names.
const PluginName = "mizar"

// ConflistName is the conflist's default file name; "10-" sorts it before the
// files a node image may ship (kubelet and containerd take the first).
const ConflistName = "10-mizar.conflist"

// InstallFile copies src to dir/name atomically: a temporary file in dir is
// written, synced and renamed over name, so kubelet never runs a half-written
// plugin and a running one keeps its (unlinked) inode.
func InstallFile(src, dir, name string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("installing %s: %w", name, err)
	}
	defer in.Close()
	return writeAtomic(dir, name, mode, func(w io.Writer) error {
		_, err := io.Copy(w, in)
		return err
	})
}

func writeAtomic(dir, name string, mode os.FileMode, fill func(io.Writer) error) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("installing %s: %w", name, err)
	}
	tmp, err := os.CreateTemp(dir, "."+name+".tmp-")
	if err != nil {
		return fmt.Errorf("installing %s: %w", name, err)
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := fill(tmp); err != nil {
		return fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(mode); err != nil {
		return fmt.Errorf("installing %s: %w", name, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("installing %s: %w", name, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("installing %s: %w", name, err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("installing %s: %w", name, err)
	}
	done = true
	return nil
}

// InstallFileIfAbsent installs src into dir under its base name unless a file
// of that name is there (a node's own portmap is newer than ours, or its own
// business); it says whether it installed.
func InstallFileIfAbsent(src, dir string) (bool, error) {
	name := filepath.Base(src)
	if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
		return false, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("installing %s: %w", name, err)
	}
	return true, InstallFile(src, dir, name, 0o755)
}

// CheckConflist refuses a conflist kubelet could not use with mizar: it must
// parse as a conflist (cniVersion 1.0.0 or older, which containerd 1.6/1.7 read)
// and its first plugin must be mizar.
func CheckConflist(data []byte) error {
	l, err := libcni.ConfListFromBytes(data)
	if err != nil {
		return fmt.Errorf("the conflist does not parse: %w", err)
	}
	if len(l.Plugins) == 0 || l.Plugins[0].Network.Type != PluginName {
		return fmt.Errorf("the conflist's first plugin must have \"type\": %q (the plugin's file name)", PluginName)
	}
	if l.CNIVersion == "1.1.0" {
		return errors.New("the conflist says cniVersion 1.1.0, which containerd 1.6 and 1.7 cannot read results of: use 1.0.0")
	}
	return nil
}

// InstallConflist checks the conflist at src and writes it to dir/name atomically.
func InstallConflist(src, dir, name string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("reading the conflist: %w", err)
	}
	if err := CheckConflist(data); err != nil {
		return fmt.Errorf("%s: %w", src, err)
	}
	return writeAtomic(dir, name, 0o644, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// Uninstall is what a node keeps of mizar, to remove when mizar is uninstalled.
type Uninstall struct {
	// ConfDir/Conflist and BinDir/Plugins are the files install-cni and the agent wrote.
	ConfDir, Conflist string
	BinDir            string
	Plugins           []string
	// PinRoot is mizar's bpffs directory: its pinned links are detached (the
	// underlay's XDP and the pods' TC programs) and its maps removed.
	PinRoot string
	// Dirs are removed with their contents: the CNI state, the delete queue
	// and the socket's directory.
	Dirs []string
	// HostPath removes the host path's device pair and nftables table (what
	// --host-vpc installed), in HostNetns ("" = this process's netns).
	HostPath  bool
	HostNetns string
	// StateDir holds the record of the underlay offloads the agent turned
	// off (offloads.go), turned on again before Dirs are removed.
	StateDir string
}

// Run removes the conflist first (kubelet stops starting pods on mizar and
// turns the node NotReady), then the plugins and the directories. Missing
// files are no error; every failure is reported.
func (u Uninstall) Run() error {
	var errs []error
	rm := func(p string, all bool) {
		if p == "" || p == "/" {
			return
		}
		var err error
		if all {
			err = os.RemoveAll(p)
		} else if err = os.Remove(p); errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		if err != nil {
			errs = append(errs, err)
			return
		}
		klog.InfoS("Removed", "path", p)
	}
	if u.ConfDir != "" && u.Conflist != "" {
		rm(filepath.Join(u.ConfDir, u.Conflist), false)
	}
	for _, p := range u.Plugins {
		if u.BinDir != "" && p != "" {
			rm(filepath.Join(u.BinDir, p), false)
		}
	}
	if u.PinRoot != "" {
		if err := dataplane.Purge(u.PinRoot); err != nil {
			errs = append(errs, fmt.Errorf("removing the BPF pins: %w", err))
		} else {
			klog.InfoS("Removed", "path", u.PinRoot)
		}
	}
	if u.StateDir != "" {
		// Before the state directory (which holds the record) goes.
		if err := restoreOffloads(u.HostNetns, u.StateDir); err != nil {
			errs = append(errs, fmt.Errorf("turning the underlay's offloads back on: %w", err))
		}
	}
	for _, d := range u.Dirs {
		rm(d, true)
	}
	if u.HostPath {
		if err := u.removeHostPath(); err != nil {
			errs = append(errs, fmt.Errorf("removing the host path: %w", err))
		}
	}
	return errors.Join(errs...)
}

// removeHostPath removes the host device pair and nftables table, which
// would otherwise keep routing the old pod range into a device nobody serves.
func (u Uninstall) removeHostPath() error {
	run := func() error { return dataplane.RemoveHostPathNode(context.Background()) }
	if u.HostNetns != "" {
		inner := run
		run = func() error { return ns.WithNetNSPath(u.HostNetns, func(ns.NetNS) error { return inner() }) }
	}
	if err := run(); err != nil {
		return err
	}
	klog.InfoS("Removed the host path", "device", dataplane.HostDevice)
	return nil
}
