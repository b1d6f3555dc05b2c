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
	cmd.AddCommand(dropletKubeconfigCommand())
	cmd.SetContext(genericapiserver.SetupSignalContext())
	os.Exit(cli.Run(cmd))
}

// dropletKubeconfigCommand issues a node agent's identity from the standalone CA.
func dropletKubeconfigCommand() *cobra.Command {
	var dataDir, droplet, out string
	c := &cobra.Command{
		Use:   "droplet-kubeconfig",
		Short: "Write a kubeconfig that authenticates as one droplet (standalone mode)",
		Long: `droplet-kubeconfig issues a client certificate from the standalone server's CA
for user mizar:droplet:<droplet> in group mizar:droplets and writes a kubeconfig
with it. A node agent using it may write only its own droplet's objects.`,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(*cobra.Command, []string) error {
			return apiserver.IssueDropletKubeconfig(dataDir, droplet, out)
		},
	}
	c.Flags().StringVar(&dataDir, "data-dir", "/var/lib/mizar", "The standalone server's data directory.")
	c.Flags().StringVar(&droplet, "droplet", "", "The droplet's name.")
	c.Flags().StringVar(&out, "out", "", "Where to write the kubeconfig.")
	_ = c.MarkFlagRequired("droplet")
	_ = c.MarkFlagRequired("out")
	return c
}
