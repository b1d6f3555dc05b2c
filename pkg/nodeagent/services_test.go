package nodeagent

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"mizar.dev/pkg/dataplane"
)

// recordingProgrammer keeps what SetServices was given last.
type recordingProgrammer struct {
	mu   sync.Mutex
	last []dataplane.Service
	n    int
}

func (r *recordingProgrammer) SetServices(all []dataplane.Service) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last, r.n = all, r.n+1
	return nil
}

// waitFor polls until the last programmed set, printed, is want.
func (r *recordingProgrammer) waitFor(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var got string
	for time.Now().Before(deadline) {
		r.mu.Lock()
		got = fmt.Sprint(r.last)
		r.mu.Unlock()
		if got == want {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("programmed %s, want %s", got, want)
}

func TestServiceController(t *testing.T) {
	client := fake.NewClientset()
	dp := &recordingProgrammer{}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("controller: %v", err)
		}
	})
	c := NewServiceController(ServiceOptions{Workload: client, DP: dp, NodeName: "n1", Resync: time.Second})
	go func() { errc <- c.Run(ctx) }()
	dp.waitFor(t, "[]")

	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}}}
	if _, err := client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// No endpoints yet: the frontend is programmed without backends (its
	// connections dropped, counted).
	want := func(backends ...string) string {
		s := dataplane.Service{Frontend: dataplane.Frontend{VIP: netip.MustParseAddr("10.96.0.10"), Port: 80, Proto: dataplane.TCP}}
		for _, b := range backends {
			s.Backends = append(s.Backends, netip.MustParseAddrPort(b))
		}
		return fmt.Sprint([]dataplane.Service{s})
	}
	dp.waitFor(t, want())

	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-1",
		Labels: map[string]string{discoveryv1.LabelServiceName: "web"}}, AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.1.1.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
			{Addresses: []string{"10.1.1.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
		}}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dp.waitFor(t, want("10.1.1.1:8080", "10.1.1.2:8080"))

	es.Endpoints[0].Conditions.Ready = ptr.To(false)
	if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	dp.waitFor(t, want("10.1.1.1:8080"))

	if err := client.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	dp.waitFor(t, "[]")
	if n, err := c.Status(); n != 0 || err != nil {
		t.Fatalf("status %d, %v", n, err)
	}
}

func TestServicesFlag(t *testing.T) {
	for _, v := range []string{ServicesKubeProxy, ServicesBPF, "iptables"} {
		o := NewNodeOptions()
		o.NodeName, o.Services = "n1", v
		err := o.Validate()
		if bad := v == "iptables"; (err != nil) != bad {
			t.Errorf("--services=%s: %v", v, err)
		}
	}
	if o := NewNodeOptions(); o.Services != ServicesKubeProxy {
		t.Errorf("default --services %q, want %q", o.Services, ServicesKubeProxy)
	}
}
