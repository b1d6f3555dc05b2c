package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/authorization/path"
	"k8s.io/apiserver/pkg/authorization/union"
	genericapiserver "k8s.io/apiserver/pkg/server"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/apiserver/pkg/util/compatibility"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/klog/v2"

	"mizar.dev/pkg/etcd"
)

const (
	etcdPrefix     = "/registry/mizar"
	lockPrefix     = "/mizar/locks/"
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
	// Operators runs the cluster-wide operators in this process (leader-elected).
	Operators bool
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	o := &Options{
		Recommended: genericoptions.NewRecommendedOptions(etcdPrefix, Codecs.LegacyCodec(StorageVersions...)),
		DataDir:     "/var/lib/mizar",
		Operators:   true,
	}
	o.Recommended.Etcd.StorageConfig.EncodeVersioner = StorageVersions
	o.Recommended.SecureServing.BindPort = defaultPort
	// Persist a self-signed certificate under the data dir, not the working directory.
	o.Recommended.SecureServing.ServerCert.CertDirectory = ""
	return o
}

// AddFlags registers every option.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.Recommended.AddFlags(fs)
	utilfeature.DefaultMutableFeatureGate.AddFlag(fs)
	fs.BoolVar(&o.Standalone, "standalone", o.Standalone,
		"Serve on loopback only, without kube-apiserver: generate a CA, authenticate client certificates, and write an admin kubeconfig to <data-dir>/kubeconfig. --secure-port 0 picks a free port.")
	fs.StringVar(&o.DataDir, "data-dir", o.DataDir,
		"Directory for the embedded etcd (used when --etcd-servers is empty), the standalone PKI and kubeconfig, and self-signed serving certificates.")
	fs.StringSliceVar(&o.AlternateDNS, "alternate-dns", o.AlternateDNS,
		"Extra DNS names for a self-signed serving certificate, e.g. mizar-apiserver.mizar-system.svc.")
	fs.BoolVar(&o.EtcdUnsafeNoFsync, "embedded-etcd-unsafe-no-fsync", false, "Skip fsync in the embedded etcd. Loses data on a crash; for tests only.")
	_ = fs.MarkHidden("embedded-etcd-unsafe-no-fsync")
	fs.BoolVar(&o.Operators, "operators", o.Operators,
		"Run the operators (VPC, Subnet, Endpoint, Divider, Bouncer, Droplet placement) in this process; replicas elect one leader through etcd.")
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

	// Settle the serving mode first: a mistake there is reported before anything starts.
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
	locker := etcd.NewLocker(client, lockPrefix)
	cleanups = append(cleanups, func() { _ = locker.Close() })

	cfg := NewRecommendedConfig()
	cfg.EffectiveVersion = compatibility.DefaultBuildEffectiveVersion()
	cfg.FeatureGate = utilfeature.DefaultFeatureGate
	if err := o.Recommended.ApplyTo(cfg); err != nil {
		return fmt.Errorf("applying options: %w", err)
	}
	if standalone != nil {
		if cfg.Authorization.Authorizer, err = standaloneAuthorizer(); err != nil {
			return err
		}
	}
	serverCfg := &Config{Generic: cfg, Locker: locker}
	if o.Operators {
		serverCfg.Operators = client
	}
	server, err := serverCfg.New()
	if err != nil {
		return err
	}
	// The operators use the etcd client closed by the cleanups: wait for them first.
	defer server.WaitOperators()
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
	case ss.BindAddress == nil || ss.BindAddress.IsUnspecified():
		ss.BindAddress = net.IPv4(127, 0, 0, 1)
	case !ss.BindAddress.IsLoopback():
		return nil, fmt.Errorf("--standalone serves on loopback only; --bind-address %s is not a loopback address", ss.BindAddress)
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
	// what they may do). No TokenReview, SubjectAccessReview, kube informers,
	// admission chain or priority-and-fairness: there is no kube-apiserver to ask.
	r.Authentication.RemoteKubeConfigFileOptional = true
	r.Authentication.SkipInClusterLookup = true
	r.Authentication.ClientCert.ClientCA = p.file("ca.crt")
	r.Authorization = nil
	r.CoreAPI = nil
	r.Admission = nil
	r.Features.EnablePriorityAndFairness = false
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
