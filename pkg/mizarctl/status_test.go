package mizarctl_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/pkg/mizarctl"
	"mizar.dev/pkg/nodeagent"
	"mizar.dev/test/cluster"
)

// kubectl mizar status, through the real kubectl and the plugin binary,
// against the in-process mizar-apiserver: one droplet's agent runs (over a
// Recorder), another's never did. The silent one is named with why, the
// command exits 1; once it is gone, everything is Provisioned and it exits 0.
func TestStatusAsKubectlPlugin(t *testing.T) {
	s := apiservertest.Start(t, t.TempDir(), "--operators=true")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var b [3]byte
	_, _ = rand.Read(b[:])
	sfx := hex.EncodeToString(b[:])
	live, ghost := "live-"+sfx, "ghost-"+sfx

	agent, err := nodeagent.New(nodeagent.Options{Client: s.Client, Dataplane: nodeagent.NewRecorder(), Droplet: &v1alpha1.Droplet{
		ObjectMeta: metav1.ObjectMeta{Name: live}, Spec: v1alpha1.DropletSpec{Node: live, IP: "198.18.30.1", MAC: "02:00:00:30:00:01", Interface: "eth0"}}})
	if err != nil {
		t.Fatal(err)
	}
	agentCtx, stopAgent := context.WithCancel(ctx)
	agentDone := make(chan error, 1)
	go func() { agentDone <- agent.Run(agentCtx) }()
	defer func() {
		stopAgent()
		if err := <-agentDone; err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	}()
	api := s.Client.NetworkingV1alpha1()
	if _, err := api.Droplets().Create(ctx, &v1alpha1.Droplet{ObjectMeta: metav1.ObjectMeta{Name: ghost},
		Spec: v1alpha1.DropletSpec{Node: ghost, IP: "198.18.30.2", MAC: "02:00:00:30:00:02", Interface: "eth0"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	vpc, subnet := "vpc-"+sfx, "sn-"+sfx
	if _, err := api.Vpcs().Create(ctx, &v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: vpc}, Spec: v1alpha1.VpcSpec{CIDR: "10.89.0.0/16"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Subnets().Create(ctx, &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: subnet}, Spec: v1alpha1.SubnetSpec{VPC: vpc, CIDR: "10.89.1.0/24"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Endpoints("default").Create(ctx, &v1alpha1.Endpoint{ObjectMeta: metav1.ObjectMeta{Name: "ep-" + sfx},
		Spec: v1alpha1.EndpointSpec{Subnet: subnet, Droplet: live, MAC: "02:00:00:30:01:01"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The live droplet's share settles before the command looks.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		sn, err := api.Subnets().Get(ctx, subnet, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ep, err := api.Endpoints("default").Get(ctx, "ep-"+sfx, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return sn.Status.Phase == v1alpha1.PhaseProvisioned && ep.Status.Phase == v1alpha1.PhaseProvisioned, nil
	}); err != nil {
		t.Fatalf("the live droplet's subnet and endpoint did not become Provisioned: %v", err)
	}

	// The plugin: kubectl finds kubectl-mizar on PATH.
	dir := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "kubectl-mizar"), "mizar.dev/cmd/mizarctl").CombinedOutput(); err != nil {
		t.Fatalf("building the plugin: %v\n%s", err, out)
	}
	bins, err := cluster.Binaries("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	run := func() (string, int) {
		cmd := exec.Command(bins["kubectl"], "mizar", "status", "--kubeconfig", s.Kubeconfig)
		cmd.Env = append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("kubectl mizar status: %v\n%s", err, out)
		}
		return string(out), cmd.ProcessState.ExitCode()
	}
	out, code := run()
	if code != 1 {
		t.Errorf("exit code %d with a silent droplet, want 1:\n%s", code, out)
	}
	for _, want := range []string{"Droplets (node agents): 1/2 Provisioned", "Droplet " + ghost + ": Init:", "Endpoints: 1/1 Provisioned"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	var liveRow string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, live+" ") {
			liveRow = l
		}
	}
	if f := strings.Fields(liveRow); len(f) < 7 || f[3] != "Provisioned" || f[4] != "1" {
		t.Errorf("live droplet's row %q: want Provisioned with 1 endpoint", liveRow)
	}

	if err := api.Droplets().Delete(ctx, ghost, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := api.Droplets().Get(ctx, ghost, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Fatalf("the silent droplet was not deleted: %v", err)
	}
	out, code = run()
	if code != 0 || !strings.Contains(out, "All Provisioned.") {
		t.Errorf("exit code %d, want 0 and All Provisioned:\n%s", code, out)
	}
	// The library answers the same without the plugin.
	r, err := mizarctl.Status(ctx, s.Client)
	if err != nil || !r.Healthy() || len(r.Droplets) != 1 {
		t.Errorf("Status: %+v, %v", r, err)
	}
}
