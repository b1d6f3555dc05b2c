// Package dataplane loads, attaches and programs mizar's eBPF fast path
// (bpf/mizar.c): an XDP program on the node's underlay interface that
// decapsulates Geneve for local pods and plays bouncer and divider, and a TC
// program (a cls_bpf filter, see AttachPod) on the host side of every pod's
// veth that answers ARP for the gateway, hands traffic to the node's own
// addresses to the host stack (SetHostAddrs), delivers same-host traffic and
// encapsulates the rest in Geneve.
//
// The underlay is not trusted: Geneve is accepted only from droplets
// (UpsertDroplet) with a good outer IPv4 checksum, and delivered or relayed
// only when its inner source is an endpoint of the VNI that the outer source
// may speak for: a relay of the VPC (SetRelays), or the endpoint's host as
// the endpoints map says or as a relay taught this host (Learned). Every
// refusal is counted by reason. Pods send only as what they are: their MAC,
// their IP, untagged. Hops without a MAC are reached through the kernel FIB,
// so droplets may sit on different L3 subnets.
//
// SetHostPath makes one VPC, the host VPC, the network of a Kubernetes
// cluster's pods: Services through kube-proxy and egress through the node,
// the node to its pods on every droplet through a host device (hostpath.go).
//
// A flow's first packet is decided from the hash and LPM maps; the programs
// keep that decision in small per-CPU caches (inlined array lookups, where a
// hash lookup is a chain of calls costing as much as the rest of a path).
// Every map write through this package bumps a generation that empties them
// all at once, so a change takes effect from the next packet, as before.
//
// All maps and link pins live under a pin root on bpffs (DefaultPinRoot in
// production, a private directory in tests), so a restarted agent calls Load
// and the Attach methods again and traffic keeps flowing: maps are reused
// (those of another layout, left by an earlier version, are replaced: see
// ReplacedMaps) and attached links and pod filters are updated to the new
// programs atomically.
//
// Interfaces are named and indexed in the network namespace of the calling
// thread (or of the netlink handle the *At methods take): the node agent
// calls Load, the Attach methods, Detach and GC from the host netns. Map
// methods work from anywhere. A Datapath is safe for
// concurrent use.
package dataplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"
)

// DefaultPinRoot is where a node agent keeps mizar's maps and links.
const DefaultPinRoot = "/sys/fs/bpf/mizar"

// XDPMode selects how the underlay program is attached.
type XDPMode int

const (
	// XDPDriver attaches in the driver (native) mode: the fast one, and the
	// only one where XDP_TX does not go through the qdisc layer.
	XDPDriver XDPMode = iota
	// XDPGeneric attaches in the generic (SKB) mode, for drivers without
	// native XDP. Works everywhere, costs an skb per packet.
	XDPGeneric
)

func (m XDPMode) String() string {
	switch m {
	case XDPDriver:
		return "driver"
	case XDPGeneric:
		return "generic"
	}
	return fmt.Sprintf("XDPMode(%d)", int(m))
}

// Options describe this host to the datapath. They are compiled into the
// programs as constants; changing them means Load again and re-attach.
type Options struct {
	// PinRoot is a directory on bpffs holding the maps and, under links/,
	// the pinned links. Empty means DefaultPinRoot.
	PinRoot string
	// UnderlayIfindex is the underlay interface in the host netns: the pod
	// program redirects encapsulated packets to it.
	UnderlayIfindex int
	// HostIP is this host's IPv4 address on the underlay: the outer source of
	// everything it sends, and the outer destination it accepts Geneve on.
	HostIP netip.Addr
	// HostMAC is the underlay interface's MAC, the outer source MAC.
	HostMAC net.HardwareAddr
	// XDPMode is how AttachUnderlay attaches (XDPDriver by default).
	XDPMode XDPMode
	// LearnLifetime is how long a learned direct path lives without being
	// refreshed (see Learned). 0 means DefaultLearnLifetime; negative turns
	// learning off: traffic the agent names no host for always goes
	// through a relay.
	LearnLifetime time.Duration
	// PodFloodRate is how many frames a second each pod may send to
	// broadcast or multicast destinations (Ethernet or IPv4, its subnet's
	// broadcast address included), in bursts of as many; mizar delivers
	// none of them, so the rest are dropped on the pod's host and counted
	// (drop_flood). 0 means DefaultPodFloodRate; negative means no limit.
	PodFloodRate int
	// NetworkPolicy compiles Kubernetes NetworkPolicy enforcement into the
	// programs (see ApplyPolicy). Off, the programs carry none of it.
	NetworkPolicy bool
	// UnderlayMTU is the underlay MTU the pods were sized from (PodMTU), if
	// known: packets that fit it need no bpf_check_mtu call. 0 means ask the
	// kernel for every packet that is not GSO.
	UnderlayMTU int
	// DropEventBurst is how many dropped packets a jiffy each CPU reports
	// as drop events (ReadDropEvents); the rest are only counted. 0 means
	// DefaultDropEventBurst; negative turns the reports off.
	DropEventBurst int
	// Services compiles the Service translation into the pod program (see
	// UpsertService). Off, the programs carry none of it and Services are
	// left to kube-proxy.
	Services bool
}

// DefaultLearnLifetime is Options.LearnLifetime's default. Long flows refresh
// their paths every half lifetime; an endpoint that moved without the agent
// telling this host (ForgetLearned) is re-bounced until its entry expires.
const DefaultLearnLifetime = 30 * time.Second

// DefaultPodFloodRate is Options.PodFloodRate's default: enough for the
// ARP-less chatter of a booting pod (mDNS, SSDP, DHCP), not for a storm.
const DefaultPodFloodRate = 100

// Datapath is a loaded set of mizar programs and its pinned maps.
type Datapath struct {
	opts Options
	objs mizarObjects

	// Counter names by index, read from the object's BTF so they never
	// drift from the C enums.
	underlayNames []string
	podNames      []string

	// replaced names the pinned maps Load found with another layout and
	// replaced by empty ones.
	replaced []string

	npNames []string

	mu       sync.Mutex  // serialises link pin changes
	policyMu sync.Mutex  // serialises ApplyPolicy
	npHave   *policyMaps // the policy maps as ApplyPolicy wrote them last
	genMu    sync.Mutex  // serialises generation bumps (invalidate)

	svcMu sync.Mutex // serialises Service programming; guards svcs
	svcs  svcState
}

// Load loads the programs with this host's identity and opens (or creates)
// the pinned maps under opts.PinRoot. Nothing is attached yet.
func Load(opts Options) (*Datapath, error) {
	if opts.PinRoot == "" {
		opts.PinRoot = DefaultPinRoot
	}
	if err := opts.validate(); err != nil {
		return nil, fmt.Errorf("dataplane options: %w", err)
	}
	if err := os.MkdirAll(opts.PinRoot, 0o700); err != nil {
		return nil, fmt.Errorf("create pin root: %w", err)
	}
	if err := requireBPFFS(opts.PinRoot); err != nil {
		return nil, err
	}

	spec, err := loadMizar()
	if err != nil {
		return nil, fmt.Errorf("parse embedded BPF object: %w", err)
	}
	host := mizarHostConfig{
		Ip:              opts.HostIP.Unmap().As4(),
		UnderlayIfindex: uint32(opts.UnderlayIfindex),
		Mtu:             uint32(max(opts.UnderlayMTU, 0)),
	}
	switch {
	case opts.LearnLifetime == 0:
		host.LearnNs = uint64(DefaultLearnLifetime)
	case opts.LearnLifetime > 0:
		host.LearnNs = uint64(opts.LearnLifetime)
	}
	copy(host.Mac[:], opts.HostMAC)
	if err := spec.Variables[mizarVarHost].Set(host); err != nil {
		return nil, fmt.Errorf("set host constants: %w", err)
	}
	flood := uint32(DefaultPodFloodRate)
	switch {
	case opts.PodFloodRate > 0:
		flood = uint32(min(opts.PodFloodRate, 1_000_000_000))
	case opts.PodFloodRate < 0:
		flood = 0
	}
	if err := spec.Variables[mizarVarFloodRate].Set(flood); err != nil {
		return nil, fmt.Errorf("set the pod flood rate: %w", err)
	}

	burst := uint32(DefaultDropEventBurst)
	switch {
	case opts.DropEventBurst > 0:
		burst = uint32(min(opts.DropEventBurst, 1<<16))
	case opts.DropEventBurst < 0:
		burst = 0
	}
	if err := spec.Variables[mizarVarDropEvBurst].Set(burst); err != nil {
		return nil, fmt.Errorf("set the drop event budget: %w", err)
	}

	if err := setPolicyConstants(spec, opts.NetworkPolicy); err != nil {
		return nil, err
	}
	svcOn := uint32(0)
	if opts.Services {
		svcOn = 1
	}
	if err := spec.Variables[mizarVarSvcEnabled].Set(svcOn); err != nil {
		return nil, fmt.Errorf("set the Services switch: %w", err)
	}
	if !opts.Services {
		// Compiled out: the Service maps (a preallocated connection table
		// and Maglev array of tens of MB) shrink to one entry. Turning
		// Services on later replaces their pins (another size).
		for _, name := range []string{mizarMapSvcCt, mizarMapSvcMaglev, mizarMapSvcAffinities, mizarMapSvcBackends, mizarMapSvcFrontends} {
			spec.Maps[name].MaxEntries = 1
		}
	}

	d := &Datapath{opts: opts}
	if d.npNames, err = enumNames(spec, "np_counter", "NP_"); err != nil {
		return nil, err
	}
	if d.underlayNames, err = enumNames(spec, "underlay_counter", "UL_"); err != nil {
		return nil, err
	}
	if d.podNames, err = enumNames(spec, "pod_counter", "POD_"); err != nil {
		return nil, err
	}

	collOpts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: opts.PinRoot}}
	err = spec.LoadAndAssign(&d.objs, collOpts)
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		// Pins of an earlier mizar with another layout: replace what the
		// agent rebuilds anyway, then load again.
		if d.replaced, err = replaceIncompatiblePins(spec, opts.PinRoot); err == nil {
			err = spec.LoadAndAssign(&d.objs, collOpts)
		}
	}
	if err != nil {
		var ve *ebpf.VerifierError
		switch {
		case errors.As(err, &ve):
			return nil, fmt.Errorf("load mizar programs: verifier: %+v", ve)
		case errors.Is(err, ebpf.ErrMapIncompatible):
			return nil, fmt.Errorf("load mizar maps: a map pinned under %s has another layout "+
				"(left by another mizar version?); remove it with Purge or migrate it: %w", opts.PinRoot, err)
		default:
			return nil, fmt.Errorf("load mizar objects (pin root %s): %w", opts.PinRoot, err)
		}
	}
	return d, nil
}

func (o *Options) validate() error {
	if !filepath.IsAbs(o.PinRoot) {
		return fmt.Errorf("pin root %q is not an absolute path", o.PinRoot)
	}
	if o.UnderlayIfindex <= 0 {
		return fmt.Errorf("underlay ifindex %d: must be > 0", o.UnderlayIfindex)
	}
	if _, err := ipv4("host IP", o.HostIP); err != nil {
		return err
	}
	if _, err := mac("host MAC", o.HostMAC); err != nil {
		return err
	}
	if o.LearnLifetime > 0 && o.LearnLifetime < time.Second {
		// The introduction delay and refresh at half the lifetime need room.
		return fmt.Errorf("learn lifetime %v: at least 1s (or negative to turn learning off)", o.LearnLifetime)
	}
	if o.XDPMode != XDPDriver && o.XDPMode != XDPGeneric {
		return fmt.Errorf("unknown XDP mode %d", int(o.XDPMode))
	}
	return nil
}

// keptAcrossLayouts are the maps whose contents nothing rebuilds (the CNI
// server writes a pod's entry once, at ADD): a pin of another layout is an
// error, not replaced.
var keptAcrossLayouts = map[string]bool{mizarMapPodIfaces: true}

// replaceIncompatiblePins removes the pins under root whose map differs
// from spec (an earlier mizar's layout), so the next load creates them
// afresh. The agent refills them (endpoints, topology, host addresses from
// the API; counters and learned paths start over). Programs still attached
// keep their old maps until they are updated to the new programs.
func replaceIncompatiblePins(spec *ebpf.CollectionSpec, root string) ([]string, error) {
	var replaced []string
	for name, ms := range spec.Maps {
		if ms.Pinning != ebpf.PinByName {
			continue
		}
		path := filepath.Join(root, name)
		m, err := ebpf.LoadPinnedMap(path, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return replaced, fmt.Errorf("open pinned map %s: %w", path, err)
		}
		incompatible := ms.Compatible(m)
		_ = m.Close()
		if incompatible == nil {
			continue
		}
		if keptAcrossLayouts[name] {
			return replaced, fmt.Errorf("load mizar maps: %s has another layout (left by another mizar version?) "+
				"and its contents cannot be rebuilt; remove it with Purge (pods must be re-added): %w", path, incompatible)
		}
		if err := os.Remove(path); err != nil {
			return replaced, fmt.Errorf("replace pinned map %s of another layout: %w", path, err)
		}
		replaced = append(replaced, name)
	}
	slices.Sort(replaced)
	return replaced, nil
}

// ReplacedMaps names the pinned maps Load found with another layout (an
// earlier mizar's) and replaced by empty ones; nil on a compatible restart.
func (d *Datapath) ReplacedMaps() []string { return d.replaced }

// PinRoot returns the directory holding this datapath's pins.
func (d *Datapath) PinRoot() string { return d.opts.PinRoot }

// UnderlayProgram and PodProgram expose the loaded programs, for tests and
// benchmarks that run them through BPF_PROG_TEST_RUN.
func (d *Datapath) UnderlayProgram() *ebpf.Program { return d.objs.MizarUnderlay }

// PodProgram returns the loaded pod-side program; see UnderlayProgram.
func (d *Datapath) PodProgram() *ebpf.Program { return d.objs.MizarPod }

// Close releases this process's handles. Pinned maps and links stay, so the
// attached programs keep running; use Detach or Purge to remove them.
func (d *Datapath) Close() error {
	if err := d.objs.Close(); err != nil {
		return fmt.Errorf("close mizar objects: %w", err)
	}
	return nil
}

// Purge detaches every link pinned under pinRoot and removes the pin root
// with its maps: for uninstall and for tests. A missing pinRoot is not an
// error; a directory that is not on bpffs is refused.
func Purge(pinRoot string) error {
	if _, err := os.Stat(pinRoot); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := requireBPFFS(pinRoot); err != nil {
		return err
	}
	var errs []error
	ifaces, err := os.ReadDir(filepath.Join(pinRoot, linksDir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("list link pins: %w", err))
	}
	for _, e := range ifaces {
		if err := removeLinkPins(filepath.Join(pinRoot, linksDir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(pinRoot); err != nil {
		errs = append(errs, fmt.Errorf("remove pin root: %w", err))
	}
	return errors.Join(errs...)
}

// MountBPFFS mounts bpffs at dir (normally /sys/fs/bpf) unless one is
// already there. Most distributions mount it at boot; the agent calls this at
// start for hosts that do not. The mount is shared by every process on the
// host and left in place.
func MountBPFFS(dir string) error {
	if requireBPFFS(dir) == nil {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w", dir, err)
	}
	return nil
}

// requireBPFFS refuses pin roots that are not on bpffs: pinning would fail
// later with a less helpful error, and Purge must never RemoveAll elsewhere.
func requireBPFFS(path string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", path, err)
	}
	if st.Type != unix.BPF_FS_MAGIC {
		return fmt.Errorf("%s is not on bpffs (mount -t bpf bpf /sys/fs/bpf)", path)
	}
	return nil
}

// enumNames maps a C counter enum to lower-case names without the prefix,
// indexed by value, leaving out the trailing *_MAX.
func enumNames(spec *ebpf.CollectionSpec, typ, prefix string) ([]string, error) {
	var e *btf.Enum
	if err := spec.Types.TypeByName(typ, &e); err != nil {
		return nil, fmt.Errorf("find enum %s in BTF: %w", typ, err)
	}
	names := make([]string, 0, len(e.Values))
	for _, v := range e.Values {
		if v.Name == prefix+"MAX" {
			continue
		}
		if v.Value != uint64(len(names)) {
			return nil, fmt.Errorf("enum %s: %s = %d is not dense", typ, v.Name, v.Value)
		}
		names = append(names, strings.ToLower(strings.TrimPrefix(v.Name, prefix)))
	}
	return names, nil
}
