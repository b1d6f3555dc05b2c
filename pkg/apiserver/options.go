package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/authorization/path"
	"k8s.io/apiserver/pkg/authorization/union"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/apiserver/pkg/storage/etcd3"
	"k8s.io/apiserver/pkg/util/compatibility"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"mizar.dev/pkg/admission/dropletrestriction"
	"mizar.dev/pkg/certauth"
	"mizar.dev/pkg/claim"
	"mizar.dev/pkg/etcd"
)

const (
	// DefaultEtcdPrefix keeps mizar's keys out of kube-apiserver's /registry, so a
	// shared etcd's backups and bulk deletes of /registry never catch them.
	DefaultEtcdPrefix = "/mizar"
	// oldEtcdPrefix is where releases before DefaultEtcdPrefix stored objects.
	oldEtcdPrefix  = "/registry/mizar"
	defaultPort    = 8443
	kubeconfigName = "kubeconfig"
)

// Options are mizar-apiserver's command-line options.
type Options struct {
	Recommended *genericoptions.RecommendedOptions

	// Standalone serves on loopback only, without kube-apiserver: its own CA,
	// client-certificate authentication, and an admin kubeconfig in DataDir.
	Standalone bool
	// DataDir holds the embedded etcd (when no --etcd-servers), the standalone
	// PKI and kubeconfig, and generated serving certificates.
	DataDir string
	// AlternateDNS are extra names for a self-signed serving certificate.
	AlternateDNS []string
	// EtcdUnsafeNoFsync makes the embedded etcd skip fsync; for tests only.
	EtcdUnsafeNoFsync bool
	// WrapStorage, when set, wraps each resource's storage (tests inject faults
	// with it; no flag sets it).
	WrapStorage StorageWrapper
	// ClaimRepairPeriod overrides DefaultClaimRepairPeriod, and ClaimOrphanGrace
	// claim.OrphanGrace: tests shorten them to see crash leftovers go (hidden flags).
	ClaimRepairPeriod time.Duration
	ClaimOrphanGrace  time.Duration
	// Operators runs the cluster-wide operators in this process (leader-elected).
	Operators bool
	// OperatorsClientQPS and OperatorsClientBurst limit each operator's requests
	// to this server.
	OperatorsClientQPS   float32
	OperatorsClientBurst int
	// Broker configures the service broker (--broker-*).
	Broker BrokerOptions
	// EventsKubeconfig names the cluster whose core/v1 Events API gets
	// mizar's Events; empty: the aggregating cluster when aggregated (the
	// core API client, --kubeconfig or in-cluster), none when standalone.
	EventsKubeconfig string
	// StuckAfter is how long an object may wait in Init before its Warning
	// Event (WaitingForAgent, AgentNotAcknowledging).
	StuckAfter time.Duration

	// Shutdown is how the server stops on SIGTERM.
	Shutdown ShutdownOptions
	// GCPercent is the Go garbage collector's target (GOGC) when the GOGC
	// environment variable is unset (see applyGCPercent).
	GCPercent int
	// RequestBodyTimeout bounds how long a client may take to send a request
	// body, read before the request takes an in-flight slot (withBodyDeadline).
	RequestBodyTimeout time.Duration
	// EtcdLeaderWait is how long a request waits for etcd to have a leader
	// before it is answered 503 (notNowStorage).
	EtcdLeaderWait time.Duration
	// MaxRequestsInFlight and MaxMutatingRequestsInFlight bound concurrent
	// requests where priority and fairness is off (kube-apiserver's flags).
	MaxRequestsInFlight         int
	MaxMutatingRequestsInFlight int

	// NodeAgentServiceAccounts (namespace/name) are the node agents'
	// ServiceAccounts: their writes are bound to the node their token names
	// (see dropletrestriction).
	NodeAgentServiceAccounts []string
	// DefaultVPC (NAME=CIDR) and DefaultSubnets are created at start if absent.
	DefaultVPC     string
	DefaultSubnets []string
	// CheckFlags validates the flags and exits without serving.
	CheckFlags bool

	// flags is the set AddFlags registered on, to tell set flags from defaults.
	flags *pflag.FlagSet
}

// EtcdPrefix is the etcd key prefix everything of mizar's lives under (objects and
// claims): --etcd-prefix, DefaultEtcdPrefix unless set.
func (o *Options) EtcdPrefix() string { return o.Recommended.Etcd.StorageConfig.Prefix }

// etcdSubPrefix is the prefix of one kind of mizar's own records, e.g. "claims".
func (o *Options) etcdSubPrefix(name string) string {
	return strings.TrimSuffix(o.EtcdPrefix(), "/") + "/" + name + "/"
}

// set reports whether a flag was given on the command line.
func (o *Options) set(name string) bool { return o.flags != nil && o.flags.Changed(name) }

// ShutdownOptions are the graceful-termination settings of k8s.io/apiserver
// that matter to mizar (kube-apiserver has the same flags).
type ShutdownOptions struct {
	// DelayDuration keeps serving after SIGTERM while /readyz fails, so a load
	// balancer can take the replica out first.
	DelayDuration time.Duration
	// WatchTerminationGracePeriod ends open watches at shutdown (their clients
	// see the stream close and re-watch elsewhere) and waits at most this long
	// for them; 0 leaves them open until the HTTP server's own 60 s timeout.
	WatchTerminationGracePeriod time.Duration
	// SendRetryAfter keeps listening until in-flight requests drain, answering
	// new ones 429 with Retry-After.
	SendRetryAfter bool
}

// AddFlags registers the shutdown flags under kube-apiserver's names.
func (s *ShutdownOptions) AddFlags(fs *pflag.FlagSet) {
	fs.DurationVar(&s.DelayDuration, "shutdown-delay-duration", s.DelayDuration,
		"Time to keep serving after SIGTERM while /readyz fails, so a load balancer stops sending traffic here first. "+
			"0 suits a single replica; behind a Service give it the endpoints' propagation time (a few seconds).")
	fs.DurationVar(&s.WatchTerminationGracePeriod, "shutdown-watch-termination-grace-period", s.WatchTerminationGracePeriod,
		"On shutdown, end every open watch (clients see the stream close and re-watch) and wait at most this long for them. "+
			"0 leaves watches open, and shutdown then takes the HTTP server's 60 s timeout.")
	fs.BoolVar(&s.SendRetryAfter, "shutdown-send-retry-after", s.SendRetryAfter,
		"On shutdown, keep listening until in-flight requests drain, answering new requests 429 with Retry-After instead of refusing connections.")
}

// Validate reports shutdown settings that cannot work.
func (s *ShutdownOptions) Validate() []error {
	var errs []error
	if s.DelayDuration < 0 {
		errs = append(errs, fmt.Errorf("--shutdown-delay-duration must not be negative, got %v", s.DelayDuration))
	}
	if s.WatchTerminationGracePeriod < 0 {
		errs = append(errs, fmt.Errorf("--shutdown-watch-termination-grace-period must not be negative, got %v", s.WatchTerminationGracePeriod))
	}
	return errs
}

// ApplyTo copies the settings into the server config.
func (s *ShutdownOptions) ApplyTo(cfg *genericapiserver.Config) {
	cfg.ShutdownDelayDuration = s.DelayDuration
	cfg.ShutdownWatchTerminationGracePeriod = s.WatchTerminationGracePeriod
	cfg.ShutdownSendRetryAfter = s.SendRetryAfter
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	o := &Options{
		Recommended: genericoptions.NewRecommendedOptions(DefaultEtcdPrefix, Codecs.LegacyCodec(StorageVersions...)),
		DataDir:     "/var/lib/mizar",
		Operators:   true,
		// Bodies are read before a request takes a slot, within this.
		RequestBodyTimeout: DefaultRequestBodyTimeout,
		EtcdLeaderWait:     DefaultEtcdLeaderWait,
		// k8s.io/apiserver's defaults.
		MaxRequestsInFlight:         400,
		MaxMutatingRequestsInFlight: 200,
		// Watches end at once on SIGTERM (with 2 s for the rate-limited drain), so
		// a stop takes seconds, not the HTTP server's 60 s shutdown timeout.
		Shutdown: ShutdownOptions{WatchTerminationGracePeriod: 2 * time.Second},
	}
	o.Recommended.Etcd.StorageConfig.EncodeVersioner = StorageVersions
	// Priority and fairness prices a list or a watch's replay by the number of
	// objects of its resource, counted this often (the library's default is a
	// minute, long enough for a burst of creates to make replays look cheap).
	o.Recommended.Etcd.StorageConfig.CountMetricPollPeriod = 10 * time.Second
	o.Recommended.SecureServing.BindPort = defaultPort
	// Persist a self-signed certificate under the data dir, not the working directory.
	o.Recommended.SecureServing.ServerCert.CertDirectory = ""
	return o
}

// AddFlags registers every option.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.flags = fs
	o.Recommended.AddFlags(fs)
	o.Shutdown.AddFlags(fs)
	// The library's help says 0 disables serving; mizar needs a listener.
	if f := fs.Lookup("secure-port"); f != nil {
		f.Usage = "The port to serve HTTPS on. With --standalone, 0 picks a free port (the kubeconfig names it); " +
			"behind kube-apiserver it must be the fixed port the APIService's Service targets."
	}
	if f := fs.Lookup("bind-address"); f != nil {
		f.Usage += " With --standalone, only loopback addresses are accepted, and the default is 127.0.0.1."
	}
	utilfeature.DefaultMutableFeatureGate.AddFlag(fs)
	fs.BoolVar(&o.Standalone, "standalone", o.Standalone,
		"Serve on loopback only, without kube-apiserver: generate a CA, authenticate client certificates, and write an admin kubeconfig to <data-dir>/kubeconfig. --secure-port 0 picks a free port.")
	fs.StringVar(&o.DataDir, "data-dir", o.DataDir,
		"Directory for the embedded etcd (used when --etcd-servers is empty), the standalone PKI and kubeconfig, and self-signed serving certificates.")
	fs.StringSliceVar(&o.AlternateDNS, "alternate-dns", o.AlternateDNS,
		"Extra DNS names for a self-signed serving certificate, e.g. mizar-apiserver.mizar-system.svc.")
	fs.BoolVar(&o.EtcdUnsafeNoFsync, "embedded-etcd-unsafe-no-fsync", false, "Skip fsync in the embedded etcd. Loses data on a crash; for tests only.")
	_ = fs.MarkHidden("embedded-etcd-unsafe-no-fsync")
	fs.DurationVar(&o.ClaimRepairPeriod, "claim-repair-period", 0, "How often orphaned claims are dropped (default 3m). For tests only.")
	fs.DurationVar(&o.ClaimOrphanGrace, "claim-orphan-grace", 0, "How old an unowned claim must be before it is dropped (default 2m; must exceed any create's duration). For tests only.")
	_ = fs.MarkHidden("claim-repair-period")
	_ = fs.MarkHidden("claim-orphan-grace")
	o.Broker.AddFlags(fs)
	fs.BoolVar(&o.Operators, "operators", o.Operators,
		"Run the operators (VPC, Subnet, Endpoint, Divider, Bouncer, Droplet placement) in this process; replicas elect one leader through etcd.")
	// The loopback client's own limit (50 QPS, burst 100) capped the Endpoint
	// operator (two writes per endpoint) at 25 endpoints a second, whatever the
	// cluster's size. The server's max-in-flight limits still protect it.
	fs.Float32Var(&o.OperatorsClientQPS, "operators-client-qps", 1000, "Requests per second each operator may send to this server.")
	fs.IntVar(&o.OperatorsClientBurst, "operators-client-burst", 2000, "Burst of --operators-client-qps.")
	fs.StringVar(&o.EventsKubeconfig, "events-kubeconfig", "", "Kubeconfig of the cluster whose core/v1 Events API receives mizar's Kubernetes Events "+
		"(objects stuck in Init, agents not acknowledging, saga steps retrying or failing), shown by kubectl describe there. "+
		"Empty: the aggregating cluster (the --kubeconfig client, else in-cluster) when aggregated; no Events with --standalone.")
	fs.DurationVar(&o.StuckAfter, "stuck-after", 30*time.Second, "How long an Endpoint, Droplet, Bouncer or Divider may wait in Init for its agents before it gets a Warning Event "+
		"(WaitingForAgent, AgentNotAcknowledging) and a log line; repeated at doubling intervals while it waits.")
	fs.DurationVar(&o.RequestBodyTimeout, "request-body-timeout", o.RequestBodyTimeout,
		"How long a client may take to send a request body; it is read before the request takes an in-flight slot, "+
			"so slow senders hold none. A body not received in time is answered 408. 0 reads bodies inside the slot, without a deadline.")
	fs.DurationVar(&o.EtcdLeaderWait, "etcd-leader-wait", o.EtcdLeaderWait,
		"How long a request waits for etcd to elect a leader before it is answered 503 with Retry-After. "+
			"Rides through an election; a cluster without quorum is reported instead of holding requests until they time out.")
	fs.IntVar(&o.MaxRequestsInFlight, "max-requests-inflight", o.MaxRequestsInFlight,
		"The most non-mutating requests served at once where priority and fairness is off; more are answered 429. "+
			"With it on, this plus --max-mutating-requests-inflight is the seats mizar's priority levels share.")
	fs.IntVar(&o.MaxMutatingRequestsInFlight, "max-mutating-requests-inflight", o.MaxMutatingRequestsInFlight,
		"The most mutating requests served at once where priority and fairness is off; more are answered 429. "+
			"With it on, see --max-requests-inflight.")
	fs.StringSliceVar(&o.NodeAgentServiceAccounts, "node-agent-service-account", o.NodeAgentServiceAccounts,
		"ServiceAccount (namespace/name) of mizar-nodeagent's DaemonSet. Its bound tokens name the node of the agent's pod "+
			"(authentication.kubernetes.io/node-name), and the agent may write only that node's Droplet and the objects on it. Repeatable.")
	fs.StringVar(&o.DefaultVPC, "default-vpc", o.DefaultVPC,
		"NAME=CIDR of the VPC for pods that name none, created at start if absent (an existing one is never changed). Needs --default-subnet.")
	fs.StringArrayVar(&o.DefaultSubnets, "default-subnet", o.DefaultSubnets,
		"NAME=CIDR of a subnet of --default-vpc, created at start if absent. Repeatable.")
	fs.BoolVar(&o.CheckFlags, "check-flags", false, "Validate the flags (mode, values) and exit 0 if they are valid, without serving or touching etcd.")
	fs.IntVar(&o.GCPercent, "gc-percent", DefaultGCPercent,
		"The Go garbage collector's target, as GOGC: the heap may grow by this percentage of the live heap between collections. "+
			"Higher spends memory to save CPU. Ignored when the GOGC environment variable is set.")
}

// KubeconfigPath is where a standalone server writes its admin kubeconfig.
func (o *Options) KubeconfigPath() string { return filepath.Join(o.DataDir, kubeconfigName) }

// Run serves until ctx ends, then shuts down and stops what it started.
func (o *Options) Run(ctx context.Context) error {
	var cleanups []func()
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()

	if err := applyGCPercent(o.GCPercent); err != nil {
		return err
	}
	if o.OperatorsClientQPS <= 0 || o.OperatorsClientBurst < 1 {
		return fmt.Errorf("--operators-client-qps and --operators-client-burst must be positive, got %v and %d", o.OperatorsClientQPS, o.OperatorsClientBurst)
	}
	if o.EtcdLeaderWait < 0 {
		return fmt.Errorf("--etcd-leader-wait must not be negative, got %v", o.EtcdLeaderWait)
	}
	if o.StuckAfter <= 0 {
		return fmt.Errorf("--stuck-after must be positive, got %v", o.StuckAfter)
	}
	agentSAs, defaultNet, err := o.validateMizarFlags()
	if err != nil {
		return err
	}
	if o.CheckFlags {
		klog.InfoS("Flags are valid (--check-flags)")
		return nil
	}
	if err := o.Broker.Complete(); err != nil {
		return err
	}
	// Closing is harmless once the OSB server has taken the listener over.
	cleanups = append(cleanups, o.Broker.Close)
	// Settle the serving mode first: a mistake there is reported before anything starts.
	if err := o.checkModeFlags(); err != nil {
		return err
	}
	if errs := o.Shutdown.Validate(); len(errs) > 0 {
		return utilerrors.NewAggregate(errs)
	}
	var standalone *standalonePKI
	if o.Standalone {
		p, err := o.configureStandalone()
		if err != nil {
			return err
		}
		standalone = p
		// Closing is harmless once the server has taken the listener over.
		cleanups = append(cleanups, func() { _ = o.Recommended.SecureServing.Listener.Close() })
	} else if err := o.configureAggregated(); err != nil {
		return err
	}

	etcd.QuietGRPCLog()
	if len(o.Recommended.Etcd.StorageConfig.Transport.ServerList) == 0 {
		e, err := etcd.StartEmbedded(etcd.EmbeddedOptions{Dir: filepath.Join(o.DataDir, "etcd"), UnsafeNoFsync: o.EtcdUnsafeNoFsync})
		if err != nil {
			return err
		}
		cleanups = append(cleanups, e.Close)
		o.Recommended.Etcd.StorageConfig.Transport.ServerList = e.Endpoints()
		klog.InfoS("Started embedded etcd", "dir", filepath.Join(o.DataDir, "etcd"))
	}
	if errs := o.Recommended.Validate(); len(errs) > 0 {
		return utilerrors.NewAggregate(errs)
	}

	client, err := etcd.NewClient(o.Recommended.Etcd.StorageConfig.Transport)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() { _ = client.Close() })
	if err := o.checkOldPrefix(ctx, client); err != nil {
		return err
	}
	// Claims live beside the objects, under the same --etcd-prefix.
	claims := claim.NewStore(client, o.etcdSubPrefix("claims"))
	claims.SetObjectPrefix(o.EtcdPrefix())
	claim.ServeMetrics(claims)
	// Other replicas' claims reach this one's allocation indexes.
	followCtx, stopFollowing := context.WithCancel(ctx)
	cleanups = append(cleanups, stopFollowing)
	go claims.Follow(followCtx)
	if o.ClaimOrphanGrace > 0 {
		claims.SetOrphanGrace(o.ClaimOrphanGrace)
	}

	cfg := NewRecommendedConfig()
	chain := cfg.BuildHandlerChainFunc
	cfg.BuildHandlerChainFunc = func(h http.Handler, c *genericapiserver.Config) http.Handler {
		return withBodyDeadline(chain(withQueryChecks(h), c), o.RequestBodyTimeout)
	}
	cfg.MaxRequestsInFlight, cfg.MaxMutatingRequestsInFlight = o.MaxRequestsInFlight, o.MaxMutatingRequestsInFlight
	cfg.EffectiveVersion = compatibility.DefaultBuildEffectiveVersion()
	cfg.FeatureGate = utilfeature.DefaultFeatureGate
	// Priority and fairness runs on mizar's own configuration (newFlowControl),
	// never the library's, which would read the host cluster's FlowSchemas.
	features := o.Recommended.Features
	priorityAndFairness := features != nil && features.EnablePriorityAndFairness
	if features != nil {
		features.EnablePriorityAndFairness = false
	}
	clientCA, err := o.applyTo(cfg)
	if features != nil {
		features.EnablePriorityAndFairness = priorityAndFairness
	}
	if err != nil {
		return fmt.Errorf("applying options: %w", err)
	}
	var flows *dropletFlows
	var startFlows func(<-chan struct{})
	if priorityAndFairness {
		if flows, startFlows, err = newFlowControl(cfg.MaxRequestsInFlight+cfg.MaxMutatingRequestsInFlight,
			dropletrestriction.Identities{AgentServiceAccounts: agentSAs}); err != nil {
			return err
		}
		cfg.FlowControl = flows
	}
	if a := cfg.Authentication.Authenticator; a != nil {
		// Verified client-certificate chains are remembered per CA bundle, so a
		// client's certificate is not verified again on each of its requests.
		cfg.Authentication.Authenticator = certauth.New(certauth.NewCache(certauth.DefaultSize), clientCA, cfg.Authentication.RequestHeaderConfig, a)
	}
	gate, err := o.gateAuthentication(cfg, clientCA)
	if err != nil {
		return err
	}
	// Before any decorator that wraps the watch cache: this one builds it.
	cfg.RESTOptionsGetter = pacedWatchOptionsGetter{RESTOptionsGetter: cfg.RESTOptionsGetter}
	// Creates with claims write them in the object's transaction, through a
	// client of their own as each of the apiserver's stores has one.
	writes, err := etcd.NewClient(o.Recommended.Etcd.StorageConfig.Transport)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() { _ = writes.Close() })
	// Counted in the request's etcd latency, as the factory's clients are.
	writes.KV = etcd3.NewETCDLatencyTracker(writes.KV)
	cfg.RESTOptionsGetter = claimWritingOptionsGetter{RESTOptionsGetter: cfg.RESTOptionsGetter, client: claims.Client(writes)}
	if o.WrapStorage != nil {
		cfg.RESTOptionsGetter = wrappingOptionsGetter{RESTOptionsGetter: cfg.RESTOptionsGetter, wrap: o.WrapStorage}
	}
	cfg.RESTOptionsGetter = notNowOptionsGetter{RESTOptionsGetter: cfg.RESTOptionsGetter, leaderWait: o.EtcdLeaderWait}
	o.Shutdown.ApplyTo(&cfg.Config)
	if standalone != nil {
		if cfg.Authorization.Authorizer, err = standaloneAuthorizer(); err != nil {
			return err
		}
	}
	// Node agents read endpoints only in their slice, whatever else authorizes them.
	slices := &sliceAuthorizer{ids: dropletrestriction.Identities{AgentServiceAccounts: agentSAs}}
	if cfg.Authorization.Authorizer != nil {
		cfg.Authorization.Authorizer = union.New(slices, cfg.Authorization.Authorizer)
	}
	events, err := o.eventsClient(cfg)
	if err != nil {
		return err
	}
	o.Broker.events = events
	serverCfg := &Config{Generic: cfg, Claims: claims, ClaimRepairPeriod: o.ClaimRepairPeriod, NodeAgentServiceAccounts: agentSAs,
		NoGarbageCollector: o.Standalone, endpointSlices: slices, Events: events, StuckAfter: o.StuckAfter}
	if o.Operators {
		serverCfg.Operators = client
		serverCfg.OperatorsClientQPS, serverCfg.OperatorsClientBurst = o.OperatorsClientQPS, o.OperatorsClientBurst
	}
	server, err := serverCfg.New()
	if err != nil {
		return err
	}
	// The operators use the etcd client closed by the cleanups: wait for them first.
	defer server.WaitOperators()
	if flows != nil {
		if err := addPriorityAndFairnessHooks(server.GenericAPIServer, flows, startFlows); err != nil {
			return err
		}
	}
	if gate != nil {
		server.GenericAPIServer.AddPostStartHookOrDie("mizar-authentication-loaded", func(hc genericapiserver.PostStartHookContext) error {
			go func() {
				if err := gate.run(hc.Context); err != nil {
					klog.ErrorS(err, "API requests stay held back")
				}
			}()
			return nil
		})
	}
	if o.Broker.Fulfillment {
		// It uses the etcd client closed by the cleanups: wait for it first.
		defer o.Broker.WaitFulfillment()
		// A restart after a kill -9 leads at once instead of waiting out its own dead lease.
		o.Broker.leaseFile = filepath.Join(o.DataDir, "broker-fulfillment.lease")
		server.GenericAPIServer.AddPostStartHookOrDie("mizar-broker-fulfillment", func(hc genericapiserver.PostStartHookContext) error {
			return o.Broker.startFulfillment(hc, hc.LoopbackClientConfig, server.GenericAPIServer.Handler, client)
		})
	}
	if o.Broker.OSBAddress != "" {
		certKey := o.Recommended.SecureServing.ServerCert.CertKey
		server.GenericAPIServer.AddPostStartHookOrDie("mizar-broker-osb", func(hc genericapiserver.PostStartHookContext) error {
			return o.Broker.startOSB(hc, hc.LoopbackClientConfig, server.GenericAPIServer.Handler, certKey.CertFile, certKey.KeyFile)
		})
	}
	if defaultNet != nil {
		server.GenericAPIServer.AddPostStartHookOrDie("mizar-default-network", func(hc genericapiserver.PostStartHookContext) error {
			// In the background: a refused default network is logged, and the server serves on.
			go func() {
				if err := defaultNet.ensure(hc, hc.LoopbackClientConfig); err != nil {
					klog.ErrorS(err, "The default network was not created", "vpc", defaultNet.VPC.Name)
				}
			}()
			return nil
		})
	}
	if standalone != nil {
		addr := cfg.SecureServing.Listener.Addr().String()
		// Written once the server listens, so a client that finds it can connect.
		server.GenericAPIServer.AddPostStartHookOrDie("mizar-write-kubeconfig", func(genericapiserver.PostStartHookContext) error {
			if err := standalone.writeKubeconfig(o.KubeconfigPath(), addr); err != nil {
				return err
			}
			klog.InfoS("Standalone mizar-apiserver is serving", "address", "https://"+addr, "kubeconfig", o.KubeconfigPath())
			return nil
		})
	}
	return server.GenericAPIServer.PrepareRun().RunWithContext(ctx)
}

// configureStandalone switches off everything that needs kube-apiserver and sets
// up loopback serving with mizar's own PKI, which it returns.
func (o *Options) configureStandalone() (*standalonePKI, error) {
	r := o.Recommended
	ss := r.SecureServing
	switch {
	case !o.set("bind-address"):
		// The library's default is every interface; standalone's is loopback.
		ss.BindAddress = net.IPv4(127, 0, 0, 1)
	case ss.BindAddress == nil || !ss.BindAddress.IsLoopback():
		return nil, fmt.Errorf("--standalone serves on loopback only (it has no authentication beyond its own CA's certificates); "+
			"--bind-address %s is not a loopback address: use 127.0.0.1 or ::1, or run without --standalone behind kube-apiserver", ss.BindAddress)
	}
	if ss.ServerCert.CertKey.CertFile != "" {
		return nil, errors.New("--standalone issues its own serving certificate; drop --tls-cert-file/--tls-private-key-file")
	}
	p, err := loadStandalonePKI(filepath.Join(o.DataDir, "pki"))
	if err != nil {
		return nil, fmt.Errorf("standalone PKI in %s: %w", o.DataDir, err)
	}
	ss.ServerCert.CertKey.CertFile = p.file("serving.crt")
	ss.ServerCert.CertKey.KeyFile = p.file("serving.key")
	if ss.Listener == nil {
		// Created here so --secure-port 0 gets a free port instead of disabling serving.
		addr := net.JoinHostPort(ss.BindAddress.String(), strconv.Itoa(ss.BindPort))
		l, _, err := genericoptions.CreateListener("tcp", addr, net.ListenConfig{})
		if err != nil {
			return nil, fmt.Errorf("listening on %s: %w", addr, err)
		}
		ss.Listener = l
		ss.BindPort = l.Addr().(*net.TCPAddr).Port
	}

	// Clients present certificates from mizar's CA (standaloneAuthorizer decides
	// what they may do). No TokenReview, SubjectAccessReview, kube informers or
	// admission chain: there is no kube-apiserver to ask. Priority and fairness
	// stays: its configuration is mizar's own (newFlowControl).
	r.Authentication.RemoteKubeConfigFileOptional = true
	r.Authentication.SkipInClusterLookup = true
	r.Authentication.ClientCert.ClientCA = p.file("ca.crt")
	r.Authorization = nil
	r.CoreAPI = nil
	r.Admission = nil
	return p, nil
}

// standaloneAuthorizer lets system:masters (the admin kubeconfig) do anything,
// node agents (droplet identities) what agents do, and anyone reach the health
// endpoints; everything else is forbidden.
func standaloneAuthorizer() (authorizer.Authorizer, error) {
	health, err := path.NewAuthorizer([]string{"/healthz", "/livez", "/readyz"})
	if err != nil {
		return nil, fmt.Errorf("standalone authorizer: %w", err)
	}
	return union.New(health, authorizerfactory.NewPrivilegedGroups(user.SystemPrivilegedGroup), dropletAuthorizer{}), nil
}

// configureAggregated completes the options for serving behind kube-apiserver.
func (o *Options) configureAggregated() error {
	r := o.Recommended
	// Without kubeconfigs the delegation falls back to the in-cluster config; say
	// plainly what is missing instead of the library's nested error.
	if os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		var missing []string
		if r.Authentication.RemoteKubeConfigFile == "" {
			missing = append(missing, "--authentication-kubeconfig")
		}
		if r.Authorization.RemoteKubeConfigFile == "" {
			missing = append(missing, "--authorization-kubeconfig")
		}
		if r.CoreAPI != nil && r.CoreAPI.CoreAPIKubeconfigPath == "" {
			missing = append(missing, "--kubeconfig")
		}
		if len(missing) > 0 {
			return fmt.Errorf("aggregated mode (the default) delegates authentication and authorization to kube-apiserver, "+
				"but none is configured: not running in a pod (KUBERNETES_SERVICE_HOST is unset) and no %s given; "+
				"pass them, or run with --standalone for a loopback-only server", strings.Join(missing, ", "))
		}
	}
	ss := r.SecureServing
	if ss.Listener == nil && ss.BindPort == 0 {
		return errors.New("--secure-port 0 picks a free port only with --standalone; behind kube-apiserver the APIService's " +
			"Service targets a fixed port, so give one (default 8443)")
	}
	if ss.ServerCert.CertDirectory == "" {
		ss.ServerCert.CertDirectory = filepath.Join(o.DataDir, "serving-certs")
	}
	if err := os.MkdirAll(ss.ServerCert.CertDirectory, 0o700); err != nil {
		return fmt.Errorf("creating certificate directory: %w", err)
	}
	if err := ss.MaybeDefaultWithSelfSignedCerts("localhost", o.AlternateDNS, []net.IP{net.IPv4(127, 0, 0, 1)}); err != nil {
		return fmt.Errorf("creating self-signed serving certificate: %w", err)
	}
	return nil
}

// applyTo applies the options to cfg with the client CA provider of
// clientCAProvider, which it returns (nil if none).
func (o *Options) applyTo(cfg *genericapiserver.RecommendedConfig) (dynamiccertificates.CAContentProvider, error) {
	clientCA := o.clientCAProvider()
	if clientCA == nil {
		return nil, o.Recommended.ApplyTo(cfg)
	}
	cc := &o.Recommended.Authentication.ClientCert
	given := cc.CAContentProvider
	cc.CAContentProvider = clientCA
	// The options stay as they were given, so another Run makes its own provider.
	defer func() { cc.CAContentProvider = given }()
	return clientCA, o.Recommended.ApplyTo(cfg)
}

// clientCAProvider creates the client CA bundle provider that the delegated
// authentication would otherwise create inside the library (from
// --client-ca-file, or kube-system/extension-apiserver-authentication); Run
// hands it to the library, so the certificate cache reads the very bundle the
// library verifies with and sees each change at the same moment. nil when
// client certificates are not authenticated, or the provider cannot be made
// here: the library then builds its own and reports any error itself.
func (o *Options) clientCAProvider() dynamiccertificates.CAContentProvider {
	a := o.Recommended.Authentication
	if a == nil {
		return nil
	}
	if a.ClientCert.CAContentProvider != nil || a.ClientCert.ClientCA != "" {
		p, err := a.ClientCert.GetClientCAContentProvider()
		if err != nil {
			return nil
		}
		return p
	}
	if a.SkipInClusterLookup {
		return nil
	}
	client, err := o.authenticationClient()
	if err != nil {
		return nil
	}
	// The same names the library's own lookup uses.
	p, err := dynamiccertificates.NewDynamicCAFromConfigMapController("client-ca", metav1.NamespaceSystem, "extension-apiserver-authentication", "client-ca-file", client)
	if err != nil {
		return nil
	}
	return p
}

// eventsClient is the client mizar's Events are posted with (nil: none).
func (o *Options) eventsClient(cfg *genericapiserver.RecommendedConfig) (kubernetes.Interface, error) {
	rc := cfg.ClientConfig
	if o.EventsKubeconfig != "" {
		var err error
		if rc, err = clientcmd.BuildConfigFromFlags("", o.EventsKubeconfig); err != nil {
			return nil, fmt.Errorf("--events-kubeconfig %s: %w", o.EventsKubeconfig, err)
		}
	} else if o.Standalone {
		return nil, nil
	}
	if rc == nil {
		return nil, nil
	}
	rc = rest.CopyConfig(rc)
	rc.UserAgent = "mizar-apiserver/events"
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("the Events client: %w", err)
	}
	return c, nil
}

// authenticationClient is the client delegated authentication reads
// kube-system/extension-apiserver-authentication with.
func (o *Options) authenticationClient() (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if f := o.Recommended.Authentication.RemoteKubeConfigFile; f != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", f)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// gateAuthentication holds API requests and /readyz back until delegated
// authentication has loaded what kube-apiserver publishes (authGate). Nothing
// to wait for in standalone mode or when the in-cluster lookup is off: files
// are loaded before serving starts.
func (o *Options) gateAuthentication(cfg *genericapiserver.RecommendedConfig, clientCA dynamiccertificates.CAContentProvider) (*authGate, error) {
	a := o.Recommended.Authentication
	if a == nil || a.SkipInClusterLookup || cfg.Authentication.Authenticator == nil {
		return nil, nil
	}
	client, err := o.authenticationClient()
	if err != nil {
		return nil, fmt.Errorf("delegated authentication client: %w", err)
	}
	g := newAuthGate(client, clientCA, cfg.Authentication.RequestHeaderConfig, cfg.Authentication.Authenticator)
	chain := cfg.BuildHandlerChainFunc
	cfg.BuildHandlerChainFunc = func(h http.Handler, c *genericapiserver.Config) http.Handler {
		return g.wrap(chain(h, c))
	}
	cfg.AddReadyzChecks(g)
	return g, nil
}
