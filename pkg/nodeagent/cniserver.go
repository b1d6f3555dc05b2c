package nodeagent

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/cni"
	"mizar.dev/pkg/dataplane"
	"mizar.dev/pkg/generated/clientset/versioned"
	informers "mizar.dev/pkg/generated/informers/externalversions"
	listers "mizar.dev/pkg/generated/listers/networking/v1alpha1"
)

// PodDataplane is what the CNI server asks of the node's pod-side program.
// Calls are made from any thread, with a netlink handle in the host netns.
type PodDataplane interface {
	// AttachPod describes the pod behind the host-side veth hostIf and
	// attaches the pod-side program to it.
	AttachPod(host *netlink.Handle, hostIf string, p dataplane.PodInterface) error
	// AdoptPod attaches the current program to a pod an earlier run
	// attached (its description is kept in the pinned maps).
	AdoptPod(host *netlink.Handle, hostIf string) error
	// DetachPod undoes AttachPod; a missing attachment is not an error.
	DetachPod(host *netlink.Handle, hostIf string, ifindex int) error
	// PodAttached reports whether hostIf has the pod-side program attached.
	PodAttached(host *netlink.Handle, hostIf string) (bool, error)
	// SetHostAddrs names the node's own addresses: pods reach them through
	// the host stack, not the overlay.
	SetHostAddrs(ips []netip.Addr) error
}

// AttachmentLabel marks the endpoints the CNI server created with their
// attachment's hash, so DEL and GC find them without the pod's name.
const AttachmentLabel = "cni.mizar.dev/attachment"

// NetworkLabel marks them with their CNI network, so GC of one network (the
// runtime sends one GC per network) never removes another's attachments.
const NetworkLabel = "cni.mizar.dev/network"

// networkLabel is a network name as a label value: the name itself when it is
// one, else a hash of it.
func networkLabel(name string) string {
	if len(validation.IsValidLabelValue(name)) == 0 {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return "h-" + hex.EncodeToString(sum[:])[:32]
}

// CNIOptions configure the CNI server.
type CNIOptions struct {
	Client  versioned.Interface
	Droplet string
	Pods    PodDataplane
	// HostNetns is the host netns path ("" = the agent's own).
	HostNetns string
	// UnderlayMTU sizes the pods' interfaces (minus the Geneve overhead).
	UnderlayMTU int
	// WorkloadPods reads pods from the workload cluster for their placement
	// annotations (AnnotationVPC, AnnotationSubnet); nil: the conflist
	// alone places pods.
	WorkloadPods corev1client.PodsGetter
	// HostIP is the node's underlay address: the source of what the host
	// sends to its pods (kubelet probes).
	HostIP netip.Addr
	// Informers, when set, is the agent's factory whose subnet and VPC
	// informers the server reads (its owner starts it): one watch of each
	// per agent. Nil: the server runs its own.
	Informers informers.SharedInformerFactory
	// StateDir keeps one file per attachment: what DEL, CHECK and GC undo or
	// verify, written before anything is created.
	StateDir string
	// ProvisionTimeout bounds ADD's wait for Provisioned (default 30s).
	ProvisionTimeout time.Duration
	// Metrics, when set, counts and times every request.
	Metrics *CNIMetrics
	// Events, when set, posts a NetworkRefused Event on a workload pod
	// whose ADD failed (the workload cluster's recorder).
	Events record.EventRecorder
}

// CNIServer answers mizar-cni (see pkg/cni) for one droplet. ADDs of
// different attachments run in parallel; only calls for the same
// (container, interface) are serialised.
type CNIServer struct {
	o CNIOptions

	stop                      chan struct{}
	subnets                   listers.SubnetLister
	vpcs                      listers.VpcLister
	subnetsSynced, vpcsSynced func() bool
	endpoints                 cache.SharedIndexInformer // this droplet's

	waitMu  sync.Mutex
	waiters map[string]chan struct{} // "namespace/name" -> the ADD waiting for it

	mu    sync.Mutex
	locks map[string]*attachLock
}

type attachLock struct {
	sync.Mutex
	users int
}

// NewCNIServer checks the options and opens the host netns.
func NewCNIServer(o CNIOptions) (*CNIServer, error) {
	if o.Client == nil || o.Droplet == "" || o.Pods == nil || o.StateDir == "" || !o.HostIP.Is4() {
		return nil, errors.New("CNI server: a client, a droplet, a pod dataplane, a state directory and the host's IPv4 address are required")
	}
	if _, err := dataplane.PodMTU(o.UnderlayMTU); err != nil {
		return nil, fmt.Errorf("CNI server: %w", err)
	}
	if o.ProvisionTimeout == 0 {
		o.ProvisionTimeout = 30 * time.Second
	}
	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("CNI server: create state directory: %w", err)
	}
	f := o.Informers
	if f == nil {
		f = informers.NewSharedInformerFactory(o.Client, 10*time.Minute)
	}
	n := f.Networking().V1alpha1()
	s := &CNIServer{o: o, locks: map[string]*attachLock{}, stop: make(chan struct{}), waiters: map[string]chan struct{}{},
		subnets: n.Subnets().Lister(), vpcs: n.Vpcs().Lister(),
		subnetsSynced: n.Subnets().Informer().HasSynced, vpcsSynced: n.Vpcs().Informer().HasSynced}
	if o.Informers == nil {
		f.Start(s.stop)
	}
	onMe := informers.NewSharedInformerFactoryWithOptions(o.Client, 0, informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
		lo.FieldSelector = fields.OneTermEqualSelector("spec.droplet", o.Droplet).String()
	}))
	s.endpoints = onMe.Networking().V1alpha1().Endpoints().Informer()
	if _, err := s.endpoints.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: s.endpointChanged, UpdateFunc: func(_, cur any) { s.endpointChanged(cur) }, DeleteFunc: s.endpointChanged,
	}); err != nil {
		close(s.stop)
		return nil, fmt.Errorf("CNI server: %w", err)
	}
	onMe.Start(s.stop)
	if err := s.followHostAddrs(); err != nil {
		close(s.stop)
		return nil, fmt.Errorf("CNI server: %w", err)
	}
	return s, nil
}

// Close releases the server's resources.
func (s *CNIServer) Close() { close(s.stop) }

// hostHandle opens a netlink handle in the host netns for one request: a
// shared handle would serialise every ADD on its socket lock.
func (s *CNIServer) hostHandle() (*netlink.Handle, error) {
	h, err := handleAt(s.o.HostNetns)
	if err != nil {
		return nil, fmt.Errorf("netlink in the host netns: %w", err)
	}
	return h, nil
}

func handleAt(path string) (*netlink.Handle, error) {
	if path == "" {
		return netlink.NewHandle()
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", path, err)
	}
	defer ns.Close()
	return netlink.NewHandleAt(ns)
}

// attachment is the on-disk record of one (container, interface).
type attachment struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	Netns       string `json:"netns,omitempty"`
	Network     string `json:"network,omitempty"` // the conflist's name
	Namespace   string `json:"namespace"`
	Endpoint    string `json:"endpoint"`
	HostIf      string `json:"hostIf"`
	HostIfindex int    `json:"hostIfindex,omitempty"`
	// IP and PodMAC let another attachment of the same IP (another VPC)
	// take over the host route when this one goes.
	IP     string `json:"ip,omitempty"`
	PodMAC string `json:"podMAC,omitempty"`
}

// attachmentID keys everything of one attachment: never the pod's name, which
// a new sandbox reuses while the old one's DEL may still be on its way.
func attachmentID(containerID, ifname string) string {
	sum := sha256.Sum256([]byte(containerID + "/" + ifname))
	return hex.EncodeToString(sum[:])[:32]
}

// names derives the endpoint and host veth names from the attachment.
func names(id string) (endpoint, hostIf string) { return "cni-" + id, podIfPrefix + id[:13] }

// podIfPrefix starts every pod's host-side veth name (the host path's
// rules match it).
const podIfPrefix = "mz"

func (s *CNIServer) lock(id string) func() {
	s.mu.Lock()
	l := s.locks[id]
	if l == nil {
		l = &attachLock{}
		s.locks[id] = l
	}
	l.users++
	s.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		s.mu.Lock()
		if l.users--; l.users == 0 {
			delete(s.locks, id)
		}
		s.mu.Unlock()
	}
}

// withIP runs f holding ip's lock: the host route to an IP that pods of two
// VPCs share changes hands under it.
func (s *CNIServer) withIP(ip netip.Addr, f func() error) error {
	defer s.lock("ip/" + ip.String())()
	return f()
}

func (s *CNIServer) statePath(id string) string { return filepath.Join(s.o.StateDir, id+".json") }

func (s *CNIServer) readState(id string) (*attachment, error) {
	data, err := os.ReadFile(s.statePath(id))
	if err != nil {
		return nil, err
	}
	var a attachment
	if err := json.Unmarshal(data, &a); err != nil {
		return nil, fmt.Errorf("attachment state %s: %w", s.statePath(id), err)
	}
	return &a, nil
}

func (s *CNIServer) writeState(id string, a *attachment) error {
	data, err := json.Marshal(a)
	if err != nil {
		return err
	}
	tmp := s.statePath(id) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("write attachment state: %w", err)
	}
	if err := os.Rename(tmp, s.statePath(id)); err != nil {
		return fmt.Errorf("write attachment state: %w", err)
	}
	return nil
}

// handle runs one request; Handle (cniobserve.go) logs and counts it.
func (s *CNIServer) handle(ctx context.Context, r *cni.Request) (json.RawMessage, *types.Error) {
	switch r.Command {
	case cni.CmdAdd:
		return s.add(ctx, r)
	case cni.CmdDel:
		return nil, s.del(ctx, r)
	case cni.CmdCheck:
		return nil, s.check(ctx, r)
	case cni.CmdStatus:
		return nil, nil
	case cni.CmdGC:
		return nil, s.gc(ctx, r)
	}
	return nil, types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("mizar-nodeagent: unknown CNI command %q", r.Command), "")
}

func cniErr(code uint, msg string, err error) *types.Error {
	d := ""
	if err != nil {
		d = err.Error()
	}
	return types.NewError(code, msg, d)
}

func requireEnv(r *cni.Request, netnsToo bool) *types.Error {
	var missing []string
	if r.ContainerID == "" {
		missing = append(missing, "CNI_CONTAINERID")
	}
	if r.IfName == "" {
		missing = append(missing, "CNI_IFNAME")
	}
	if netnsToo && r.Netns == "" {
		missing = append(missing, "CNI_NETNS")
	}
	if len(missing) > 0 {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "mizar: required CNI variables are not set: "+strings.Join(missing, ", "), "")
	}
	return nil
}

// add implements ADD. Everything it makes is undone if a later step fails.
func (s *CNIServer) add(ctx context.Context, r *cni.Request) (_ json.RawMessage, cerr *types.Error) {
	if cerr := requireEnv(r, true); cerr != nil {
		return nil, cerr
	}
	conf, cerr := cni.ParseConf(r.Config)
	if cerr != nil {
		return nil, cerr
	}
	if cerr := conf.CheckPlacement(); cerr != nil {
		return nil, cerr
	}
	args, cerr := cni.ParseArgs(r.Args)
	if cerr != nil {
		return nil, cerr
	}
	namespace, pod := string(args.K8S_POD_NAMESPACE), string(args.K8S_POD_NAME)
	if namespace == "" {
		namespace = metav1.NamespaceDefault
	}
	id := attachmentID(r.ContainerID, r.IfName)
	defer s.lock(id)()
	epName, hostIf := names(id)

	api := s.o.Client.NetworkingV1alpha1()
	placed, cerr := s.place(ctx, conf, namespace, pod)
	if cerr != nil {
		return nil, cerr
	}
	subnet, vpc := placed.subnetObj, placed.vpcObj
	prefix, err := netip.ParsePrefix(subnet.Spec.CIDR)
	if err != nil {
		return nil, cniErr(cni.CodeAPI, "mizar: subnet "+subnet.Name+" has a bad cidr", err)
	}
	gw := prefix.Masked().Addr().Next()
	if subnet.Spec.Gateway != "" {
		if gw, err = netip.ParseAddr(subnet.Spec.Gateway); err != nil {
			return nil, cniErr(cni.CodeAPI, "mizar: subnet "+subnet.Name+" has a bad gateway", err)
		}
	}
	mtu, _ := dataplane.PodMTU(s.o.UnderlayMTU)
	if conf.MTU > mtu {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("mizar: network %q: \"mtu\": %d exceeds this node's largest pod MTU %d (underlay MTU %d minus %d bytes of Geneve)",
			conf.Name, conf.MTU, mtu, s.o.UnderlayMTU, dataplane.GeneveOverhead), "")
	}
	if conf.MTU != 0 {
		mtu = conf.MTU
	}

	podNS, err := netns.GetFromPath(r.Netns)
	if err != nil {
		return nil, cniErr(types.ErrInvalidNetNS, "mizar: cannot open the pod's netns "+r.Netns, err)
	}
	defer podNS.Close()
	podH, err := netlink.NewHandleAt(podNS)
	if err != nil {
		return nil, cniErr(types.ErrInvalidNetNS, "mizar: cannot open a netlink socket in "+r.Netns, err)
	}
	defer podH.Close()
	if _, err := podH.LinkByName(r.IfName); err == nil {
		return nil, cniErr(cni.CodeInterfaceExists, fmt.Sprintf("mizar: interface %s already exists in %s", r.IfName, r.Netns), nil)
	}

	host, err := s.hostHandle()
	if err != nil {
		return nil, cniErr(cni.CodeNetwork, "mizar-nodeagent: cannot reach the host netns", err)
	}
	defer host.Close()

	st := &attachment{ContainerID: r.ContainerID, IfName: r.IfName, Netns: r.Netns, Network: conf.Name, Namespace: namespace, Endpoint: epName, HostIf: hostIf}
	if err := s.writeState(id, st); err != nil {
		return nil, cniErr(types.ErrIOFailure, "mizar-nodeagent: recording the attachment failed", err)
	}
	defer func() {
		if cerr != nil {
			if err := s.teardown(context.WithoutCancel(ctx), id, st); err != nil {
				cerr.Details = strings.TrimPrefix(cerr.Details+"; cleaning up after the failed ADD: "+err.Error(), "; ")
			}
		}
	}()

	podMAC, hostMAC := randomMAC(), randomMAC()
	veth := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: hostIf, MTU: mtu, HardwareAddr: hostMAC},
		PeerName:         r.IfName,
		PeerHardwareAddr: podMAC,
		PeerMTU:          uint32(mtu),
		// The pod's end is created in its netns: moving a device between
		// namespaces waits for an RCU grace period under the rtnl lock, the
		// cost that makes other plugins' ADDs slow under load.
		PeerNamespace: netlink.NsFd(int(podNS)),
	}
	if err := host.LinkAdd(veth); err != nil {
		return nil, cniErr(cni.CodeNetwork, "mizar: creating the veth pair "+hostIf+"/"+r.IfName+" failed", err)
	}
	hl, err := host.LinkByName(hostIf)
	if err != nil {
		return nil, cniErr(cni.CodeNetwork, "mizar: finding the new veth "+hostIf, err)
	}
	st.HostIfindex = hl.Attrs().Index
	if err := s.writeState(id, st); err != nil {
		return nil, cniErr(types.ErrIOFailure, "mizar-nodeagent: recording the attachment failed", err)
	}

	// The endpoint only once its veth exists: the agent's host stream looks
	// the veth up when the endpoint arrives, and takes a missing one for a
	// pod already gone.
	type created struct {
		ep  *v1alpha1.Endpoint
		err error
	}
	cc := make(chan created, 1)
	go func() {
		ep, err := api.Endpoints(namespace).Create(ctx, &v1alpha1.Endpoint{
			ObjectMeta: metav1.ObjectMeta{Name: epName, Namespace: namespace, Labels: map[string]string{AttachmentLabel: id, NetworkLabel: networkLabel(conf.Name)}},
			Spec:       v1alpha1.EndpointSpec{Subnet: subnet.Name, Pod: pod, Droplet: s.o.Droplet, Interface: r.IfName, MAC: podMAC.String()},
		}, metav1.CreateOptions{FieldManager: fieldManager})
		cc <- created{ep, err}
	}()
	var cr *created
	waitCreated := func() created {
		if cr == nil {
			c := <-cc
			cr = &c
		}
		return *cr
	}
	// Runs before the rollback above: it must see the endpoint if one was made.
	defer waitCreated()

	c := waitCreated()
	ep, err := c.ep, c.err
	if err != nil {
		if apierrors.IsInvalid(err) && strings.Contains(err.Error(), "no free address") {
			return nil, cniErr(cni.CodeSubnetFull, fmt.Sprintf("mizar: subnet %s (%s) has no free address: add a subnet or delete pods", subnet.Name, subnet.Spec.CIDR), err)
		}
		return nil, cniErr(cni.CodeAPI, "mizar: creating endpoint "+namespace+"/"+epName+" failed", err)
	}
	ip, err := netip.ParseAddr(ep.Spec.IP)
	if err != nil {
		return nil, cniErr(cni.CodeAPI, "mizar: the endpoint came back without a valid IP", err)
	}
	addr := netip.PrefixFrom(ip, prefix.Bits())
	st.IP, st.PodMAC = ip.String(), podMAC.String()
	if err := s.writeState(id, st); err != nil {
		return nil, cniErr(types.ErrIOFailure, "mizar-nodeagent: recording the attachment failed", err)
	}

	// Inside the pod: address, up, default route through the gateway, and the
	// gateway's neighbour entry so the first packet needs no ARP round.
	pl, err := podH.LinkByName(r.IfName)
	if err != nil {
		return nil, cniErr(cni.CodeNetwork, "mizar: finding "+r.IfName+" in the pod", err)
	}
	if err := podH.AddrAdd(pl, &netlink.Addr{IPNet: ipnet(addr)}); err != nil {
		return nil, cniErr(cni.CodeNetwork, "mizar: setting "+addr.String()+" on "+r.IfName, err)
	}
	if err := podH.LinkSetUp(pl); err != nil {
		return nil, cniErr(cni.CodeNetwork, "mizar: bringing "+r.IfName+" up", err)
	}
	if err := podH.NeighSet(&netlink.Neigh{LinkIndex: pl.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
		IP: gw.AsSlice(), HardwareAddr: hostMAC}); err != nil {
		return nil, cniErr(cni.CodeNetwork, "mizar: setting the gateway's neighbour entry", err)
	}
	if err := podH.RouteAdd(&netlink.Route{LinkIndex: pl.Attrs().Index, Gw: gw.AsSlice(), Dst: ipnet(netip.MustParsePrefix("0.0.0.0/0"))}); err != nil {
		return nil, cniErr(cni.CodeNetwork, "mizar: adding the default route via "+gw.String(), err)
	}
	if err := host.LinkSetUp(hl); err != nil {
		return nil, cniErr(cni.CodeNetwork, "mizar: bringing "+hostIf+" up", err)
	}
	if err := s.o.Pods.AttachPod(host, hostIf, dataplane.PodInterface{Ifindex: st.HostIfindex, VNI: uint32(vpc.Spec.VNI), IP: ip, MAC: podMAC,
		Subnet: prefix.Masked(), GatewayIP: gw, GatewayMAC: hostMAC}); err != nil {
		return nil, cniErr(cni.CodeNetwork, "mizar: attaching the pod-side program to "+hostIf, err)
	}
	if err := dataplane.EnableGROInNetns(r.Netns, r.IfName); err != nil {
		return nil, cniErr(cni.CodeNetwork, "mizar: enabling GRO on the pod's "+r.IfName, err)
	}
	if err := s.withIP(ip, func() error { return s.addHostRoute(host, id, st.HostIfindex, ip, podMAC) }); err != nil {
		var taken *errAddressOnNode
		if errors.As(err, &taken) {
			klog.InfoS("Refusing a second pod with an address already on this node", "ip", ip, "endpoint", namespace+"/"+epName,
				"holder", taken.other.Namespace+"/"+taken.other.Endpoint)
			return nil, cniErr(cni.CodeAddressOnNode, fmt.Sprintf("mizar: %s: subnet %s (VPC %s) overlaps another VPC's on this node, "+
				"and the node could not tell the two pods apart: place the pod on another node", taken, subnet.Name, vpc.Name), nil)
		}
		return nil, cniErr(cni.CodeNetwork, "mizar: routing the host to the pod", err)
	}

	if err := s.waitProvisioned(ctx, ep); err != nil {
		return nil, err
	}

	idx := 1
	res := &types100.Result{
		CNIVersion: "1.1.0",
		Interfaces: []*types100.Interface{
			{Name: hostIf, Mac: hostMAC.String(), Mtu: mtu},
			{Name: r.IfName, Mac: podMAC.String(), Mtu: mtu, Sandbox: r.Netns},
		},
		IPs:    []*types100.IPConfig{{Interface: &idx, Address: *ipnet(addr), Gateway: gw.AsSlice()}},
		Routes: []*types.Route{{Dst: *ipnet(netip.MustParsePrefix("0.0.0.0/0")), GW: gw.AsSlice()}},
	}
	out, err := json.Marshal(res)
	if err != nil {
		return nil, cniErr(types.ErrInternal, "mizar-nodeagent: encoding the result", err)
	}
	return out, nil
}

// waitProvisioned waits until the endpoint's phase is Provisioned: only then
// do the host and the subnet's bouncers forward to it. It follows the one
// shared watch of this droplet's endpoints: a watch per ADD cost the server
// a watcher each, and 100 ADDs at once queued on them.
func (s *CNIServer) waitProvisioned(ctx context.Context, ep *v1alpha1.Endpoint) *types.Error {
	if ep.Status.Phase == v1alpha1.PhaseProvisioned {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.o.ProvisionTimeout)
	defer cancel()
	key := ep.Namespace + "/" + ep.Name
	changed := s.waitFor(key)
	defer s.stopWaiting(key)
	last, seen := ep, false
	for {
		obj, exists, err := s.endpoints.GetStore().GetByKey(key)
		if err != nil {
			return cniErr(cni.CodeAPI, "mizar: reading endpoint "+key+" from the watch", err)
		}
		if cur, ok := obj.(*v1alpha1.Endpoint); exists && ok && cur.UID == ep.UID {
			seen, last = true, cur
			switch {
			case cur.DeletionTimestamp != nil:
				return cniErr(cni.CodeNotProvisioned, "mizar: endpoint "+key+" was deleted while the pod was being added", nil)
			case cur.Status.Phase == v1alpha1.PhaseProvisioned:
				return nil
			case cur.Status.Phase == v1alpha1.PhaseFailed:
				return cniErr(cni.CodeNotProvisioned, "mizar: endpoint "+key+" failed: "+conditions(cur), nil)
			}
		} else if seen {
			return cniErr(cni.CodeNotProvisioned, "mizar: endpoint "+key+" was deleted while the pod was being added", nil)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return cniErr(cni.CodeNotProvisioned, fmt.Sprintf("mizar: endpoint %s was not Provisioned within %v (phase %q: %s); check that mizar-nodeagent runs on the droplet and the subnet's bouncers",
				key, s.o.ProvisionTimeout, last.Status.Phase, conditions(last)), nil)
		}
	}
}

// waitFor registers interest in changes of one endpoint ("namespace/name").
func (s *CNIServer) waitFor(key string) <-chan struct{} {
	c := make(chan struct{}, 1)
	s.waitMu.Lock()
	s.waiters[key] = c
	s.waitMu.Unlock()
	return c
}

func (s *CNIServer) stopWaiting(key string) {
	s.waitMu.Lock()
	delete(s.waiters, key)
	s.waitMu.Unlock()
}

// endpointChanged wakes the ADD waiting for obj, if any.
func (s *CNIServer) endpointChanged(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	ep, ok := obj.(*v1alpha1.Endpoint)
	if !ok {
		return
	}
	s.waitMu.Lock()
	c := s.waiters[ep.Namespace+"/"+ep.Name]
	s.waitMu.Unlock()
	if c != nil {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

func conditions(ep *v1alpha1.Endpoint) string {
	var out []string
	for _, c := range ep.Status.Conditions {
		out = append(out, fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message))
	}
	if len(out) == 0 {
		return "no conditions"
	}
	return strings.Join(out, "; ")
}

// del implements DEL: whatever of the attachment is left goes; all of it
// missing is success.
func (s *CNIServer) del(ctx context.Context, r *cni.Request) *types.Error {
	if cerr := requireEnv(r, false); cerr != nil {
		return cerr
	}
	id := attachmentID(r.ContainerID, r.IfName)
	defer s.lock(id)()
	st, err := s.readState(id)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return cniErr(types.ErrIOFailure, "mizar-nodeagent: reading the attachment's state", err)
	}
	if st == nil {
		ep, hostIf := names(id)
		st = &attachment{ContainerID: r.ContainerID, IfName: r.IfName, Endpoint: ep, HostIf: hostIf}
	}
	if err := s.teardown(ctx, id, st); err != nil {
		return cniErr(cni.CodeAPI, "mizar: deleting the pod's network failed", err)
	}
	return nil
}

// teardown removes the attachment's program, veth pair, endpoint and state.
func (s *CNIServer) teardown(ctx context.Context, id string, st *attachment) error {
	var errs []error
	host, err := s.hostHandle()
	if err != nil {
		return err
	}
	defer host.Close()
	ifindex := st.HostIfindex
	if l, err := host.LinkByName(st.HostIf); err == nil {
		ifindex = l.Attrs().Index
	}
	if ifindex > 0 {
		if err := s.o.Pods.DetachPod(host, st.HostIf, ifindex); err != nil {
			errs = append(errs, err)
		}
	}
	if l, err := host.LinkByName(st.HostIf); err == nil {
		if err := host.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete veth %s: %w", st.HostIf, err))
		}
	}
	// The veth took its host route along; a pod of the same IP gets it.
	if ip, err := netip.ParseAddr(st.IP); err == nil {
		if err := s.withIP(ip, func() error { return s.handOverHostRoute(host, id, ip) }); err != nil {
			errs = append(errs, err)
		}
	}
	if err := s.deleteEndpoint(ctx, id, st); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		if err := os.Remove(s.statePath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove attachment state: %w", err))
		}
	}
	return errors.Join(errs...)
}

// deleteEndpoint deletes the attachment's endpoint; without a recorded
// namespace it is found by its label.
func (s *CNIServer) deleteEndpoint(ctx context.Context, id string, st *attachment) error {
	api := s.o.Client.NetworkingV1alpha1()
	targets := []string{}
	if st.Namespace != "" {
		targets = append(targets, st.Namespace)
	} else {
		l, err := api.Endpoints(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
			LabelSelector: labels.SelectorFromSet(labels.Set{AttachmentLabel: id}).String(),
			FieldSelector: fields.OneTermEqualSelector("spec.droplet", s.o.Droplet).String()})
		if err != nil {
			return fmt.Errorf("find the endpoint of attachment %s: %w", id, err)
		}
		for _, ep := range l.Items {
			targets = append(targets, ep.Namespace)
		}
	}
	for _, ns := range targets {
		err := api.Endpoints(ns).Delete(ctx, st.Endpoint, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete endpoint %s/%s: %w", ns, st.Endpoint, err)
		}
	}
	return nil
}

// check implements CHECK: the recorded attachment is whole, matches
// prevResult, is Provisioned and has its program attached.
func (s *CNIServer) check(ctx context.Context, r *cni.Request) *types.Error {
	if cerr := requireEnv(r, true); cerr != nil {
		return cerr
	}
	conf, cerr := cni.ParseConf(r.Config)
	if cerr != nil {
		return cerr
	}
	if conf.RawPrevResult == nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "mizar: CHECK needs prevResult", "")
	}
	if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
		return cniErr(types.ErrDecodingFailure, "mizar: prevResult cannot be decoded", err)
	}
	prev, err := types100.GetResult(conf.PrevResult)
	if err != nil {
		return cniErr(types.ErrDecodingFailure, "mizar: prevResult cannot be converted", err)
	}
	id := attachmentID(r.ContainerID, r.IfName)
	defer s.lock(id)()
	st, err := s.readState(id)
	if err != nil {
		return cniErr(types.ErrUnknownContainer, "mizar-nodeagent knows no attachment "+r.ContainerID+"/"+r.IfName, err)
	}
	ep, err := s.o.Client.NetworkingV1alpha1().Endpoints(st.Namespace).Get(ctx, st.Endpoint, metav1.GetOptions{})
	if err != nil {
		return cniErr(cni.CodeAPI, "mizar: reading endpoint "+st.Namespace+"/"+st.Endpoint, err)
	}
	if ep.Status.Phase != v1alpha1.PhaseProvisioned {
		return cniErr(cni.CodeNotProvisioned, fmt.Sprintf("mizar: endpoint %s/%s is %q, not Provisioned: %s", ep.Namespace, ep.Name, ep.Status.Phase, conditions(ep)), nil)
	}
	host, err := s.hostHandle()
	if err != nil {
		return cniErr(cni.CodeNetwork, "mizar-nodeagent: cannot reach the host netns", err)
	}
	defer host.Close()
	if ok, err := s.o.Pods.PodAttached(host, st.HostIf); err != nil || !ok {
		return cniErr(cni.CodeNetwork, "mizar: the pod-side program is not attached to "+st.HostIf, err)
	}
	podNS, err := netns.GetFromPath(r.Netns)
	if err != nil {
		return cniErr(types.ErrInvalidNetNS, "mizar: cannot open the pod's netns "+r.Netns, err)
	}
	defer podNS.Close()
	podH, err := netlink.NewHandleAt(podNS)
	if err != nil {
		return cniErr(types.ErrInvalidNetNS, "mizar: cannot open a netlink socket in "+r.Netns, err)
	}
	defer podH.Close()
	pl, err := podH.LinkByName(r.IfName)
	if err != nil {
		return cniErr(cni.CodeNetwork, "mizar: "+r.IfName+" is missing from "+r.Netns, err)
	}
	addrs, err := podH.AddrList(pl, netlink.FAMILY_V4)
	if err != nil {
		return cniErr(cni.CodeNetwork, "mizar: listing "+r.IfName+"'s addresses", err)
	}
	for _, ipc := range prev.IPs {
		found := false
		for _, a := range addrs {
			found = found || a.IPNet.String() == ipc.Address.String()
		}
		if !found {
			return cniErr(cni.CodeNetwork, fmt.Sprintf("mizar: %s lacks %s from prevResult", r.IfName, ipc.Address.String()), nil)
		}
		if ipc.Address.IP.String() != ep.Spec.IP {
			return cniErr(cni.CodeNetwork, fmt.Sprintf("mizar: prevResult says %s, the endpoint has %s", ipc.Address.IP, ep.Spec.IP), nil)
		}
	}
	return nil
}

// gc implements GC for one network: every attachment of that network this
// agent recorded, and every endpoint of it on this droplet the CNI server
// made, that is not in cni.dev/valid-attachments goes. Attachments of other
// networks are not this GC's to judge. It keeps going past errors.
func (s *CNIServer) gc(ctx context.Context, r *cni.Request) *types.Error {
	conf, cerr := cni.ParseConf(r.Config)
	if cerr != nil {
		return cerr
	}
	valid := map[string]bool{}
	for _, a := range conf.ValidAttachments {
		valid[attachmentID(a.ContainerID, a.IfName)] = true
	}
	var errs []error
	entries, err := os.ReadDir(s.o.StateDir)
	if err != nil {
		return cniErr(types.ErrIOFailure, "mizar-nodeagent: reading the attachment state", err)
	}
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || valid[id] {
			continue
		}
		unlock := s.lock(id)
		st, err := s.readState(id)
		if err == nil && st.Network == conf.Name {
			err = s.teardown(ctx, id, st)
		}
		unlock()
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	l, err := s.o.Client.NetworkingV1alpha1().Endpoints(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(labels.Set{NetworkLabel: networkLabel(conf.Name)}).String() + "," + AttachmentLabel,
		FieldSelector: fields.OneTermEqualSelector("spec.droplet", s.o.Droplet).String()})
	if err != nil {
		errs = append(errs, fmt.Errorf("list this droplet's endpoints of network %q: %w", conf.Name, err))
	} else {
		for _, ep := range l.Items {
			id := ep.Labels[AttachmentLabel]
			if valid[id] {
				continue
			}
			if err := s.o.Client.NetworkingV1alpha1().Endpoints(ep.Namespace).Delete(ctx, ep.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("delete endpoint %s/%s: %w", ep.Namespace, ep.Name, err))
			}
		}
	}
	if len(errs) > 0 {
		return cniErr(cni.CodeAPI, "mizar: GC left some attachments behind", errors.Join(errs...))
	}
	return nil
}

// DrainDeleteQueue carries out the DELs the plugin queued while the agent was
// down.
func (s *CNIServer) DrainDeleteQueue(ctx context.Context, dir string) error {
	return cni.Drain(dir, func(r *cni.Request) error {
		if _, cerr := s.Handle(ctx, r); cerr != nil {
			return cerr
		}
		return nil
	})
}

func randomMAC() net.HardwareAddr {
	m := make(net.HardwareAddr, 6)
	_, _ = rand.Read(m)
	m[0] = m[0]&^1 | 2 // unicast, locally administered
	return m
}

func ipnet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// AdoptPods attaches the current pod program to every recorded attachment's
// veth, replacing what an earlier run attached (programs of another version,
// or maps it replaced): called at start.
func (s *CNIServer) AdoptPods() error {
	entries, err := os.ReadDir(s.o.StateDir)
	if err != nil {
		return fmt.Errorf("read the attachment state: %w", err)
	}
	host, err := s.hostHandle()
	if err != nil {
		return err
	}
	defer host.Close()
	var errs []error
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		unlock := s.lock(id) // a DEL of it may be running already
		if st, err := s.readState(id); err == nil && st.HostIfindex > 0 {
			if _, err := host.LinkByName(st.HostIf); err == nil { // else its pod went while no agent ran
				errs = append(errs, s.o.Pods.AdoptPod(host, st.HostIf))
			}
		}
		unlock()
	}
	return errors.Join(errs...)
}

// HostInterfaces lists the host-side veths of the attachments on record: the
// agent keeps their pins at start and lets the datapath GC the rest (links
// of pods deleted while no agent ran).
func (s *CNIServer) HostInterfaces() ([]string, error) {
	entries, err := os.ReadDir(s.o.StateDir)
	if err != nil {
		return nil, fmt.Errorf("read the attachment state: %w", err)
	}
	var out []string
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		if st, err := s.readState(id); err == nil {
			out = append(out, st.HostIf)
		}
	}
	return out, nil
}
