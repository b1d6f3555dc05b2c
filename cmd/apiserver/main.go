// Command mizar-apiserver serves networking.mizar.dev from its own etcd.
package main

import (
	"os"

	"github.com/spf13/cobra"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/component-base/cli"

	"mizar.dev/pkg/apiserver"
)

func main() {
	opts := apiserver.NewOptions()
	cmd := &cobra.Command{
		Use:   "mizar-apiserver",
		Short: "Serve mizar's VPC network API (networking.mizar.dev)",
		Long: `mizar-apiserver serves networking.mizar.dev from its own etcd.

By default it runs as an aggregated API server behind kube-apiserver, delegating
authentication and authorization to it. With --standalone it serves on loopback
only, with its own CA, and writes an admin kubeconfig to <data-dir>/kubeconfig.
Without --etcd-servers it runs an embedded etcd in <data-dir>/etcd.`,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return opts.Run(cmd.Context())
		},
	}
	opts.AddFlags(cmd.Flags())
	cmd.SetContext(genericapiserver.SetupSignalContext())
	os.Exit(cli.Run(cmd))
}
