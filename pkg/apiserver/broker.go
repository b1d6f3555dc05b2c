package apiserver

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"mizar.dev/pkg/broker/fulfillment"
	"mizar.dev/pkg/generated/clientset/versioned"
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

	workload *rest.Config
}

// AddFlags registers the broker flags.
func (o *BrokerOptions) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.Fulfillment, "broker-fulfillment", o.Fulfillment,
		"Run the broker's fulfillment operator: ServiceInstances become a Secret, a headless Service and a StatefulSet in the workload cluster.")
	fs.StringVar(&o.WorkloadKubeconfig, "broker-workload-kubeconfig", o.WorkloadKubeconfig,
		"Kubeconfig of the workload cluster the broker provisions into. Empty: the in-cluster configuration.")
	fs.IntVar(&o.Workers, "broker-workers", 4, "Orders the fulfillment operator advances concurrently.")
}

// Complete checks the flags and loads the workload cluster's configuration, so
// a mistake is reported before anything starts.
func (o *BrokerOptions) Complete() error {
	if o.Workers < 1 {
		return fmt.Errorf("--broker-workers must be at least 1, got %d", o.Workers)
	}
	if !o.Fulfillment {
		return nil
	}
	cfg, err := o.workloadConfig()
	if err != nil {
		return err
	}
	o.workload = cfg
	return nil
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
		return nil, fmt.Errorf("--broker-fulfillment without --broker-workload-kubeconfig needs the in-cluster configuration: %w", err)
	}
	return cfg, nil
}

// startFulfillment runs the operator against this server (through its loopback
// client) until ctx ends.
func (o *BrokerOptions) startFulfillment(ctx context.Context, loopback *rest.Config) error {
	workload, err := kubernetes.NewForConfig(o.workload)
	if err != nil {
		return fmt.Errorf("workload cluster client: %w", err)
	}
	mizar, err := versioned.NewForConfig(loopback)
	if err != nil {
		return fmt.Errorf("loopback client: %w", err)
	}
	c, err := fulfillment.New(mizar, workload)
	if err != nil {
		return err
	}
	go func() {
		if err := c.Run(ctx, o.Workers); err != nil {
			klog.ErrorS(err, "Fulfillment operator stopped")
		}
	}()
	return nil
}
