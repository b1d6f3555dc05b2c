package mizarctl_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	spdystream "k8s.io/apimachinery/pkg/util/httpstream/spdy"
	"k8s.io/client-go/kubernetes"

	"mizar.dev/pkg/mizarctl"
	"mizar.dev/test/workloadcluster"
)

// fakeKubelet serves kubelet's port-forward (SPDY, portforward.k8s.io) the
// way containerd does it for a host-network pod: each forwarded connection
// is dialed on localhost:<port> of the machine. It returns its port.
func fakeKubelet(t *testing.T) int32 {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/portForward/") {
			http.NotFound(w, r)
			return
		}
		if _, err := httpstream.Handshake(r, w, []string{"portforward.k8s.io"}); err != nil {
			return
		}
		var mu sync.Mutex
		errStreams := map[string]httpstream.Stream{}
		conn := spdystream.NewResponseUpgrader().UpgradeResponse(w, r, func(s httpstream.Stream, replySent <-chan struct{}) error {
			id := s.Headers().Get(corev1.PortForwardRequestIDHeader)
			if s.Headers().Get(corev1.StreamType) == corev1.StreamTypeError {
				mu.Lock()
				errStreams[id] = s
				mu.Unlock()
				return nil
			}
			go func() {
				<-replySent
				mu.Lock()
				es := errStreams[id]
				delete(errStreams, id)
				mu.Unlock()
				defer s.Close()
				if es != nil {
					defer es.Close()
				}
				c, err := net.Dial("tcp4", "localhost:"+s.Headers().Get(corev1.PortHeader))
				if err != nil {
					if es != nil {
						_, _ = es.Write([]byte(err.Error()))
					}
					return
				}
				defer c.Close()
				go func() {
					_, _ = io.Copy(c, s)
					_ = c.(*net.TCPConn).CloseWrite()
				}()
				_, _ = io.Copy(s, c)
			}()
			return nil
		})
		if conn == nil {
			return
		}
		<-conn.CloseChan()
	}))
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	return int32(p)
}

// Without --agent, end to end through a real kube-apiserver: mizarctl finds
// the agent pod by its label, maps its node to its droplet, port-forwards
// through the API server (pods/portforward, proxied to the node's kubelet,
// here a stand-in that dials the node's loopback as containerd does for a
// host-network pod) to the agent's loopback-only health address, is
// refused 401 by the agent's --debug-auth, requests a token for the
// ServiceAccount mizarctl, and is served as that ServiceAccount.
func TestMizarctlReachesAgentThroughPortForward(t *testing.T) {
	wc := workloadcluster.StartAPIServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kc, err := kubernetes.NewForConfig(wc.Admin)
	if err != nil {
		t.Fatal(err)
	}
	ns := mizarctl.DefaultAgentNamespace
	// The agent: --debug-auth, on loopback only.
	agent, servedBy := debugAuthAgent(t, ctx, kc, wc.Admin, ns, "default", "node-pf", 42)
	defer agent.Close()
	_, agentPort, _ := net.SplitHostPort(agent.Listener.Addr().String())

	// Its node, whose kubelet answers port-forwards, and its pod.
	node, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-pf"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}
	node.Status.DaemonEndpoints.KubeletEndpoint.Port = fakeKubelet(t)
	if _, err := kc.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "mizar-agent-pf", Namespace: ns, Labels: map[string]string{"app.kubernetes.io/name": "mizar-agent"}},
		Spec: corev1.PodSpec{NodeName: node.Name, HostNetwork: true, Containers: []corev1.Container{{Name: "agent", Image: "agent",
			Command: []string{"/mizar-nodeagent"}, Args: []string{"--node-name=$(NODE_NAME)", "--health-addr=127.0.0.1:" + agentPort, "--debug-auth"}}}}}
	if pod, err = kc.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodRunning
	if _, err := kc.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	a, err := mizarctl.ConnectAgents(ctx, wc.Admin, mizarctl.AgentOptions{Namespace: ns, Selector: mizarctl.DefaultAgentSelector, ServiceAccount: mizarctl.DefaultAgentServiceAccount})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if got := strings.Join(a.Names(), " "); got != "node-pf" {
		t.Fatalf("agents: %q, want node-pf", got)
	}
	for i := range 3 {
		rs, err := mizarctl.Drops(ctx, a, time.Time{}, 0)
		if err != nil || len(rs) != 1 || rs[0].Total != 42 {
			t.Fatalf("drops #%d through the port-forward: %v %+v", i+1, err, rs)
		}
	}
	want := "system:serviceaccount:" + ns + ":" + mizarctl.DefaultAgentServiceAccount
	if served := servedBy(); len(served) != 3 || served[0] != want || served[2] != want {
		t.Errorf("the agent served %q, want 3 calls as %s", servedBy(), want)
	}
	t.Logf("3 calls through the API server's port-forward to %s, served as %s", agent.Listener.Addr(), want)
}
