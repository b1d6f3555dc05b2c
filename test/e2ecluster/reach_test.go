package e2ecluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
)

// wgetCmd fetches url from inside a pod or node, bounded by timeout(1):
// busybox-static 1.35's `wget -T` segfaults on a timeout.
func wgetCmd(url string, seconds int) []string {
	return []string{"timeout", strconv.Itoa(seconds), "wget", "-q", "-O", "-", url}
}

// checkNodesToPods: every node (its host network, as kube-apiserver reaching
// an aggregated API's pods, or kubelet probing) reaches a test pod on each
// other node through the host path.
func (w *workload) checkNodesToPods(ctx context.Context, t *testing.T) {
	nodes, err := w.e.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		reached := 0
		for _, p := range w.podPerNode() {
			if p.Spec.NodeName == n.Name {
				continue
			}
			url := fmt.Sprintf("http://%s/hostname", net.JoinHostPort(p.Status.PodIP, strconv.Itoa(httpPort)))
			out, err := w.e.node(ctx, n.Name, append([]string{"busybox"}, wgetCmd(url, 10)...)...)
			if err != nil || strings.TrimSpace(out) != p.Name {
				t.Errorf("node %s -> pod %s on %s (%s): %v %q", n.Name, p.Name, p.Spec.NodeName, url, err, out)
				continue
			}
			reached++
		}
		t.Logf("node %s reached pods on %d other nodes", n.Name, reached)
	}
}

// podPerNode is one test pod on each node that runs any.
func (w *workload) podPerNode() []corev1.Pod {
	seen := map[string]bool{}
	var out []corev1.Pod
	for _, p := range w.pods {
		if !seen[p.Spec.NodeName] {
			seen[p.Spec.NodeName] = true
			out = append(out, p)
		}
	}
	return out
}

// checkHostPort: a pod's hostPort (portmap, chained after mizar in the
// conflist) answers on its node's address from the host outside the cluster.
func (w *workload) checkHostPort(ctx context.Context, t *testing.T) {
	name := "hostport-" + rand.String(5)
	hostPort := int32(31000 + rand.Intn(900))
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr(int64(1)),
			Containers: []corev1.Container{{
				Name: "netexec", Image: w.e.image, ImagePullPolicy: corev1.PullNever,
				Args:  []string{"netexec", "--http-port=" + strconv.Itoa(httpPort), "--udp-port=-1"},
				Ports: []corev1.ContainerPort{{ContainerPort: httpPort, HostPort: hostPort, Protocol: corev1.ProtocolTCP}},
			}},
		},
	}
	p := w.runPod(ctx, t, pod)
	if p == nil {
		return
	}
	node, err := w.e.cs.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("http://%s/hostname", net.JoinHostPort(nodeIP(node), strconv.Itoa(int(hostPort))))
	got, err := httpGet(ctx, url)
	if err != nil || got != name {
		t.Errorf("hostPort %s of pod %s on %s, from the host: %v %q", url, name, p.Spec.NodeName, err, got)
		return
	}
	t.Logf("hostPort %d of %s on %s answered from the host", hostPort, name, p.Spec.NodeName)
}

// runPod creates pod in the test namespace, waits until it runs with an
// address and returns it (nil, with the test failed, if it does not).
func (w *workload) runPod(ctx context.Context, t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	pods := w.e.cs.CoreV1().Pods(w.ns)
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod %s: %v", pod.Name, err)
	}
	var p *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		p, err = pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		c := podCondition(p, corev1.PodReady)
		return p.Status.PodIP != "" && c != nil && c.Status == corev1.ConditionTrue, nil
	})
	if err != nil {
		t.Errorf("pod %s did not run within 3 minutes: %s", pod.Name, w.whyNotReady(ctx))
		return nil
	}
	return p
}

// httpGet returns the body of a GET from this process (outside the cluster).
func httpGet(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return strings.TrimSpace(string(b)), err
}

// checkSecondVPCIsolated: two pods placed in another VPC (by the
// mizar.dev/vpc and mizar.dev/subnet annotations) on different nodes reach
// each other; neither reaches the default VPC's pods or its Service, and the
// default VPC's pods do not reach them.
func (w *workload) checkSecondVPCIsolated(ctx context.Context, t *testing.T) {
	suffix := rand.String(5)
	vpc, subnet := "e2e-vpc-"+suffix, "e2e-subnet-"+suffix
	manifest := fmt.Sprintf(`apiVersion: networking.mizar.dev/v1alpha1
kind: Vpc
metadata: {name: %s}
spec: {cidr: 10.250.0.0/16}
---
apiVersion: networking.mizar.dev/v1alpha1
kind: Subnet
metadata: {name: %s}
spec: {vpc: %s, cidr: 10.250.1.0/24}
`, vpc, subnet, vpc)
	if _, err := w.e.kubectlStdin(ctx, manifest, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		// The pods first: their Endpoints hold the subnet, the subnet the VPC.
		_, _ = w.e.kubectlRun(ctx, "delete", "pod", "-n", w.ns, "-l", "vpc="+vpc, "--wait=true", "--timeout=90s")
		_, _ = w.e.kubectlRun(ctx, "delete", "subnets.networking.mizar.dev", subnet, "--wait=true", "--timeout=60s")
		_, _ = w.e.kubectlRun(ctx, "delete", "vpcs.networking.mizar.dev", vpc, "--wait=true", "--timeout=60s")
	})
	if _, err := w.e.kubectlRun(ctx, "wait", "--for=condition=Ready", "subnets.networking.mizar.dev/"+subnet, "vpcs.networking.mizar.dev/"+vpc, "--timeout=120s"); err != nil {
		t.Fatal(err)
	}
	peers := w.podPerNode()
	if len(peers) < 2 {
		t.Fatalf("the test pods run on %d node(s), want 2 or more", len(peers))
	}
	var iso []*corev1.Pod
	for i, node := range []string{peers[0].Spec.NodeName, peers[1].Spec.NodeName} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", vpc, i), Labels: map[string]string{"vpc": vpc},
				Annotations: map[string]string{"mizar.dev/vpc": vpc, "mizar.dev/subnet": subnet}},
			Spec: corev1.PodSpec{
				NodeName:                      node,
				Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
				TerminationGracePeriodSeconds: ptr(int64(1)),
				Containers: []corev1.Container{{
					Name: "netexec", Image: w.e.image, ImagePullPolicy: corev1.PullNever,
					Args: []string{"netexec", "--http-port=" + strconv.Itoa(httpPort), "--udp-port=-1"},
				}},
			},
		}
		p := w.runPod(ctx, t, pod)
		if p == nil {
			return
		}
		if !strings.HasPrefix(p.Status.PodIP, "10.250.1.") {
			t.Errorf("pod %s in VPC %s got %s, want an address of subnet 10.250.1.0/24", p.Name, vpc, p.Status.PodIP)
		}
		iso = append(iso, p)
	}
	svc, err := w.e.cs.CoreV1().Services(w.ns).Get(ctx, "mesh", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reach := func(from string, ip string, port int) (string, error) {
		url := fmt.Sprintf("http://%s/hostname", net.JoinHostPort(ip, strconv.Itoa(port)))
		return w.e.exec(ctx, w.ns, from, wgetCmd(url, 4)...)
	}
	// Inside the VPC, across nodes, both ways.
	for i, a := range iso {
		b := iso[1-i]
		if out, err := reach(a.Name, b.Status.PodIP, httpPort); err != nil || strings.TrimSpace(out) != b.Name {
			t.Errorf("%s (%s) -> %s (%s) in VPC %s: %v %q", a.Name, a.Spec.NodeName, b.Name, b.Spec.NodeName, vpc, err, out)
		}
	}
	// Across VPCs: nothing, either way, and not the default VPC's Service.
	for _, a := range iso {
		for _, b := range peers {
			if out, err := reach(a.Name, b.Status.PodIP, httpPort); err == nil {
				t.Errorf("%s in VPC %s reached %s (%s) of the default VPC: %q", a.Name, vpc, b.Name, b.Status.PodIP, out)
			}
			if out, err := reach(b.Name, a.Status.PodIP, httpPort); err == nil {
				t.Errorf("%s of the default VPC reached %s (%s) in VPC %s: %q", b.Name, a.Name, a.Status.PodIP, vpc, out)
			}
		}
		if out, err := reach(a.Name, svc.Spec.ClusterIP, 80); err == nil {
			t.Errorf("%s in VPC %s reached the default VPC's Service mesh (%s): %q", a.Name, vpc, svc.Spec.ClusterIP, out)
		}
	}
}

// checkServicesNftables switches kube-proxy to its nftables mode and checks
// Services and DNS again: the host path must work with either.
func (w *workload) checkServicesNftables(ctx context.Context, t *testing.T) {
	cm, err := w.e.cs.CoreV1().ConfigMaps("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	conf := cm.Data["config.conf"]
	if !strings.Contains(conf, "mode: iptables") {
		t.Fatalf("kube-proxy's config.conf has no \"mode: iptables\" to switch:\n%s", conf)
	}
	cm.Data["config.conf"] = strings.Replace(conf, "mode: iptables", "mode: nftables", 1)
	if _, err := w.e.cs.CoreV1().ConfigMaps("kube-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.e.kubectlRun(ctx, "rollout", "restart", "daemonset/kube-proxy", "-n", "kube-system"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.e.kubectlRun(ctx, "rollout", "status", "daemonset/kube-proxy", "-n", "kube-system", "--timeout=180s"); err != nil {
		t.Fatal(err)
	}
	// kube-proxy syncs its rules shortly after it starts.
	err = wait.PollUntilContextTimeout(ctx, 2*time.Second, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		out, err := w.e.node(ctx, w.pods[0].Spec.NodeName, "nft", "list", "table", "ip", "kube-proxy")
		return err == nil && strings.Contains(out, "service-"), nil
	})
	if err != nil {
		t.Fatalf("kube-proxy wrote no nftables service rules within 60 s of its restart in nftables mode")
	}
	t.Log("kube-proxy runs in nftables mode")
	w.checkServices(ctx, t)
	w.checkNodePort(ctx, t)
}
