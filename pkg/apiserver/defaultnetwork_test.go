package apiserver_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"mizar.dev/pkg/apiserver"
	"mizar.dev/pkg/apiserver/apiservertest"
)

// The default network is created at start if absent, and an existing one is
// never changed: a restart with other CIDRs keeps what is there.
func TestDefaultNetwork(t *testing.T) {
	dir := shortDir(t)
	s := apiservertest.Start(t, dir, "--default-vpc=pods=10.244.0.0/16", "--default-subnet=pods-a=10.244.0.0/17", "--default-subnet=pods-b=10.244.128.0/17")
	ctx := context.Background()
	api := s.Client.NetworkingV1alpha1()
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, errA := api.Subnets().Get(ctx, "pods-a", metav1.GetOptions{})
		_, errB := api.Subnets().Get(ctx, "pods-b", metav1.GetOptions{})
		return errA == nil && errB == nil, nil
	})
	if err != nil {
		t.Fatalf("the default subnets were not created: %v", err)
	}
	v, err := api.Vpcs().Get(ctx, "pods", metav1.GetOptions{})
	if err != nil || v.Spec.CIDR != "10.244.0.0/16" {
		t.Fatalf("default VPC: %v %v", v, err)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	s = apiservertest.Start(t, dir, "--default-vpc=pods=10.99.0.0/16", "--default-subnet=pods-a=10.99.0.0/24")
	time.Sleep(2 * time.Second) // the hook runs in the background: give it time to (not) act
	if v, err := s.Client.NetworkingV1alpha1().Vpcs().Get(ctx, "pods", metav1.GetOptions{}); err != nil || v.Spec.CIDR != "10.244.0.0/16" || v.UID == "" {
		t.Errorf("a restart with other flags changed the default VPC: %v %v", v, err)
	}
}

func TestDefaultNetworkFlagsRefused(t *testing.T) {
	for _, c := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--default-subnet=a=10.0.0.0/24"}, "needs --default-vpc"},
		{[]string{"--default-vpc=p=10.0.0.0/16"}, "at least one --default-subnet"},
		{[]string{"--default-vpc=p=10.0.0.1/16", "--default-subnet=a=10.0.0.0/24"}, "canonical"},
		{[]string{"--default-vpc=P_Q=10.0.0.0/16", "--default-subnet=a=10.0.0.0/24"}, "name"},
		{[]string{"--default-vpc=p=10.0.0.0/16", "--default-subnet=a=10.1.0.0/24"}, "outside"},
		{[]string{"--default-vpc=p=10.0.0.0/16", "--default-subnet=a=10.0.0.0/24", "--default-subnet=b=10.0.0.128/25"}, "clashes"},
		{[]string{"--node-agent-service-account=no-namespace"}, "namespace/name"},
	} {
		opts := apiserver.NewOptions()
		fs := pflag.NewFlagSet("mizar-apiserver", pflag.ContinueOnError)
		opts.AddFlags(fs)
		if err := fs.Parse(append(c.flags, "--check-flags")); err != nil {
			t.Fatal(err)
		}
		err := opts.Run(context.Background())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error saying %q", c.flags, err, c.want)
		}
	}
}
