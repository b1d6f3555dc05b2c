package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/vishvananda/netlink"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"mizar.dev/pkg/agentapi"
	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/cni"
	"mizar.dev/pkg/dataplane"
	"mizar.dev/pkg/generated/clientset/versioned"
)

// NodeOptions are mizar-nodeagent's flags.
type NodeOptions struct {
	Kubeconfig         string
	WorkloadKubeconfig string
	KubeAPIQPS         float32
	KubeAPIBurst       int
	Droplet            string
	NodeName           string
	Underlay           string
	HostIP             string
	HostMAC            string
	PinRoot            string
	XDPGeneric         bool
	CNISocket          string
	DeleteQueue        string
	StateDir           string
	HealthAddr         string
	HostNetns          string
	HostVPC            string
	// NetworkPolicy enforces the workload cluster's NetworkPolicies in the
	// dataplane (netpol.go).
	NetworkPolicy bool
	// Services is who translates the workload cluster's Services:
	// ServicesKubeProxy (the default; the programs carry no Service code)
	// or ServicesBPF (services.go).
	Services         string
	ProvisionTimeout time.Duration
	AckInterval      time.Duration
	// CNIConflist is the conflist to install into CNIConfDir as
	// CNIConflistName once this node's Droplet is Provisioned (empty: none).
	CNIConflist     string
	CNIConfDir      string
	CNIConflistName string
	// CNIBinDir is where install-cni put the plugin (removed on uninstall).
	CNIBinDir string
	// DaemonSet (namespace/name) is the agent's own: when it is deleted, the
	// agent removes the node's mizar state as it stops.
	DaemonSet string
	// CheckFlags validates the flags and returns without running.
	CheckFlags bool
	// Encryption is "" (plain Geneve on the underlay) or
	// EncryptionWireGuard (wireguard.go); WireGuardAddress is then this
	// droplet's address on the encrypted underlay, WireGuardPort where
	// WireGuard listens on the physical one.
	Encryption       string
	WireGuardAddress string
	WireGuardPort    int
	// DropEventBurst is dataplane.Options.DropEventBurst: drop events a
	// jiffy per CPU (0: the default, negative: none).
	DropEventBurst int
	// HeartbeatNamespace is where the agent renews its heartbeat Lease in
	// the workload cluster (heartbeat.go); empty: no heartbeat.
	HeartbeatNamespace string
	// DebugAuth guards the debug endpoints of HealthAddr (debugauth.go)
	// through the workload cluster's API; off, they are open to whoever
	// reaches the address.
	DebugAuth bool
}

// NewNodeOptions returns the defaults.
func NewNodeOptions() *NodeOptions {
	node := os.Getenv("NODE_NAME")
	if node == "" {
		node, _ = os.Hostname()
	}
	return &NodeOptions{NodeName: node, CNIConflistName: ConflistName, CNIConfDir: "/etc/cni/net.d", CNIBinDir: "/opt/cni/bin", PinRoot: dataplane.DefaultPinRoot, CNISocket: cni.DefaultSocket,
		DeleteQueue: cni.DefaultDeleteQueue, StateDir: "/var/lib/mizar/cni", HealthAddr: "127.0.0.1:9095", ProvisionTimeout: 30 * time.Second,
		KubeAPIQPS: 200, KubeAPIBurst: 400, AckInterval: DefaultAckInterval, WireGuardPort: DefaultWireGuardPort,
		HeartbeatNamespace: os.Getenv("POD_NAMESPACE"), Services: ServicesKubeProxy}
}

// AddFlags registers the options.
func (o *NodeOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig of this droplet's identity at mizar-apiserver (mizar-apiserver droplet-kubeconfig); "+
		"empty: in-cluster, through kube-apiserver's APIService with the pod's ServiceAccount token, which also reads the pods' annotations")
	fs.StringVar(&o.WorkloadKubeconfig, "workload-kubeconfig", o.WorkloadKubeconfig, "kubeconfig of the Kubernetes cluster whose pods run here, to read their "+
		AnnotationVPC+" and "+AnnotationSubnet+" annotations (empty with --kubeconfig: the conflist alone places pods; empty in-cluster: the pod's own cluster)")
	fs.Float32Var(&o.KubeAPIQPS, "kube-api-qps", o.KubeAPIQPS, "queries per second to each API server (client-go's default of 5 would hold back a burst of pod ADDs)")
	fs.IntVar(&o.KubeAPIBurst, "kube-api-burst", o.KubeAPIBurst, "burst of queries to each API server")
	fs.StringVar(&o.NodeName, "node-name", o.NodeName, "Kubernetes node this droplet runs on (default $NODE_NAME, else the host name)")
	fs.StringVar(&o.NodeName, "node", o.NodeName, "Kubernetes node this droplet runs on")
	_ = fs.MarkDeprecated("node", "use --node-name")
	fs.StringVar(&o.Droplet, "droplet", o.Droplet, "name of this droplet (default: --node-name; in-cluster it must be the node's name, which the ServiceAccount token binds the agent to)")
	fs.StringVar(&o.Underlay, "underlay", o.Underlay, "underlay interface (default: the default route's)")
	fs.StringVar(&o.HostIP, "host-ip", o.HostIP, "underlay IPv4 address with prefix, e.g. 192.168.1.5/24 (default: the underlay's first)")
	fs.StringVar(&o.HostMAC, "host-mac", o.HostMAC, "underlay MAC (default: the underlay's)")
	fs.BoolVar(&o.XDPGeneric, "xdp-generic", o.XDPGeneric, "attach the underlay program in generic (SKB) mode, for drivers without native XDP")
	fs.StringVar(&o.HealthAddr, "health-addr", o.HealthAddr, "address serving /healthz and /metrics (empty: off)")
	fs.StringVar(&o.HostVPC, "host-vpc", o.HostVPC, "VPC whose pods get Kubernetes networking through the node: Services via kube-proxy, egress "+
		"masqueraded to the node, the node to its pods on every node (the cluster's default VPC for pods; empty: none, and an earlier run's host path is removed)")
	fs.BoolVar(&o.NetworkPolicy, "network-policy", o.NetworkPolicy, "enforce the workload cluster's NetworkPolicies (networking.k8s.io/v1) in the BPF programs: "+
		"the agent watches NetworkPolicies, Pods and Namespaces; pods without a "+AnnotationVPC+"/"+AnnotationSubnet+" annotation are in the VPC of --cni-conflist's "+
		"subnet, else of --host-vpc. Off: the programs carry no policy code. Service traffic reaches pods from the node's address (SNAT), so policies see the node, not the client pod")
	fs.StringVar(&o.Services, "services", o.Services, "who translates the workload cluster's ClusterIP Services for pods: "+ServicesKubeProxy+
		" (kube-proxy, which must then run) or "+ServicesBPF+" (the pod program, from the agent's watch of Services and EndpointSlices; "+
		"TCP and UDP ClusterIPs only so far: NodePort, externalIPs and host-network clients still need kube-proxy)")
	fs.DurationVar(&o.ProvisionTimeout, "provision-timeout", o.ProvisionTimeout, "how long a CNI ADD waits for its endpoint to be Provisioned")
	fs.StringVar(&o.CNIConflist, "cni-conflist", o.CNIConflist, "conflist to install into --cni-conf-dir once this node's Droplet is Provisioned (kubelet turns the node Ready when it appears); empty: none")
	fs.StringVar(&o.DaemonSet, "daemonset", o.DaemonSet, "the agent's own DaemonSet, namespace/name (a bare name: in $POD_NAMESPACE); when it is deleted, "+
		"the agent removes the conflist, plugin, BPF pins and state as it stops. Empty: never (restarts and upgrades keep everything either way)")
	fs.BoolVar(&o.CheckFlags, "check-flags", false, "validate the flags and exit 0 if they are valid, without touching the node")
	fs.DurationVar(&o.AckInterval, "ack-interval", o.AckInterval, "least time between two acknowledgement (watermark) writes of one watch stream; what is applied meanwhile is acknowledged together")
	fs.StringVar(&o.Encryption, "encryption", o.Encryption, "underlay encryption: empty (plain Geneve; trust is the droplets' addresses and, on one L2 segment, "+
		"their MACs) or "+EncryptionWireGuard+" (droplets talk over WireGuard, userspace wireguard-go over a TAP; needs --wireguard-address; every node of the cluster must use it; SIGHUP gives the node a new key, published on its Droplet)")
	fs.StringVar(&o.WireGuardAddress, "wireguard-address", o.WireGuardAddress, "with --encryption="+EncryptionWireGuard+": this droplet's address with prefix on the encrypted underlay "+
		"(e.g. 100.96.0.5/16, one prefix for all droplets, not the physical network's); it becomes the Droplet's address. A bare prefix "+
		"(100.96.0.0/16, as the chart passes it) takes the host part of the node's physical address (172.18.0.5 -> 100.96.0.5)")
	fs.IntVar(&o.WireGuardPort, "wireguard-port", o.WireGuardPort, "with --encryption="+EncryptionWireGuard+": WireGuard's UDP port on the physical underlay")
	fs.IntVar(&o.DropEventBurst, "drop-event-burst", o.DropEventBurst, fmt.Sprintf("dropped packets each CPU reports a jiffy as drop events "+
		"(logged, served at /drops); the rest are only counted (0: %d, negative: none)", dataplane.DefaultDropEventBurst))
	fs.StringVar(&o.HeartbeatNamespace, "heartbeat-namespace", o.HeartbeatNamespace, "namespace of the workload cluster where the agent renews its heartbeat Lease "+
		"(mizar-agent-<droplet>) every 10 s, which mizarctl status reads (default $POD_NAMESPACE; empty or no workload cluster: none)")
	fs.BoolVar(&o.DebugAuth, "debug-auth", o.DebugAuth, "authenticate (TokenReview) and authorize (SubjectAccessReview: verb get or post on the non-resource URL "+
		DebugPathPrefix+"/<path>) every request to --health-addr's debug endpoints ("+agentapi.PathDrops+", /trace/*, "+agentapi.PathState+", "+agentapi.PathProbe+", /policy) "+
		"through the workload cluster's API; /metrics and /healthz stay open. Off: anyone who reaches the address may read the node's maps and send probes")
	o.AddStateFlags(fs)
}

// AddStateFlags registers where mizar keeps its state on the node: the agent
// and uninstall-cni (which removes it) share them.
func (o *NodeOptions) AddStateFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.CNIConfDir, "cni-conf-dir", o.CNIConfDir, "the host's CNI configuration directory, as the agent sees it")
	fs.StringVar(&o.CNIConflistName, "cni-conflist-name", o.CNIConflistName, "file name of the installed conflist")
	fs.StringVar(&o.CNIBinDir, "cni-bin-dir", o.CNIBinDir, "the host's CNI plugin directory, as the agent sees it (the plugin is removed from it on uninstall)")
	fs.StringVar(&o.PinRoot, "pin-root", o.PinRoot, "bpffs directory for mizar's maps and links")
	fs.StringVar(&o.StateDir, "cni-state-dir", o.StateDir, "directory recording each pod attachment")
	fs.StringVar(&o.DeleteQueue, "cni-delete-queue", o.DeleteQueue, "directory where mizar-cni queues DELs while the agent is down; drained at start")
	fs.StringVar(&o.CNISocket, "cni-socket", o.CNISocket, "unix socket mizar-cni talks to (root only; its directory is removed on uninstall)")
	fs.StringVar(&o.HostNetns, "host-netns", o.HostNetns, "netns path of the host side (default: the agent's own; set for netns-based local clusters)")
}

// Underlay describes the host's underlay interface.
type Underlay struct {
	Name string
	// Kind is the link's kind ("veth", "device", ...).
	Kind   string
	Index  int
	HostIP netip.Prefix
	MAC    net.HardwareAddr
	MTU    int
}

// FindUnderlay fills what name/ip/mac leave empty from the default route's
// interface in the netns at nsPath ("" = the caller's).
func FindUnderlay(nsPath, name, ip, mac string) (*Underlay, error) {
	h, err := handleAt(nsPath)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	var l netlink.Link
	if name == "" {
		routes, err := h.RouteList(nil, netlink.FAMILY_V4)
		if err != nil {
			return nil, fmt.Errorf("list routes: %w", err)
		}
		for _, r := range routes {
			if r.Dst == nil || r.Dst.String() == "0.0.0.0/0" {
				if l, err = h.LinkByIndex(r.LinkIndex); err != nil {
					return nil, fmt.Errorf("default route's interface: %w", err)
				}
				break
			}
		}
		if l == nil {
			return nil, errors.New("no IPv4 default route to find the underlay interface from: set --underlay")
		}
	} else if l, err = h.LinkByName(name); err != nil {
		return nil, fmt.Errorf("underlay interface %s: %w", name, err)
	}
	u := &Underlay{Name: l.Attrs().Name, Kind: l.Type(), Index: l.Attrs().Index, MAC: l.Attrs().HardwareAddr, MTU: l.Attrs().MTU}
	if mac != "" {
		if u.MAC, err = net.ParseMAC(mac); err != nil {
			return nil, fmt.Errorf("--host-mac: %w", err)
		}
	}
	if ip != "" {
		if u.HostIP, err = netip.ParsePrefix(ip); err != nil {
			return nil, fmt.Errorf("--host-ip: want an address with its prefix length: %w", err)
		}
	} else {
		addrs, err := h.AddrList(l, netlink.FAMILY_V4)
		if err != nil || len(addrs) == 0 {
			return nil, fmt.Errorf("underlay %s has no IPv4 address (%v): set --host-ip", u.Name, err)
		}
		a, _ := netip.AddrFromSlice(addrs[0].IP.To4())
		ones, _ := addrs[0].Mask.Size()
		u.HostIP = netip.PrefixFrom(a, ones)
	}
	return u, nil
}

// Run starts the node agent: it loads the datapath (reusing the pins of an
// earlier run), registers the droplet and attaches the underlay program,
// drains queued DELs, and serves the CNI socket and /healthz, /metrics.
func (o *NodeOptions) Run(ctx context.Context) error {
	if err := o.Validate(); err != nil {
		return err
	}
	if o.CheckFlags {
		klog.InfoS("Flags are valid (--check-flags)")
		return nil
	}
	cfg, workloadCfg, err := o.clientConfigs()
	if err != nil {
		return err
	}
	client, err := versioned.NewForConfig(cfg)
	if err != nil {
		return err
	}
	var workloadPods corev1client.PodsGetter
	var workload kubernetes.Interface
	if workloadCfg != nil {
		if workload, err = kubernetes.NewForConfig(workloadCfg); err != nil {
			return fmt.Errorf("the workload cluster's client: %w", err)
		}
		workloadPods = workload.CoreV1()
	}
	var dsWatch *DaemonSetWatch
	if o.DaemonSet != "" {
		if workload == nil {
			return errors.New("--daemonset needs the cluster the DaemonSet lives in: run in-cluster or set --workload-kubeconfig")
		}
		ns, name, _ := ParseNamespacedName(o.DaemonSet, os.Getenv("POD_NAMESPACE"))
		dsWatch = WatchDaemonSet(ctx, workload, ns, name)
	}
	u, err := FindUnderlay(o.HostNetns, o.Underlay, o.HostIP, o.HostMAC)
	if err != nil {
		return err
	}
	if err := completeVethFrames(o.HostNetns, u, o.StateDir); err != nil {
		return err
	}
	var wg *dataplane.WireGuard
	var dropletAnnotations map[string]string
	if o.Encryption == EncryptionWireGuard {
		addr, err := wireGuardAddress(netip.MustParsePrefix(o.WireGuardAddress), u.HostIP.Addr()) // validated
		if err != nil {
			return err
		}
		if wg, dropletAnnotations, err = encryptedUnderlay(o.HostNetns, u, filepath.Join(o.StateDir, "wireguard.key"), o.WireGuardPort, addr); err != nil {
			return err
		}
		defer wg.Close()
		if u, err = FindUnderlay(o.HostNetns, WireGuardLink, addr.String(), ""); err != nil {
			return err
		}
	}
	if err := dataplane.MountBPFFS("/sys/fs/bpf"); err != nil {
		return err
	}
	mode := underlayXDPMode(u, o.XDPGeneric)
	dp, err := dataplane.Load(dataplane.Options{PinRoot: o.PinRoot, UnderlayIfindex: u.Index, HostIP: u.HostIP.Addr(), HostMAC: u.MAC, XDPMode: mode,
		UnderlayMTU: u.MTU, NetworkPolicy: o.NetworkPolicy, DropEventBurst: o.DropEventBurst, Services: o.Services == ServicesBPF})
	if err != nil {
		return err
	}
	uninstall := false
	defer func() {
		dp.Close()
		if uninstall {
			if err := o.Uninstall().Run(); err != nil {
				klog.ErrorS(err, "Removing the node's mizar state failed; run mizar-nodeagent uninstall-cni on the node")
			} else {
				klog.InfoS("Removed the node's mizar state (conflist, plugin, pins, CNI state)")
			}
		}
	}()
	podMTU, err := dataplane.PodMTU(u.MTU)
	if err != nil {
		return err
	}
	rdp := NewDatapath(DatapathOptions{Client: client, DP: dp, Droplet: o.Droplet, Underlay: u.Name, HostIP: u.HostIP, HostNetns: o.HostNetns,
		HostVPC: o.HostVPC, PodMTU: podMTU, WireGuard: wg})
	agent, err := New(Options{Client: client, Dataplane: rdp, AckInterval: o.AckInterval, Droplet: &v1alpha1.Droplet{ObjectMeta: metav1.ObjectMeta{Name: o.Droplet, Annotations: dropletAnnotations},
		Spec: v1alpha1.DropletSpec{Node: o.NodeName, IP: u.HostIP.Addr().String(), MAC: u.MAC.String(), Interface: u.Name}},
		OnProvisioned: o.installConflist})
	if err != nil {
		return err
	}
	reg := newRegistry()
	events, stopEvents := workloadEvents(workload, o.NodeName)
	defer stopEvents()
	srv, err := NewCNIServer(CNIOptions{Client: client, Droplet: o.Droplet, Pods: rdp.Pods(), HostNetns: o.HostNetns,
		UnderlayMTU: u.MTU, HostIP: u.HostIP.Addr(), Informers: rdp.Informers(), WorkloadPods: workloadPods, StateDir: o.StateDir, ProvisionTimeout: o.ProvisionTimeout,
		Metrics: NewCNIMetrics(reg), Events: events})
	if err != nil {
		return err
	}
	defer srv.Close()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 5)
	go func() { errc <- agent.Run(ctx) }()
	if wg != nil {
		go rotateOnSIGHUP(ctx, client, o.Droplet, wg, filepath.Join(o.StateDir, "wireguard.key"))
	}
	var policy *PolicyController
	if o.NetworkPolicy {
		if workload == nil {
			return errors.New("--network-policy needs the workload cluster: run in-cluster or set --workload-kubeconfig")
		}
		vpc, subnet, err := defaultPlacement(o.CNIConflist, o.HostVPC)
		if err != nil {
			return err
		}
		n := rdp.Informers().Networking().V1alpha1()
		policy = NewPolicyController(PolicyOptions{Workload: workload, VPCs: n.Vpcs().Lister(), Subnets: n.Subnets().Lister(),
			Synced:     []cache.InformerSynced{n.Vpcs().Informer().HasSynced, n.Subnets().Informer().HasSynced},
			DefaultVPC: vpc, DefaultSubnet: subnet, DP: dp, NodeName: o.NodeName})
		go func() { errc <- policy.Run(ctx) }()
	}

	if o.Services == ServicesBPF {
		if workload == nil {
			return errors.New("--services=" + ServicesBPF + " needs the workload cluster: run in-cluster or set --workload-kubeconfig")
		}
		sc := NewServiceController(ServiceOptions{Workload: workload, DP: dp, NodeName: o.NodeName})
		go func() { errc <- sc.Run(ctx) }()
	}

	ln, err := cni.Listen(o.CNISocket)
	if err != nil {
		return err
	}
	m := newMetrics(reg, metricSources{dp: dp, occupancy: rdp.Occupancy, events: agent.EndpointEvents,
		underlay: func() (dataplane.LinkDrops, error) { return rdp.Pods().underlayDrops(u.Index) }})
	if policy != nil {
		reg.MustRegister(&policyMetrics{dp: dp, c: policy})
	}
	if workload != nil && o.HeartbeatNamespace != "" {
		go Heartbeat(ctx, workload, o.HeartbeatNamespace, o.Droplet, HeartbeatInterval)
	}
	drops := NewDropLog(o.Droplet, reg)
	if dp.DropEventsEnabled() {
		go func() {
			if err := drops.Run(ctx, dp); err != nil {
				klog.ErrorS(err, "Reading drop events stopped; drops are still counted")
			}
		}()
	}
	go func() { errc <- cni.Serve(ctx, ln, srv) }()
	if err := srv.DrainDeleteQueue(ctx, o.DeleteQueue); err != nil {
		klog.ErrorS(err, "Some queued CNI deletes failed; they stay queued for the next start")
	}
	// The pods attached by an earlier run get this run's program (in place);
	// pins of pods that vanished while no agent ran go.
	if len(dp.ReplacedMaps()) > 0 {
		klog.InfoS("Replaced pinned maps of another layout (an earlier mizar's)", "maps", dp.ReplacedMaps())
	}
	if err := srv.AdoptPods(); err != nil {
		klog.ErrorS(err, "Attaching the pod program to some pods of an earlier run failed")
	}
	if ifs, err := srv.HostInterfaces(); err != nil {
		klog.ErrorS(err, "Not collecting stale pins")
	} else if err := rdp.Pods().inHost(func() error { return dp.GC(append(ifs, u.Name, dataplane.HostDevicePeer)) }); err != nil {
		klog.ErrorS(err, "Collecting stale pins failed")
	}
	if o.HealthAddr != "" {
		var auth *DebugAuth
		if o.DebugAuth {
			if auth, err = NewDebugAuth(workload, reg); err != nil { // workload: Validate
				return err
			}
		}
		mux := m.mux()
		debug := func(path string, h http.Handler) { mux.Handle(path, auth.Wrap(path, h)) }
		debug(agentapi.PathDrops, drops)
		tracer := NewTracer(dp, rdp.Pods(), o.Droplet)
		debug(agentapi.PathTracePod, tracer)
		debug(agentapi.PathTraceUnderlay, tracer)
		debug(agentapi.PathState, NewStateDump(dp, rdp.Pods(), o.Droplet))
		debug(agentapi.PathProbe, NewProber(dp, rdp.Pods(), srv, o.Droplet))
		if policy != nil {
			debug("/policy", policy)
		}
		hs := &http.Server{Addr: o.HealthAddr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			<-ctx.Done()
			_ = hs.Close()
		}()
		go func() {
			if err := hs.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("health server: %w", err)
			}
		}()
	}
	klog.InfoS("mizar-nodeagent running", "droplet", o.Droplet, "underlay", u.Name, "hostIP", u.HostIP, "cniSocket", o.CNISocket)
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	// Decided with the caller's context: ours may be cancelled already.
	if dsWatch != nil && dsWatch.Deleted(context.WithoutCancel(ctx)) {
		uninstall = true
	}
	return runErr
}

// underlayXDPMode picks how the underlay program attaches. A veth underlay
// (kind and podman nodes, netns test hosts) always gets generic XDP: native
// XDP_TX on a veth is counted as tx_dropped unless the peer, which mizar does
// not own, runs an XDP program too, and every relayed frame would be lost.
func underlayXDPMode(u *Underlay, generic bool) dataplane.XDPMode {
	switch {
	case generic:
		return dataplane.XDPGeneric
	case u.Kind == "veth":
		klog.InfoS("The underlay is a veth: attaching its XDP program in generic mode (native XDP_TX on a veth needs XDP on a peer mizar does not own)",
			"underlay", u.Name)
		return dataplane.XDPGeneric
	default:
		return dataplane.XDPDriver
	}
}

// Validate checks the flags without touching the node or the network.
func (o *NodeOptions) Validate() error {
	var errs []error
	if o.Droplet == "" {
		o.Droplet = o.NodeName
	}
	if o.Droplet == "" {
		errs = append(errs, errors.New("no droplet name: set --node-name (or $NODE_NAME) or --droplet"))
	}
	if o.Kubeconfig == "" && o.Droplet != o.NodeName {
		errs = append(errs, fmt.Errorf("in-cluster, the droplet is the node: --droplet %s differs from --node-name %s, and the ServiceAccount token lets the agent write only its node's droplet", o.Droplet, o.NodeName))
	}
	if o.KubeAPIQPS <= 0 || o.KubeAPIBurst <= 0 {
		errs = append(errs, fmt.Errorf("--kube-api-qps %v and --kube-api-burst %d must be > 0", o.KubeAPIQPS, o.KubeAPIBurst))
	}
	if o.AckInterval <= 0 {
		errs = append(errs, fmt.Errorf("--ack-interval must be positive, got %v", o.AckInterval))
	}
	if o.ProvisionTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--provision-timeout must be positive, got %v", o.ProvisionTimeout))
	}
	if o.Services != ServicesKubeProxy && o.Services != ServicesBPF {
		errs = append(errs, fmt.Errorf("--services %q: want %s or %s", o.Services, ServicesKubeProxy, ServicesBPF))
	}
	if o.HostIP != "" {
		if _, err := netip.ParsePrefix(o.HostIP); err != nil {
			errs = append(errs, fmt.Errorf("--host-ip: want an address with its prefix length: %w", err))
		}
	}
	if o.HostMAC != "" {
		if _, err := net.ParseMAC(o.HostMAC); err != nil {
			errs = append(errs, fmt.Errorf("--host-mac: %w", err))
		}
	}
	switch o.Encryption {
	case "":
	case EncryptionWireGuard:
		if _, err := netip.ParsePrefix(o.WireGuardAddress); err != nil {
			errs = append(errs, fmt.Errorf("--encryption=%s needs --wireguard-address, an address with its prefix length: %w", EncryptionWireGuard, err))
		}
		if o.WireGuardPort <= 0 || o.WireGuardPort > 65535 {
			errs = append(errs, fmt.Errorf("--wireguard-port %d is no UDP port", o.WireGuardPort))
		}
	default:
		errs = append(errs, fmt.Errorf("--encryption: %q is neither empty nor %q", o.Encryption, EncryptionWireGuard))
	}
	if o.CNIConflist != "" && (o.CNIConfDir == "" || o.CNIConflistName == "" || strings.Contains(o.CNIConflistName, "/")) {
		errs = append(errs, fmt.Errorf("--cni-conflist needs --cni-conf-dir and a plain --cni-conflist-name, got %q and %q", o.CNIConfDir, o.CNIConflistName))
	}
	if o.DebugAuth && o.Kubeconfig != "" && o.WorkloadKubeconfig == "" {
		errs = append(errs, errors.New("--debug-auth asks the workload cluster's API: run in-cluster or set --workload-kubeconfig"))
	}
	if o.DaemonSet != "" {
		if _, _, err := ParseNamespacedName(o.DaemonSet, os.Getenv("POD_NAMESPACE")); err != nil {
			errs = append(errs, fmt.Errorf("--daemonset: %w", err))
		}
	}
	return errors.Join(errs...)
}

// clientConfigs returns the configuration for mizar's API and for the workload
// cluster (nil: none). With --kubeconfig, mizar's API is reached directly (a
// droplet certificate, netns local clusters); without, in-cluster: through
// kube-apiserver, whose APIService routes networking.mizar.dev to
// mizar-apiserver, with the pod's ServiceAccount token, which also reads the
// pods' annotations.
func (o *NodeOptions) clientConfigs() (mizar, workload *rest.Config, err error) {
	if o.Kubeconfig != "" {
		if mizar, err = clientcmd.BuildConfigFromFlags("", o.Kubeconfig); err != nil {
			return nil, nil, fmt.Errorf("kubeconfig %s: %w", o.Kubeconfig, err)
		}
	} else {
		if mizar, err = rest.InClusterConfig(); err != nil {
			return nil, nil, fmt.Errorf("no --kubeconfig and not in a pod: %w", err)
		}
		workload = rest.CopyConfig(mizar)
	}
	if o.WorkloadKubeconfig != "" {
		if workload, err = clientcmd.BuildConfigFromFlags("", o.WorkloadKubeconfig); err != nil {
			return nil, nil, fmt.Errorf("--workload-kubeconfig %s: %w", o.WorkloadKubeconfig, err)
		}
	}
	for _, c := range []*rest.Config{mizar, workload} {
		if c != nil {
			c.QPS, c.Burst = o.KubeAPIQPS, o.KubeAPIBurst
			c.UserAgent = "mizar-nodeagent/" + o.NodeName
		}
	}
	return mizar, workload, nil
}

// installConflist runs once the droplet is Provisioned: from then on kubelet
// may send pods, so the node turns Ready only when mizar can take them.
func (o *NodeOptions) installConflist(context.Context) error {
	if o.CNIConflist == "" {
		return nil
	}
	if err := InstallConflist(o.CNIConflist, o.CNIConfDir, o.CNIConflistName); err != nil {
		return err
	}
	klog.InfoS("Installed the CNI conflist: the node may turn Ready", "path", filepath.Join(o.CNIConfDir, o.CNIConflistName))
	return nil
}

// Uninstall is what mizar leaves on this node.
func (o *NodeOptions) Uninstall() Uninstall {
	return Uninstall{ConfDir: o.CNIConfDir, Conflist: o.CNIConflistName, BinDir: o.CNIBinDir, Plugins: []string{PluginName},
		PinRoot: o.PinRoot, Dirs: []string{o.StateDir, o.DeleteQueue, filepath.Dir(o.CNISocket)}, HostPath: true, HostNetns: o.HostNetns, StateDir: o.StateDir}
}
