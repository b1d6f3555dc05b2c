package nodeagent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/containernetworking/plugins/pkg/ns"
	"k8s.io/klog/v2"

	"mizar.dev/pkg/dataplane"
)

// offloadsFile records, in the state directory, which offloads the agent
// turned off on a veth underlay, so that uninstalling mizar turns exactly
// those on again. Written once: a restarted agent finds them off already.
const offloadsFile = "underlay-offloads.json"

type offloadRecord struct {
	Interface string   `json:"interface"`
	TurnedOff []string `json:"turnedOff"`
}

// completeVethFrames makes a veth underlay (kind and podman nodes) carry
// what a wire carries. Its peer node's underlay program gets the frames this
// node sends as bytes, without the skb's "segment me" and "checksum still to
// do" marks: a GSO frame larger than a page is dropped before the program
// runs and a redirected partial-checksum segment reaches the pod with a bad
// sum. Cross-node TCP then stalled once its window grew (issue 17, found by
// bench-cluster). A NIC does both before the wire, so only veths need this.
func completeVethFrames(hostNetns string, u *Underlay, stateDir string) error {
	if u.Kind != "veth" {
		return nil
	}
	var off []string
	err := inHostNetns(hostNetns, func() error {
		var err error
		off, err = dataplane.CompleteFrames(u.Name)
		return err
	})
	if err != nil {
		return fmt.Errorf("turning off segmentation and checksum offload on the veth underlay %s: %w", u.Name, err)
	}
	if len(off) == 0 {
		return nil
	}
	klog.InfoS("The underlay is a veth: segmentation and checksums are now done before a frame leaves, as a NIC does (the peer's XDP program cannot finish them)",
		"underlay", u.Name, "turnedOff", off)
	path := filepath.Join(stateDir, offloadsFile)
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	data, err := json.Marshal(offloadRecord{Interface: u.Name, TurnedOff: off})
	if err != nil {
		return err
	}
	return writeAtomic(stateDir, offloadsFile, 0o644, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// restoreOffloads turns back on what completeVethFrames turned off.
func restoreOffloads(hostNetns, stateDir string) error {
	data, err := os.ReadFile(filepath.Join(stateDir, offloadsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var rec offloadRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return fmt.Errorf("%s: %w", offloadsFile, err)
	}
	on := map[string]bool{}
	for _, f := range rec.TurnedOff {
		on[f] = true
	}
	if err := inHostNetns(hostNetns, func() error { return dataplane.SetFeatures(rec.Interface, on) }); err != nil {
		return err
	}
	klog.InfoS("Turned the underlay's offloads back on", "underlay", rec.Interface, "features", rec.TurnedOff)
	return nil
}

// inHostNetns runs fn in the netns at path ("" = this thread's).
func inHostNetns(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	return ns.WithNetNSPath(path, func(ns.NetNS) error { return fn() })
}
