// Command mizar-nodeagent runs on every droplet: it programs mizar's eBPF
// datapath from the API and serves mizar-cni (see pkg/nodeagent).
package main

import (
	"os"

	"github.com/spf13/cobra"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/component-base/cli"

	"mizar.dev/pkg/nodeagent"
)

func main() {
	opts := nodeagent.NewNodeOptions()
	cmd := &cobra.Command{
		Use:          "mizar-nodeagent",
		Short:        "Program this droplet's mizar datapath and serve the mizar CNI plugin",
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return opts.Run(cmd.Context())
		},
	}
	opts.AddFlags(cmd.Flags())
	cmd.SetContext(genericapiserver.SetupSignalContext())
	os.Exit(cli.Run(cmd))
}
