package mizarctl_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"mizar.dev/pkg/agentapi"
	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/mizarctl"
)

// A droplet whose agent stopped renewing its heartbeat Lease is named as
// silent, though its objects are all Provisioned; a fresh one is not.
func TestStatusNamesSilentAgents(t *testing.T) {
	now := time.Now()
	lease := func(droplet string, renewed time.Duration) coordinationv1.Lease {
		return coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "mizar", Name: agentapi.HeartbeatLeaseName(droplet),
			Labels: map[string]string{agentapi.HeartbeatLabel: droplet}},
			Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To(int32(40)), RenewTime: ptr.To(metav1.NewMicroTime(now.Add(-renewed)))}}
	}
	r := &mizarctl.StatusReport{Droplets: []mizarctl.DropletStatus{
		{Name: "alive", Node: "alive", Phase: v1alpha1.PhaseProvisioned, Seen: -1},
		{Name: "dead", Node: "dead", Phase: v1alpha1.PhaseProvisioned, Seen: -1},
		{Name: "old", Node: "old", Phase: v1alpha1.PhaseProvisioned, Seen: -1},
	}}
	if !r.Healthy() {
		t.Fatal("healthy before heartbeats")
	}
	r.AddHeartbeats([]coordinationv1.Lease{lease("alive", 3*time.Second), lease("dead", 2*time.Minute)}, now)
	if r.Healthy() || len(r.NotProvisioned) != 1 || !strings.Contains(r.NotProvisioned[0], "Droplet dead: agent silent") {
		t.Fatalf("want only dead named silent, got %q", r.NotProvisioned)
	}
	var b bytes.Buffer
	if err := r.Print(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	t.Log(out)
	for _, want := range []string{"AGENT SEEN", "3s ago", "2m0s ago", "Droplet dead: agent silent: its heartbeat Lease mizar/mizar-agent-dead was last renewed 2m0s ago"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "old ") && !strings.Contains(l, " - ") {
			t.Errorf("a droplet without a Lease shows %q, want -", l)
		}
	}
}
