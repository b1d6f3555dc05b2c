// Package workflow runs the management workflows end to end: a real in-process
// mizar-apiserver with its operators, and several node agents (the real agent
// code) over recording dataplanes.
package workflow

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/pkg/generated/clientset/versioned"
	"mizar.dev/pkg/nodeagent"
)

// testContext bounds a test so a stuck workflow fails instead of hanging CI.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// uniq is a name prefix of this test run, so -count=2 never meets old objects.
func uniq(base string) string { return base + "-" + utilrand.String(5) }

// runningAgent is an agent running until its test ends (or stop).
type runningAgent struct {
	name  string
	dp    *nodeagent.Recorder
	agent *nodeagent.Agent
	stop  func()
}

// startAgent starts the real agent of droplet name over a recorder.
func startAgent(t testing.TB, client versioned.Interface, name string, n int) *runningAgent {
	t.Helper()
	dp := nodeagent.NewRecorder()
	a, err := nodeagent.New(nodeagent.Options{
		Client:    client,
		Dataplane: dp,
		Droplet: &v1alpha1.Droplet{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1alpha1.DropletSpec{Node: name, IP: fmt.Sprintf("192.168.%d.%d", n/250, n%250+1),
				MAC: fmt.Sprintf("02:00:00:00:%02x:%02x", n/256, n%256), Interface: "eth0"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("agent %s: %v", name, err)
			}
		})
	}
	t.Cleanup(stop)
	return &runningAgent{name: name, dp: dp, agent: a, stop: stop}
}

// startAgents starts the agents of droplets prefix-node0 .. prefix-node<n-1>
// and waits until every droplet is Provisioned.
func startAgents(t *testing.T, ctx context.Context, client versioned.Interface, prefix string, n int) map[string]*runningAgent {
	t.Helper()
	agents := map[string]*runningAgent{}
	for i := range n {
		a := startAgent(t, client, fmt.Sprintf("%s-node%d", prefix, i), i)
		agents[a.name] = a
	}
	eventually(t, ctx, "droplets Provisioned", func() (bool, error) {
		for name := range agents {
			d, err := client.NetworkingV1alpha1().Droplets().Get(ctx, name, metav1.GetOptions{})
			if err != nil || d.Status.Phase != v1alpha1.PhaseProvisioned {
				return false, err
			}
		}
		return true, nil
	})
	return agents
}

func startServer(t testing.TB, flags ...string) *apiservertest.Server {
	return apiservertest.Start(t, t.TempDir(), append([]string{"--operators=true"}, flags...)...)
}

// eventually polls cond (test code only: the system under test never polls).
func eventually(t *testing.T, ctx context.Context, what string, cond func() (bool, error)) {
	t.Helper()
	var last error
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := wait.PollUntilContextCancel(waitCtx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		ok, err := cond()
		last = err
		return ok, nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v (last error: %v)", what, err, last)
	}
}

// phaseManager returns who last wrote status.phase according to managedFields.
func phaseManager(obj metav1.Object) string {
	owner := ""
	for _, m := range obj.GetManagedFields() {
		if m.FieldsV1 == nil {
			continue
		}
		var f map[string]any
		if json.Unmarshal(m.FieldsV1.Raw, &f) != nil {
			continue
		}
		if st, ok := f["f:status"].(map[string]any); ok {
			if _, ok := st["f:phase"]; ok {
				owner = m.Manager
			}
		}
	}
	return owner
}

func condition(conds []metav1.Condition, typ string) *metav1.Condition {
	return meta.FindStatusCondition(conds, typ)
}
