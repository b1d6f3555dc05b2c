// Command mizarctl asks mizar how it is (see pkg/mizarctl). Installed as
// kubectl-mizar on PATH it is also the kubectl plugin: kubectl mizar status.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"mizar.dev/pkg/generated/clientset/versioned"
	"mizar.dev/pkg/mizarctl"
	"mizar.dev/pkg/mizarctl/ui"
)

func main() {
	use := "mizarctl"
	if strings.HasPrefix(filepath.Base(os.Args[0]), "kubectl-") {
		use = "kubectl mizar"
	}
	var kubeconfig, kubeContext string
	var agentFlags []string
	agentOpts := mizarctl.AgentOptions{}
	root := &cobra.Command{Use: use, Short: "Operate mizar: status of droplets, agents and networking objects", SilenceUsage: true, SilenceErrors: true}
	root.PersistentFlags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
	root.PersistentFlags().StringVar(&kubeContext, "context", "", "kubeconfig context to use")
	root.PersistentFlags().StringArrayVar(&agentFlags, "agent", nil, "droplet=URL of a node agent's --health-addr (repeat per droplet), for what only agents know: drops, trace, "+
		"connectivity-test, sysdump. Default: every agent pod (--agent-namespace, --agent-selector), each through a port-forward of the API server (RBAC: create pods/portforward there)")
	root.PersistentFlags().StringVar(&agentOpts.Namespace, "agent-namespace", mizarctl.DefaultAgentNamespace, "namespace of the agent pods and of --agent-service-account")
	root.PersistentFlags().StringVar(&agentOpts.Selector, "agent-selector", mizarctl.DefaultAgentSelector, "label selector of the agent pods")
	root.PersistentFlags().StringVar(&agentOpts.ServiceAccount, "agent-service-account", mizarctl.DefaultAgentServiceAccount, "ServiceAccount (in --agent-namespace) "+
		"mizarctl requests a short-lived token for when an agent asks for one (agents with --debug-auth; RBAC: create serviceaccounts/token there); "+
		"without it, the kubeconfig's bearer token, if any, is sent")
	config := func() (*rest.Config, error) {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		rules.ExplicitPath = kubeconfig
		cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kubeContext}).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("kubeconfig: %w", err)
		}
		return cfg, nil
	}
	// connectAgents reaches the node agents (close them); with --agent and no
	// kubeconfig, those agents must not ask for a token.
	connectAgents := func(ctx context.Context) (*mizarctl.Agents, error) {
		o := agentOpts
		o.URLs = agentFlags
		cfg, err := config()
		if err != nil {
			if len(o.URLs) == 0 {
				return nil, err
			}
			cfg = nil
		}
		return mizarctl.ConnectAgents(ctx, cfg, o)
	}
	client := func() (versioned.Interface, error) {
		cfg, err := config()
		if err != nil {
			return nil, err
		}
		return versioned.NewForConfig(cfg)
	}
	root.AddCommand(&cobra.Command{
		Use:   "status",
		Short: "Every droplet (node agent) and networking object: Provisioned or not, and why",
		Long: `status lists every droplet with its phase, the endpoints it hosts, the bouncers and
dividers it serves (Provisioned/total) and, when it is not Provisioned, why; then each kind's
objects by phase and every object not Provisioned with its first failing condition.
It exits 1 when anything is not Provisioned, 2 when mizar cannot be asked.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config()
			if err != nil {
				return err
			}
			return mizarctl.RunStatus(cmd.Context(), cfg, cmd.OutOrStdout())
		},
	})

	var to, proto, src string
	var port uint16
	traceCmd := &cobra.Command{
		Use:   "trace <namespace/pod> --to <address|namespace/pod>",
		Short: "The path a packet from a pod takes, node by node, or where and why it is dropped",
		Long: `trace runs a packet through the programs and maps of each node it reaches (the
agents' BPF_PROG_TEST_RUN: the real code decides, nothing is sent): the sending pod's node first,
then every node the packet goes to over the underlay, until it is delivered, dropped (with the
reason: the counter a real packet would move) or leaves the overlay. Asks the agent of each droplet
on the way (see --agent). Exits 1 when the packet is dropped.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			agents, err := connectAgents(cmd.Context())
			if err != nil {
				return err
			}
			defer agents.Close()
			r, err := mizarctl.Trace(cmd.Context(), c, agents, mizarctl.TraceOptions{From: args[0], To: to, Proto: proto, Port: port, Src: src})
			if r != nil {
				if perr := r.Print(cmd.OutOrStdout()); perr != nil {
					return perr
				}
			}
			if err != nil {
				return err
			}
			if r.Dropped() != "" {
				return mizarctl.ErrDropped
			}
			return nil
		},
	}
	traceCmd.Flags().StringVar(&to, "to", "", "destination: an IPv4 address or a pod (namespace/name)")
	traceCmd.Flags().StringVar(&proto, "proto", "tcp", "tcp (a SYN), udp or icmp (an echo request)")
	traceCmd.Flags().Uint16Var(&port, "port", 80, "destination port (tcp, udp)")
	traceCmd.Flags().StringVar(&src, "src", "", "source address to write instead of the pod's own (a spoofed packet)")
	_ = traceCmd.MarkFlagRequired("to")
	root.AddCommand(traceCmd)

	var since time.Duration
	var wait time.Duration
	dropsCmd := &cobra.Command{
		Use:   "drops",
		Short: "Dropped packets the nodes' programs reported (reason, addresses, VNI), from every agent",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			agents, err := connectAgents(cmd.Context())
			if err != nil {
				return err
			}
			defer agents.Close()
			var from time.Time
			if since > 0 {
				from = time.Now().Add(-since)
			}
			rs, err := mizarctl.Drops(cmd.Context(), agents, from, wait)
			if perr := mizarctl.PrintDrops(cmd.OutOrStdout(), rs); perr != nil {
				return perr
			}
			return err // the agents that did not answer, after the others' events
		},
	}
	dropsCmd.Flags().DurationVar(&since, "since", 0, "only events of the last duration (0: all the agents keep)")
	dropsCmd.Flags().DurationVar(&wait, "wait", 0, "wait up to this long for an event")
	root.AddCommand(dropsCmd)

	root.AddCommand(&cobra.Command{
		Use:   "connectivity-test",
		Short: "Real pings between pods of every pair of droplets (same VPC: answered; other VPCs: not), with a table",
		Long: `connectivity-test checks every droplet's agent (see --agent) and Droplet, then, from one Provisioned pod
of each droplet and VPC, has the agent ping (from inside that pod) the probe pod of every other
droplet: of the same VPC it must answer, of another VPC it must not. Exits 1 when anything fails.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			agents, err := connectAgents(cmd.Context())
			if err != nil {
				return err
			}
			defer agents.Close()
			r, err := mizarctl.ConnectivityTest(cmd.Context(), c, agents)
			if err != nil {
				return err
			}
			if err := r.Print(cmd.OutOrStdout()); err != nil {
				return err
			}
			if !r.Passed() {
				return mizarctl.ErrConnectivity
			}
			return nil
		},
	})

	var out, podSelector string
	var logs []string
	sysdumpCmd := &cobra.Command{
		Use:   "sysdump",
		Short: "One tarball of what a bug report needs: objects, events, status, and every agent's maps, drops, metrics and logs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config()
			if err != nil {
				return err
			}
			// A sysdump of a broken cluster is the one most needed: without
			// agents it still holds the API's objects.
			agents, err := connectAgents(cmd.Context())
			if err != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: no agent state in the sysdump: %v\n", err)
				agents, _ = mizarctl.ParseAgents(nil)
			}
			defer agents.Close()
			o := mizarctl.SysdumpOptions{Logs: map[string]string{}, PodSelector: podSelector}
			for _, l := range logs {
				d, path, ok := strings.Cut(l, "=")
				if !ok {
					return fmt.Errorf("--log %q: want droplet=path", l)
				}
				o.Logs[d] = path
			}
			if out == "" {
				out = "mizar-sysdump-" + time.Now().UTC().Format("20060102-150405") + ".tar.gz"
			}
			f, err := os.Create(out)
			if err != nil {
				return err
			}
			names, err := mizarctl.Sysdump(cmd.Context(), cfg, agents, o, f)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Wrote %s: %d files\n", out, len(names))
			return nil
		},
	}
	sysdumpCmd.Flags().StringVarP(&out, "output", "o", "", "tarball to write (default mizar-sysdump-<time>.tar.gz)")
	sysdumpCmd.Flags().StringArrayVar(&logs, "log", nil, "droplet=path of an agent's log file on this machine (repeat)")
	sysdumpCmd.Flags().StringVar(&podSelector, "pod-selector", "app.kubernetes.io/name in (mizar-agent,mizar-apiserver,mizar-etcd)", "label selector of the pods whose logs to include (empty: none)")
	root.AddCommand(sysdumpCmd)

	var listen string
	uiCmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve a live page of the network: VPCs, subnets, endpoints, droplets and orders with their phases",
		Long: `ui watches mizar with the kubeconfig's credentials and serves a page that draws every VPC
with its subnets and their endpoints (IP, MAC, droplet, phase), the droplets with their phase and
agent heartbeat, the broker's orders with their saga steps, and how many objects of each kind are
not Provisioned; it follows changes live. Read-only.
The page shows everything the kubeconfig's user can read to whoever can reach --listen: keep the
default loopback address unless that is meant.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return ui.Serve(ctx, cfg, listen, func(url string) {
				fmt.Fprintf(cmd.OutOrStdout(), "Serving %s (Ctrl-C to stop)\n", url)
			})
		},
	}
	uiCmd.Flags().StringVar(&listen, "listen", "127.0.0.1:8090", "address to serve the page on (it exposes what the kubeconfig can read)")
	root.AddCommand(uiCmd)

	if err := root.Execute(); err != nil {
		if errors.Is(err, mizarctl.ErrNotHealthy) || errors.Is(err, mizarctl.ErrDropped) || errors.Is(err, mizarctl.ErrConnectivity) {
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(2)
	}
}
