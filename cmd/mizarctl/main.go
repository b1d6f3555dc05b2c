// Command mizarctl asks mizar how it is (see pkg/mizarctl). Installed as
// kubectl-mizar on PATH it is also the kubectl plugin: kubectl mizar status.
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"

	"mizar.dev/pkg/mizarctl"
)

func main() {
	use := "mizarctl"
	if strings.HasPrefix(filepath.Base(os.Args[0]), "kubectl-") {
		use = "kubectl mizar"
	}
	var kubeconfig, kubeContext string
	root := &cobra.Command{Use: use, Short: "Operate mizar: status of droplets, agents and networking objects", SilenceUsage: true, SilenceErrors: true}
	root.PersistentFlags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
	root.PersistentFlags().StringVar(&kubeContext, "context", "", "kubeconfig context to use")
	root.AddCommand(&cobra.Command{
		Use:   "status",
		Short: "Every droplet (node agent) and networking object: Provisioned or not, and why",
		Long: `status lists every droplet with its phase, the endpoints it hosts, the bouncers and
dividers it serves (Provisioned/total) and, when it is not Provisioned, why; then each kind's
objects by phase and every object not Provisioned with its first failing condition.
It exits 1 when anything is not Provisioned, 2 when mizar cannot be asked.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rules := clientcmd.NewDefaultClientConfigLoadingRules()
			rules.ExplicitPath = kubeconfig
			cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kubeContext}).ClientConfig()
			if err != nil {
				return fmt.Errorf("kubeconfig: %w", err)
			}
			return mizarctl.RunStatus(cmd.Context(), cfg, cmd.OutOrStdout())
		},
	})
	if err := root.Execute(); err != nil {
		if errors.Is(err, mizarctl.ErrNotHealthy) {
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(2)
	}
}
