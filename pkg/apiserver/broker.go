package apiserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"mizar.dev/pkg/broker/fulfillment"
	"mizar.dev/pkg/broker/osb"
	"mizar.dev/pkg/generated/clientset/versioned"
	"mizar.dev/pkg/leader"
)

// BrokerOptions are the --broker-* flags: the service broker's fulfillment
// operator and the workload cluster it provisions into.
type BrokerOptions struct {
	// Fulfillment runs the operator that turns ServiceInstances into workloads.
	Fulfillment bool
	// WorkloadKubeconfig reaches the workload cluster; empty means in-cluster.
	WorkloadKubeconfig string
	// Workers is how many orders are advanced at once.
	Workers int
	// OSBAddress is where the Open Service Broker API listens (TLS); empty: off.
	OSBAddress string
	// OSBCredentialsFile holds "username:password" for the platform's Basic auth.
	OSBCredentialsFile string
	// OSBNamespace holds the orders and bindings placed through the OSB API.
	OSBNamespace string
	// OSBCertFile and OSBKeyFile serve the OSB API; empty: the apiserver's own.
	OSBCertFile, OSBKeyFile string
	// ClientQPS and ClientBurst limit the broker's requests to this server.
	ClientQPS   float32
	ClientBurst int

	osbCreds    osb.Credentials
	osbListener net.Listener

	workload *rest.Config
	// events receives the fulfillment operator's Events (nil: none).
	events kubernetes.Interface
	// fulfillmentDone closes once the fulfillment operator has stopped, if
	// fulfillmentStarted says it was started (by a post-start hook).
	fulfillmentDone    chan struct{}
	fulfillmentStarted atomic.Bool
	// leaseFile keeps this replica's election lease across a crash (see
	// leader.Options.LeaseFile), in the server's data directory.
	leaseFile string
}

// AddFlags registers the broker flags.
func (o *BrokerOptions) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.Fulfillment, "broker-fulfillment", o.Fulfillment,
		"Run the broker's fulfillment operator: ServiceInstances become a Secret, a headless Service and a StatefulSet in the workload cluster.")
	fs.StringVar(&o.WorkloadKubeconfig, "broker-workload-kubeconfig", o.WorkloadKubeconfig,
		"Kubeconfig of the workload cluster the broker provisions into. Empty: the in-cluster configuration.")
	fs.IntVar(&o.Workers, "broker-workers", 4, "Orders the fulfillment operator advances concurrently.")
	fs.StringVar(&o.OSBAddress, "broker-osb-address", o.OSBAddress,
		"host:port where the Open Service Broker API v2 listens over TLS, e.g. 0.0.0.0:8444. Empty: not served.")
	fs.StringVar(&o.OSBCredentialsFile, "broker-osb-credentials-file", o.OSBCredentialsFile,
		"File holding username:password for the OSB API's Basic auth (e.g. a mounted Secret key). Required with --broker-osb-address; there is no default password.")
	fs.StringVar(&o.OSBNamespace, "broker-osb-namespace", "mizar-broker",
		"Namespace of the ServiceInstances and ServiceBindings placed through the OSB API.")
	fs.StringVar(&o.OSBCertFile, "broker-osb-tls-cert-file", o.OSBCertFile, "Serving certificate of the OSB API. Empty: the apiserver's.")
	fs.StringVar(&o.OSBKeyFile, "broker-osb-tls-private-key-file", o.OSBKeyFile, "Private key of --broker-osb-tls-cert-file.")
	// The loopback client's own limit (50 QPS, burst 100) queued every OSB
	// provision behind the others: 50 platforms at once waited up to a second.
	// The server's max-in-flight limits still protect it.
	fs.Float32Var(&o.ClientQPS, "broker-client-qps", 1000, "Requests per second the OSB API and the fulfillment operator may send to this server.")
	fs.IntVar(&o.ClientBurst, "broker-client-burst", 2000, "Burst of --broker-client-qps.")
}

// loopback is the server's loopback client config with the broker's rate limits.
func (o *BrokerOptions) loopback(cfg *rest.Config, userAgent string) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = o.ClientQPS, o.ClientBurst
	cfg.UserAgent = userAgent
	return cfg
}

// Complete checks the flags, loads the workload cluster's configuration and
// the OSB credentials, and opens the OSB listener, so a mistake is reported
// before anything starts. Close releases what it opened.
func (o *BrokerOptions) Complete() error {
	if o.Workers < 1 {
		return fmt.Errorf("--broker-workers must be at least 1, got %d", o.Workers)
	}
	if o.ClientQPS <= 0 || o.ClientBurst < 1 {
		return fmt.Errorf("--broker-client-qps and --broker-client-burst must be positive, got %v and %d", o.ClientQPS, o.ClientBurst)
	}
	if o.OSBAddress != "" {
		if o.OSBCredentialsFile == "" {
			return errors.New("--broker-osb-address needs --broker-osb-credentials-file: the OSB API has no default password")
		}
		c, err := osb.LoadCredentials(o.OSBCredentialsFile)
		if err != nil {
			return fmt.Errorf("--broker-osb-credentials-file: %w", err)
		}
		o.osbCreds = c
		if (o.OSBCertFile == "") != (o.OSBKeyFile == "") {
			return errors.New("--broker-osb-tls-cert-file and --broker-osb-tls-private-key-file go together")
		}
		// Listening now reports a taken port before anything starts.
		l, err := net.Listen("tcp", o.OSBAddress)
		if err != nil {
			return fmt.Errorf("--broker-osb-address %s: %w", o.OSBAddress, err)
		}
		o.osbListener = l
	}
	o.fulfillmentDone = make(chan struct{})
	if !o.Fulfillment && o.OSBAddress == "" {
		return nil
	}
	cfg, err := o.workloadConfig()
	if err != nil {
		return err
	}
	o.workload = cfg
	return nil
}

// Close releases the OSB listener if the server never took it over.
func (o *BrokerOptions) Close() {
	if o.osbListener != nil {
		_ = o.osbListener.Close()
	}
}

func (o *BrokerOptions) workloadConfig() (*rest.Config, error) {
	if o.WorkloadKubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", o.WorkloadKubeconfig)
		if err != nil {
			return nil, fmt.Errorf("--broker-workload-kubeconfig %s: %w", o.WorkloadKubeconfig, err)
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("the broker (--broker-fulfillment or --broker-osb-address) without --broker-workload-kubeconfig needs the in-cluster configuration: %w", err)
	}
	return cfg, nil
}

// startFulfillment runs the operator against this server (its loopback client,
// handed to the handler chain in process) until ctx ends, while this replica
// leads the fulfillment election on mizar's etcd: two replicas never advance
// orders at once.
func (o *BrokerOptions) startFulfillment(ctx context.Context, loopback *rest.Config, handler http.Handler, etcd *clientv3.Client) error {
	identity := leader.NewIdentity()
	// The workload cluster's audit log names the replica that acted.
	cfg := rest.CopyConfig(o.workload)
	cfg.UserAgent = "mizar-broker-fulfillment/" + identity
	workload, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("workload cluster client: %w", err)
	}
	mizar, err := versioned.NewForConfig(inProcessConfig(o.loopback(loopback, "mizar-broker-fulfillment/"+identity), handler))
	if err != nil {
		return fmt.Errorf("loopback client: %w", err)
	}
	o.fulfillmentStarted.Store(true)
	go func() {
		defer close(o.fulfillmentDone)
		err := leader.Run(ctx, leader.Options{Etcd: etcd, Key: fulfillment.ElectionKey, Name: "Fulfillment operator", Identity: identity, LeaseFile: o.leaseFile},
			func(ctx context.Context) error {
				// A fresh operator each term: its caches start from what is there now.
				c, err := fulfillment.New(mizar, workload)
				if err != nil {
					return err
				}
				if o.events != nil {
					b := record.NewBroadcaster(record.WithContext(ctx))
					b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: o.events.CoreV1().Events("")})
					defer b.Shutdown()
					c.Events = b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "mizar-broker-fulfillment"})
				}
				return c.Run(ctx, o.Workers)
			})
		if err != nil {
			klog.ErrorS(err, "Fulfillment operator stopped")
		}
	}()
	return nil
}

// WaitFulfillment returns once the fulfillment operator, if it was started,
// has stopped (it uses the etcd client for its election).
func (o *BrokerOptions) WaitFulfillment() {
	if o.fulfillmentStarted.Load() {
		<-o.fulfillmentDone
	}
}

// startOSB serves the Open Service Broker API until ctx ends. It reaches this
// server through handler, the server's own handler chain; certFile/keyFile are
// the apiserver's serving pair, used unless the OSB API has its own.
func (o *BrokerOptions) startOSB(ctx context.Context, loopback *rest.Config, handler http.Handler, certFile, keyFile string) error {
	if o.OSBCertFile != "" {
		certFile, keyFile = o.OSBCertFile, o.OSBKeyFile
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		_ = o.osbListener.Close()
		return fmt.Errorf("OSB API serving certificate: %w", err)
	}
	workload, err := kubernetes.NewForConfig(o.workload)
	if err != nil {
		return fmt.Errorf("workload cluster client: %w", err)
	}
	// Handed to the handler chain in this process: the TLS and HTTP/2 of the
	// loopback connection were a fifth of a provision's CPU.
	mizar, err := versioned.NewForConfig(inProcessConfig(o.loopback(loopback, "mizar-broker-osb"), handler))
	if err != nil {
		return fmt.Errorf("loopback client: %w", err)
	}
	b := osb.New(mizar, workload, o.OSBNamespace)
	if err := b.Start(ctx); err != nil {
		return err
	}
	l := o.osbListener
	srv := &http.Server{
		Handler:           b.Handler(o.osbCreds, osb.KlogLogger()),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		// Platforms keep their connections (HTTP/1.1 keep-alive, or HTTP/2,
		// which ServeTLS offers) and resume TLS sessions by ticket; one left
		// idle this long is closed rather than held forever.
		IdleTimeout: 2 * time.Minute,
	}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() {
		if err := srv.ServeTLS(l, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.ErrorS(err, "OSB API stopped")
		}
	}()
	klog.InfoS("Serving the Open Service Broker API", "address", l.Addr().String())
	return nil
}
