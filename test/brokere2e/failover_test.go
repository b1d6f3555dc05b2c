package brokere2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"mizar.dev/pkg/etcd"
)

// TestFulfillmentFailsOverBetweenReplicas runs two mizar-apiserver replicas
// on one etcd. Only the elected one advances orders; when it is killed in the
// middle of an order, the other takes over and finishes it, and the workload
// cluster never sees writes from both in between.
func TestFulfillmentFailsOverBetweenReplicas(t *testing.T) {
	ns := servedNamespace(t, 1, "5Gi")
	e, err := etcd.StartEmbedded(etcd.EmbeddedOptions{Dir: filepath.Join(t.TempDir(), "etcd"), UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	servers := "--etcd-servers=" + strings.Join(e.Endpoints(), ",")
	first := startMizar(t, t.TempDir(), servers)
	waitFor(t, 30*time.Second, "the first replica elected", func(context.Context) (bool, error) {
		return first.Said("Fulfillment operator: elected leader"), nil
	})
	second := startMizar(t, t.TempDir(), servers)
	applyClass(t, second)

	// The leader's Service create is held at the proxy, and the leader killed with it in flight.
	arrived, release := proxy.Hold("POST", "/namespaces/"+ns+"/services")
	defer release()
	ctx := context.Background()
	if _, err := second.Client.BrokerV1alpha1().ServiceInstances(ns).Create(ctx, order(ns, "small"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-arrived:
	case <-time.After(time.Minute):
		t.Fatal("the Service was never created")
	}
	if second.Said("Fulfillment operator: elected leader") {
		t.Fatal("the second replica leads while the first is alive")
	}
	first.Kill()
	killedAt := time.Now()
	in := waitOrder(t, second, ns, "Provisioned by the second replica", provisioned)
	if !second.Said("Fulfillment operator: elected leader") {
		t.Error("the order was provisioned but the second replica never said it leads")
	}
	if err := objectsOf(t, ns, string(in.UID)).exactlyOne(); err != nil {
		t.Fatal(err)
	}

	// Each replica names itself in its user agent: before the kill only the
	// first wrote, after it only the second.
	writes := proxy.Writes("/namespaces/" + ns + "/")
	before, after := map[string]int{}, map[string]int{}
	for _, w := range writes {
		if w.at.Before(killedAt) {
			before[w.userAgent]++
		} else {
			after[w.userAgent]++
		}
	}
	if len(before) != 1 || len(after) != 1 {
		t.Fatalf("writers before the kill %v, after %v; want one each", before, after)
	}
	for a := range before {
		if after[a] > 0 {
			t.Errorf("the killed replica %q wrote after its death", a)
		}
		if !strings.HasPrefix(a, "mizar-broker-fulfillment/") {
			t.Errorf("writer %q does not name the fulfillment replica", a)
		}
	}
	t.Logf("writes before the kill %v, after %v", before, after)

	if err := second.Client.BrokerV1alpha1().ServiceInstances(ns).Delete(ctx, orderName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, ns)
}
