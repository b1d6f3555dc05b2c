package mizarctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/utils/ptr"

	"mizar.dev/pkg/generated/clientset/versioned"
)

// AgentOptions say how mizarctl reaches the node agents.
type AgentOptions struct {
	// URLs are --agent droplet=URL pairs; when given, nothing is looked up.
	URLs []string
	// Namespace and Selector find the agent pods (the chart's DaemonSet).
	Namespace, Selector string
	// ServiceAccount (in Namespace) is whom mizarctl requests a token for
	// when an agent asks for one (AgentToken).
	ServiceAccount string
}

// Defaults of AgentOptions: the chart's namespace, its agent pods' label and
// the ServiceAccount it binds to the agents' debug endpoints.
const (
	DefaultAgentNamespace      = "mizar-system"
	DefaultAgentSelector       = "app.kubernetes.io/name=mizar-agent"
	DefaultAgentServiceAccount = "mizarctl"
)

// ConnectAgents returns the agents o names (--agent) or, without any, the
// agent pods found through cfg's cluster, each reached by a port-forward;
// either way with AgentToken as their token. cfg may be nil with URLs (no
// kubeconfig: agents without --debug-auth only). Close the result.
func ConnectAgents(ctx context.Context, cfg *rest.Config, o AgentOptions) (*Agents, error) {
	if len(o.URLs) > 0 {
		a, err := ParseAgents(o.URLs)
		if err != nil {
			return nil, err
		}
		if cfg != nil {
			a.WithToken(AgentToken(cfg, o.Namespace, o.ServiceAccount))
		}
		return a, nil
	}
	if cfg == nil {
		return nil, errors.New("no kubeconfig to find the agents with, and no --agent droplet=URL")
	}
	c, err := versioned.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	a, err := ForwardAgents(ctx, cfg, c, o.Namespace, o.Selector)
	if err != nil {
		return nil, err
	}
	return a.WithToken(AgentToken(cfg, o.Namespace, o.ServiceAccount)), nil
}

// ForwardAgents finds the agent pods (selector, in namespace) and reaches
// each through the API server: a port-forward (pods/portforward, as kubectl
// port-forward; RBAC: create pods/portforward in namespace, an admin's
// right) from a local port to the pod's health port. Agents run on the host
// network and listen on the node's loopback; a port-forward to a
// host-network pod is dialed by the node's container runtime in the node's
// own network namespace, on localhost, so the agent need not listen
// anywhere else. A pod's droplet is the Droplet of its node (spec.node;
// in-cluster the agent names its Droplet after the node). An agent pod that
// is not running, or whose forward fails, is kept with the reason, so
// callers report it per droplet.
func ForwardAgents(ctx context.Context, cfg *rest.Config, c versioned.Interface, namespace, selector string) (*Agents, error) {
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	pods, err := kc.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, fmt.Errorf("listing the agent pods (%s in %s; or pass --agent droplet=URL): %w", selector, namespace, err)
	}
	if len(pods.Items) == 0 {
		return nil, fmt.Errorf("no agent pods (%s) in namespace %s: set --agent-namespace/--agent-selector, or pass --agent droplet=URL", selector, namespace)
	}
	dropletOf := map[string]string{} // node -> droplet
	if ds, err := c.NetworkingV1alpha1().Droplets().List(ctx, metav1.ListOptions{}); err == nil {
		for _, d := range ds.Items {
			dropletOf[d.Spec.Node] = d.Name
		}
	}
	// Running pods first: during a rolling update a node may have two.
	slices.SortFunc(pods.Items, func(x, y corev1.Pod) int {
		if rx, ry := x.Status.Phase == corev1.PodRunning, y.Status.Phase == corev1.PodRunning; rx != ry {
			if rx {
				return -1
			}
			return 1
		}
		return strings.Compare(x.Name, y.Name)
	})
	a := newAgents(fmt.Sprintf("no agent pod (%s) in %s runs on its node", selector, namespace))
	var mu sync.Mutex
	var wg sync.WaitGroup
	seen := map[string]bool{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName == "" {
			continue
		}
		droplet := dropletOf[p.Spec.NodeName]
		if droplet == "" {
			droplet = p.Spec.NodeName
		}
		if seen[droplet] {
			continue
		}
		seen[droplet] = true
		via := "pod " + p.Namespace + "/" + p.Name + " on node " + p.Spec.NodeName
		port, err := healthPort(p)
		if p.Status.Phase != corev1.PodRunning {
			err = fmt.Errorf("it is %s, not Running", p.Status.Phase)
		}
		if err != nil {
			mu.Lock()
			a.why[droplet] = via + ": " + err.Error()
			mu.Unlock()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			url, stop, err := forward(ctx, cfg, kc, p, port)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				a.why[droplet] = fmt.Sprintf("%s: %v", via, err)
				return
			}
			a.urls[droplet], a.via[droplet] = url, fmt.Sprintf("%s, port-forward to :%d", via, port)
			a.stops = append(a.stops, stop)
		}()
	}
	wg.Wait()
	return a, nil
}

// healthPort is the port of the pod's --health-addr (the chart passes it
// to the agent's container), else its readiness probe's.
func healthPort(p *corev1.Pod) (int, error) {
	for _, c := range p.Spec.Containers {
		for _, arg := range slices.Concat(c.Command, c.Args) {
			if v, ok := strings.CutPrefix(arg, "--health-addr="); ok {
				_, port, err := net.SplitHostPort(v)
				if err != nil {
					return 0, fmt.Errorf("--health-addr=%s: %w", v, err)
				}
				return strconv.Atoi(port)
			}
		}
	}
	for _, c := range p.Spec.Containers {
		if pr := c.ReadinessProbe; pr != nil && pr.HTTPGet != nil && pr.HTTPGet.Port.IntValue() > 0 {
			return pr.HTTPGet.Port.IntValue(), nil
		}
	}
	return 0, errors.New("no --health-addr argument and no HTTP readiness probe: cannot tell the agent's health port")
}

// forwardTimeout bounds setting up one port-forward.
const forwardTimeout = 30 * time.Second

// forward opens a local port on loopback forwarded to p's port through the
// API server, and returns its URL and what closes it.
func forward(ctx context.Context, cfg *rest.Config, kc kubernetes.Interface, p *corev1.Pod, port int) (string, func(), error) {
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return "", nil, err
	}
	u := kc.CoreV1().RESTClient().Post().Resource("pods").Namespace(p.Namespace).Name(p.Name).SubResource("portforward").URL()
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	stop, ready := make(chan struct{}), make(chan struct{})
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("0:%d", port)}, stop, ready, io.Discard, io.Discard)
	if err != nil {
		return "", nil, err
	}
	errc := make(chan error, 1)
	go func() { errc <- fw.ForwardPorts() }()
	var once sync.Once
	closeFw := func() { once.Do(func() { close(stop) }) }
	select {
	case <-ready:
	case err := <-errc:
		return "", nil, fmt.Errorf("port-forward: %w", err)
	case <-ctx.Done():
		closeFw()
		return "", nil, ctx.Err()
	case <-time.After(forwardTimeout):
		closeFw()
		return "", nil, fmt.Errorf("port-forward not ready after %v", forwardTimeout)
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) == 0 {
		closeFw()
		return "", nil, fmt.Errorf("port-forward: no local port (%v)", err)
	}
	return fmt.Sprintf("http://127.0.0.1:%d", ports[0].Local), closeFw, nil
}

// AgentTokenLifetime is how long the tokens AgentToken requests live (the
// least the API grants).
const AgentTokenLifetime = 10 * time.Minute

// AgentToken is how mizarctl authenticates to agents that check their
// callers (--debug-auth: TokenReview + SubjectAccessReview of get/post on
// /mizar-agent/*). It requests a short-lived token (TokenRequest,
// AgentTokenLifetime) for the ServiceAccount namespace/serviceAccount, which
// the chart creates and binds to the agents' debug endpoints: whoever RBAC
// lets create serviceaccounts/token there (an admin of mizar's namespace)
// may debug the agents, whatever their own credential is (kind's admin
// kubeconfig holds a client certificate, which no agent could verify, and
// no token), and the agents, which sit on every node, never see the user's
// own credential, only a token that expires in minutes and opens nothing
// but the agents. When the token cannot be requested (no such
// ServiceAccount: an install without the chart), the kubeconfig's own
// bearer token, if it has one, is sent instead.
func AgentToken(cfg *rest.Config, namespace, serviceAccount string) TokenSource {
	return func(ctx context.Context) (string, error) {
		kc, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return "", err
		}
		tr, err := kc.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, serviceAccount,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(AgentTokenLifetime.Seconds()))}}, metav1.CreateOptions{})
		if err == nil {
			return tr.Status.Token, nil
		}
		err = fmt.Errorf("requesting a token for ServiceAccount %s/%s: %w", namespace, serviceAccount, err)
		switch {
		case cfg.BearerToken != "":
			return cfg.BearerToken, nil
		case cfg.BearerTokenFile != "":
			b, ferr := os.ReadFile(cfg.BearerTokenFile)
			if ferr != nil {
				return "", errors.Join(err, ferr)
			}
			return strings.TrimSpace(string(b)), nil
		}
		return "", err
	}
}
