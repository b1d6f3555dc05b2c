package dataplane

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Link pins live at <pin root>/links/<ifname>/<program>, one per attachment,
// so an agent restart finds and updates them instead of attaching twice. The
// underlay's XDP link is pinned; pod_tcx pins are what earlier mizar versions
// left on pod veths (AttachPodAt replaces them with its filter).
const (
	linksDir       = "links"
	underlayPin    = "underlay_xdp"
	podPin         = "pod_tcx"
	maxIfnameBytes = unix.IFNAMSIZ - 1
)

// AttachUnderlay attaches the underlay program (XDP, in Options.XDPMode) to
// ifname in the calling thread's netns, or atomically replaces the program of
// an attachment pinned earlier (which keeps its mode: Detach first to change
// it).
func (d *Datapath) AttachUnderlay(ifname string) error {
	flags := link.XDPDriverMode
	if d.opts.XDPMode == XDPGeneric {
		flags = link.XDPGenericMode
	}
	return d.attach(ifname, underlayPin, d.objs.MizarUnderlay,
		func(ifindex int) (link.Link, error) {
			return link.AttachXDP(link.XDPOptions{Program: d.objs.MizarUnderlay, Interface: ifindex, Flags: flags})
		})
}

// The pod program is a direct-action cls_bpf filter on the clsact ingress of
// the pod's host-side veth (what the pod transmits), not a tcx link:
// attaching a tcx link waits for an RCU grace period under the rtnl lock
// (~16 ms each, so 100 pods added at once queue for seconds), a filter is one
// plain netlink request. A filter lives as long as its device and needs no
// pin; a restarted agent replaces its program in place (same handle and
// priority), and the device's deletion removes it.
const (
	podFilterHandle = 1
	podFilterPrio   = 1
	podFilterName   = "mizar_pod"
)

// AttachPod attaches the pod-side program to a pod's host-side veth in the
// calling thread's netns, or atomically replaces the program an earlier run
// attached. Describe the interface with UpsertPodInterface first.
func (d *Datapath) AttachPod(ifname string) error { return d.AttachPodAt(nil, ifname) }

// AttachPodAt is AttachPod in h's netns (nil: the calling thread's).
func (d *Datapath) AttachPodAt(h *netlink.Handle, ifname string) error {
	if err := checkIfname(ifname); err != nil {
		return err
	}
	if h == nil {
		h = &netlink.Handle{}
	}
	l, err := h.LinkByName(ifname)
	if err != nil {
		return fmt.Errorf("attach %s: %w", ifname, err)
	}
	idx := l.Attrs().Index
	qd := &netlink.GenericQdisc{QdiscType: "clsact",
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}}
	if err := h.QdiscAdd(qd); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("attach %s: clsact qdisc: %w", ifname, err)
	}
	f := &netlink.BpfFilter{FilterAttrs: podFilterAttrs(idx), Fd: d.objs.MizarPod.FD(), Name: podFilterName, DirectAction: true}
	if err := h.FilterReplace(f); err != nil {
		return fmt.Errorf("attach %s to %s: %w", podFilterName, ifname, err)
	}
	// An earlier mizar attached through tcx, with a pinned link: its
	// verdict came first until now; with the filter in place it goes.
	path := filepath.Join(d.opts.PinRoot, linksDir, ifname)
	if _, err := os.Stat(filepath.Join(path, podPin)); err == nil {
		d.mu.Lock()
		defer d.mu.Unlock()
		return removeLinkPins(path)
	}
	return nil
}

func podFilterAttrs(ifindex int) netlink.FilterAttrs {
	return netlink.FilterAttrs{LinkIndex: ifindex, Parent: netlink.HANDLE_MIN_INGRESS, Handle: podFilterHandle,
		Priority: podFilterPrio, Protocol: unix.ETH_P_ALL}
}

// DetachPodAt removes the pod program from ifname in h's netns (nil: the
// calling thread's), and any pin an earlier mizar left for it. A missing
// device or filter is not an error.
func (d *Datapath) DetachPodAt(h *netlink.Handle, ifname string) error {
	if err := checkIfname(ifname); err != nil {
		return err
	}
	if h == nil {
		h = &netlink.Handle{}
	}
	var errs []error
	if l, err := h.LinkByName(ifname); err == nil {
		err := h.FilterDel(&netlink.BpfFilter{FilterAttrs: podFilterAttrs(l.Attrs().Index)})
		if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENODEV) {
			errs = append(errs, fmt.Errorf("detach %s from %s: %w", podFilterName, ifname, err))
		}
	}
	path := filepath.Join(d.opts.PinRoot, linksDir, ifname)
	if _, err := os.Stat(path); err == nil {
		d.mu.Lock()
		errs = append(errs, removeLinkPins(path))
		d.mu.Unlock()
	}
	return errors.Join(errs...)
}

// PodProgramOn reports the ID of the program in mizar's pod filter on
// ifname in h's netns (nil: the calling thread's); ok=false when there is
// none or no such device. CNI CHECK asks it.
func (d *Datapath) PodProgramOn(h *netlink.Handle, ifname string) (id uint32, ok bool, err error) {
	if h == nil {
		h = &netlink.Handle{}
	}
	l, err := h.LinkByName(ifname)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("pod filter on %s: %w", ifname, err)
	}
	fs, err := h.FilterList(l, netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		return 0, false, fmt.Errorf("list filters of %s: %w", ifname, err)
	}
	for _, f := range fs {
		if bf, isBPF := f.(*netlink.BpfFilter); isBPF && bf.Handle == podFilterHandle && bf.Priority == podFilterPrio &&
			strings.HasPrefix(bf.Name, podFilterName) {
			return uint32(bf.Id), true, nil
		}
	}
	return 0, false, nil
}

// attach implements the restart-safe pattern: a pinned link is updated in
// place (no moment without a program); a defunct one (ENOLINK: its device
// went away) or one on another device of the same name is replaced; no pin
// means a fresh attachment, pinned so it outlives this process.
func (d *Datapath) attach(ifname, pin string, prog *ebpf.Program, create func(int) (link.Link, error)) error {
	if err := checkIfname(ifname); err != nil {
		return err
	}
	iface, err := net.InterfaceByName(ifname)
	if err != nil {
		return fmt.Errorf("attach %s: %w", ifname, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()

	dir := filepath.Join(d.opts.PinRoot, linksDir, ifname)
	path := filepath.Join(dir, pin)
	switch l, err := link.LoadPinnedLink(path, nil); {
	case err == nil:
		done, err := updatePinned(l, prog, iface.Index)
		if err != nil {
			return fmt.Errorf("attach %s: %w", path, err)
		}
		if done {
			return nil
		}
	case errors.Is(err, os.ErrNotExist):
	default:
		return fmt.Errorf("open pinned link %s: %w", path, err)
	}

	l, err := create(iface.Index)
	if err != nil {
		if errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("attach %s to %s: another program is attached there "+
				"(not through mizar's pinned link); remove it first: %w", pin, ifname, err)
		}
		return fmt.Errorf("attach %s to %s: %w", pin, ifname, err)
	}
	defer l.Close()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create link pin dir: %w", err)
	}
	if err := l.Pin(path); err != nil {
		return fmt.Errorf("pin link %s: %w", path, err)
	}
	return nil
}

// updatePinned swaps the program of a pinned link. done=false means the link
// was stale and has been unpinned, so the caller must attach afresh.
func updatePinned(l link.Link, prog *ebpf.Program, ifindex int) (done bool, err error) {
	defer l.Close()
	if idx, ok := linkIfindex(l); ok && idx == ifindex {
		err := l.Update(prog)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, unix.ENOLINK) {
			return false, fmt.Errorf("update pinned link: %w", err)
		}
	}
	// Defunct, or attached to an older device that had this name.
	if err := l.Unpin(); err != nil {
		return false, fmt.Errorf("unpin stale link: %w", err)
	}
	return false, nil
}

// linkIfindex reports the device an XDP or tcx link is attached to; a
// defunct link reports ok=false.
func linkIfindex(l link.Link) (int, bool) {
	info, err := l.Info()
	if err != nil {
		return 0, false
	}
	var idx uint32
	switch {
	case info.XDP() != nil:
		idx = info.XDP().Ifindex
	case info.TCX() != nil:
		idx = info.TCX().Ifindex
	}
	return int(idx), idx != 0
}

// Detach removes mizar's programs from ifname by unpinning their links. It
// does not need the interface to exist; nothing pinned is not an error.
func (d *Datapath) Detach(ifname string) error {
	if err := checkIfname(ifname); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return removeLinkPins(filepath.Join(d.opts.PinRoot, linksDir, ifname))
}

// removeLinkPins detaches and unpins every link in dir, then removes dir.
func removeLinkPins(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list link pins: %w", err)
	}
	var errs []error
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		l, err := link.LoadPinnedLink(path, nil)
		if err != nil {
			// Not a link (or unreadable): still remove the file.
			if err := os.Remove(path); err != nil {
				errs = append(errs, fmt.Errorf("remove %s: %w", path, err))
			}
			continue
		}
		// Unpinned and closed, the link has no references left and the
		// kernel detaches the program.
		if err := l.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin %s: %w", path, err))
		}
		_ = l.Close()
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("remove %s: %w", dir, err))
	}
	return errors.Join(errs...)
}

// GC removes what belongs to interfaces that no longer exist or are not in
// valid (the underlay and every live pod's host-side veth, as names in the
// calling thread's netns): their link pins, their pod_ifaces entries and the
// local endpoints pointing at them. It keeps going on errors and returns
// them all.
func (d *Datapath) GC(valid []string) error {
	keepName := make(map[string]int, len(valid))
	keepIdx := make(map[uint32]bool, len(valid))
	for _, name := range valid {
		iface, err := net.InterfaceByName(name)
		if err != nil {
			continue // gone: everything of it is stale
		}
		keepName[name] = iface.Index
		keepIdx[uint32(iface.Index)] = true
	}

	var errs []error
	d.mu.Lock()
	root := filepath.Join(d.opts.PinRoot, linksDir)
	entries, err := os.ReadDir(root)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("list link pins: %w", err))
	}
	for _, e := range entries {
		dir := filepath.Join(root, e.Name())
		ifindex, ok := keepName[e.Name()]
		if !ok {
			if err := removeLinkPins(dir); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		errs = append(errs, removeStalePins(dir, ifindex)...)
	}
	d.mu.Unlock()

	var staleIfaces []uint32
	var k uint32
	var pv mizarPodIface
	it := d.objs.PodIfaces.Iterate()
	for it.Next(&k, &pv) {
		if !keepIdx[k] {
			staleIfaces = append(staleIfaces, k)
		}
	}
	if err := it.Err(); err != nil {
		errs = append(errs, fmt.Errorf("list pod interfaces: %w", err))
	}
	for _, k := range staleIfaces {
		if err := deleteKey(d.objs.PodIfaces, k, "pod interface"); err != nil {
			errs = append(errs, err)
		}
	}

	var staleEps []mizarEndpointKey
	var ek mizarEndpointKey
	var ev mizarEndpoint
	eit := d.objs.Endpoints.Iterate()
	for eit.Next(&ek, &ev) {
		if ev.Ifindex != 0 && !keepIdx[ev.Ifindex] {
			staleEps = append(staleEps, ek)
		}
	}
	if err := eit.Err(); err != nil {
		errs = append(errs, fmt.Errorf("list endpoints: %w", err))
	}
	for i := range staleEps {
		if err := deleteKey(d.objs.Endpoints, &staleEps[i], "endpoint"); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeStalePins drops the pins in dir whose link is defunct or attached to
// a device other than ifindex (the name was reused).
func removeStalePins(dir string, ifindex int) []error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return []error{fmt.Errorf("list link pins: %w", err)}
	}
	var errs []error
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		l, err := link.LoadPinnedLink(path, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("open pinned link %s: %w", path, err))
			continue
		}
		if idx, ok := linkIfindex(l); !ok || idx != ifindex {
			if err := l.Unpin(); err != nil {
				errs = append(errs, fmt.Errorf("unpin stale link %s: %w", path, err))
			}
		}
		_ = l.Close()
	}
	return errs
}

func checkIfname(name string) error {
	if name == "" || len(name) > maxIfnameBytes || name == "." || name == ".." ||
		strings.ContainsAny(name, "/: \t\n") {
		return fmt.Errorf("invalid interface name %q", name)
	}
	return nil
}

// AttachedLink is a link pinned by this datapath.
type AttachedLink struct {
	Ifname  string // directory name under links/: the interface at attach time
	Program string // "underlay_xdp" or "pod_tcx"
	LinkID  uint32
	ProgID  uint32
	Ifindex int // 0 when the link is defunct (its device is gone)
}

// Links lists the pinned links, e.g. for the CNI CHECK ("is the program
// attached to this veth?") or for debugging.
func (d *Datapath) Links() ([]AttachedLink, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	root := filepath.Join(d.opts.PinRoot, linksDir)
	dirs, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list link pins: %w", err)
	}
	var out []AttachedLink
	for _, dir := range dirs {
		pins, err := os.ReadDir(filepath.Join(root, dir.Name()))
		if err != nil {
			return nil, fmt.Errorf("list link pins: %w", err)
		}
		for _, pin := range pins {
			path := filepath.Join(root, dir.Name(), pin.Name())
			l, err := link.LoadPinnedLink(path, nil)
			if err != nil {
				return nil, fmt.Errorf("open pinned link %s: %w", path, err)
			}
			info, err := l.Info()
			idx, _ := linkIfindex(l)
			_ = l.Close()
			if err != nil {
				return nil, fmt.Errorf("link info %s: %w", path, err)
			}
			out = append(out, AttachedLink{Ifname: dir.Name(), Program: pin.Name(),
				LinkID: uint32(info.ID), ProgID: uint32(info.Program), Ifindex: idx})
		}
	}
	return out, nil
}
