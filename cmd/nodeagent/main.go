// Command mizar-nodeagent runs on every droplet: it programs mizar's eBPF
// datapath from the API and serves mizar-cni (see pkg/nodeagent).
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/component-base/cli"
	"k8s.io/klog/v2"

	"mizar.dev/pkg/nodeagent"
)

func main() {
	opts := nodeagent.NewNodeOptions()
	cmd := &cobra.Command{
		Use:          "mizar-nodeagent",
		Short:        "Program this droplet's mizar datapath and serve the mizar CNI plugin",
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return opts.Run(cmd.Context())
		},
	}
	opts.AddFlags(cmd.Flags())
	cmd.AddCommand(installCNICommand(), uninstallCNICommand())
	cmd.SetContext(genericapiserver.SetupSignalContext())
	os.Exit(cli.Run(cmd))
}

// installCNICommand copies the plugin into the host's CNI bin directory: the
// DaemonSet's init container. The conflist comes later, from the agent, once
// the node's Droplet is Provisioned.
func installCNICommand() *cobra.Command {
	var binDir, plugin string
	var ifAbsent []string
	var check bool
	c := &cobra.Command{
		Use:   "install-cni",
		Short: "Install the mizar CNI plugin into the host's CNI bin directory (atomically)",
		Long: `install-cni copies --plugin to <cni-bin-dir>/` + nodeagent.PluginName + ` (write, then rename), and each
--plugin-if-absent file (e.g. portmap, which the conflist chains) under its own name
unless the node already has one. The conflist is written by the agent itself once
this node's Droplet is Provisioned, so the node turns Ready only then.`,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(*cobra.Command, []string) error {
			if !filepath.IsAbs(binDir) || plugin == "" {
				return fmt.Errorf("--cni-bin-dir must be an absolute path and --plugin set, got %q and %q", binDir, plugin)
			}
			if check {
				return nil
			}
			if err := nodeagent.InstallFile(plugin, binDir, nodeagent.PluginName, 0o755); err != nil {
				return err
			}
			klog.InfoS("Installed the CNI plugin", "dir", binDir, "name", nodeagent.PluginName)
			for _, p := range ifAbsent {
				installed, err := nodeagent.InstallFileIfAbsent(p, binDir)
				if err != nil {
					return err
				}
				klog.InfoS("CNI plugin", "path", p, "installed", installed)
			}
			return nil
		},
	}
	c.Flags().StringVar(&binDir, "cni-bin-dir", "/opt/cni/bin", "the host's CNI plugin directory, as this container sees it")
	c.Flags().StringVar(&plugin, "plugin", "/opt/mizar/bin/mizar", "the plugin binary to install")
	c.Flags().StringSliceVar(&ifAbsent, "plugin-if-absent", nil, "other plugin binaries to install under their own names when the node has none")
	c.Flags().BoolVar(&check, "check-flags", false, "validate the flags and exit 0 if they are valid, without touching the node")
	return c
}

// uninstallCNICommand removes everything mizar put on a node, at once: for an
// operator cleaning up by hand (the agent does it itself when its DaemonSet is
// deleted).
func uninstallCNICommand() *cobra.Command {
	o := nodeagent.NewNodeOptions()
	var check bool
	c := &cobra.Command{
		Use:   "uninstall-cni",
		Short: "Remove mizar's conflist, plugin, BPF pins and CNI state from this node",
		Long: `uninstall-cni removes the conflist first (kubelet stops sending pods to mizar and
the node turns NotReady), then the plugin, the BPF pins (which detaches mizar's
programs), the CNI state, the delete queue, the socket directory and the host
path's device pair and nftables table. Pods on the node lose their network. Run it only where no mizar-nodeagent runs any more.`,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(*cobra.Command, []string) error {
			if check {
				return nil
			}
			return o.Uninstall().Run()
		},
	}
	fs := c.Flags()
	o.AddStateFlags(fs)
	fs.BoolVar(&check, "check-flags", false, "validate the flags and exit 0 if they are valid, without touching the node")
	return c
}
