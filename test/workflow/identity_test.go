package workflow

import (
	"fmt"
	"path/filepath"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/apiserver"
	"mizar.dev/pkg/generated/clientset/versioned"
)

// dropletClient returns a client that authenticates as droplet name.
func dropletClient(t testing.TB, dataDir, name string) versioned.Interface {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := apiserver.IssueDropletKubeconfig(dataDir, name, path); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 1e6, 1e6
	c, err := versioned.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Agents run as their droplets: the whole workflow works with only what the
// admission check allows, and one droplet's identity cannot touch another's objects.
func TestDropletIdentity(t *testing.T) {
	ctx := testContext(t)
	srv := startServer(t)
	admin := srv.Client.NetworkingV1alpha1()
	p := uniq("id")
	names := []string{p + "-node0", p + "-node1"}
	clients := map[string]versioned.Interface{}
	for i, n := range names {
		clients[n] = dropletClient(t, srv.DataDir, n)
		startAgent(t, clients[n], n, i)
	}
	vpc, err := admin.Vpcs().Create(ctx, &v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: p}, Spec: v1alpha1.VpcSpec{CIDR: "10.4.0.0/16"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := admin.Subnets().Create(ctx, &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: p + "-a"}, Spec: v1alpha1.SubnetSpec{VPC: vpc.Name, CIDR: "10.4.1.0/24"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "subnet Provisioned through agents with droplet identities", func() (bool, error) {
		s, err := admin.Subnets().Get(ctx, sub.Name, metav1.GetOptions{})
		return err == nil && s.Status.Phase == v1alpha1.PhaseProvisioned, err
	})
	ns := uniq("ns")
	b, err := admin.Bouncers().Get(ctx, sub.Name+"-b-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	owner := b.Spec.Droplet
	other := names[0]
	if other == owner {
		other = names[1]
	}
	// The agent creates the endpoints of its own droplet.
	ep, err := clients[owner].NetworkingV1alpha1().Endpoints(ns).Create(ctx, &v1alpha1.Endpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "mine"},
		Spec:       v1alpha1.EndpointSpec{Subnet: sub.Name, Droplet: owner, MAC: "02:42:0a:00:00:07"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("agent creating an endpoint on its own droplet: %v", err)
	}
	eventually(t, ctx, "endpoint Provisioned", func() (bool, error) {
		e, err := admin.Endpoints(ns).Get(ctx, ep.Name, metav1.GetOptions{})
		return err == nil && e.Status.Phase == v1alpha1.PhaseProvisioned, err
	})

	// Quiet: the agents acknowledged the version the operator awaited before it
	// wrote Provisioned, and nobody awaits the Provisioned one, so nothing
	// legitimate writes while the intruder tries.
	intruder := clients[other].NetworkingV1alpha1()
	snapshot := func() map[string]string {
		rv := map[string]string{}
		d, _ := admin.Droplets().Get(ctx, owner, metav1.GetOptions{})
		rv["droplet"] = d.ResourceVersion
		bb, _ := admin.Bouncers().Get(ctx, b.Name, metav1.GetOptions{})
		rv["bouncer"] = bb.ResourceVersion
		e, _ := admin.Endpoints(ns).Get(ctx, ep.Name, metav1.GetOptions{})
		rv["endpoint"] = e.ResourceVersion
		v, _ := admin.Vpcs().Get(ctx, vpc.Name, metav1.GetOptions{})
		rv["vpc"] = v.ResourceVersion
		return rv
	}
	before := snapshot()
	forbidden := map[string]error{}
	_, forbidden["patch another droplet"] = intruder.Droplets().Patch(ctx, owner, types.MergePatchType, []byte(`{"spec":{"ip":"10.99.0.1"}}`), metav1.PatchOptions{})
	_, forbidden["patch another droplet's status"] = intruder.Droplets().Patch(ctx, owner, types.MergePatchType, []byte(`{"status":{"phase":"Failed"}}`), metav1.PatchOptions{}, "status")
	forbidden["delete another droplet"] = intruder.Droplets().Delete(ctx, owner, metav1.DeleteOptions{})
	_, forbidden["patch the status of a bouncer on another droplet"] = intruder.Bouncers().Patch(ctx, b.Name, types.MergePatchType, []byte(`{"status":{"appliedResourceVersion":"999999999"}}`), metav1.PatchOptions{}, "status")
	_, forbidden["move a bouncer"] = intruder.Bouncers().Patch(ctx, b.Name, types.MergePatchType, []byte(fmt.Sprintf(`{"spec":{"droplet":%q}}`, other)), metav1.PatchOptions{})
	_, forbidden["create an endpoint on another droplet"] = intruder.Endpoints(ns).Create(ctx, &v1alpha1.Endpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "theirs"},
		Spec:       v1alpha1.EndpointSpec{Subnet: sub.Name, Droplet: owner, MAC: "02:42:0a:00:00:08"},
	}, metav1.CreateOptions{})
	forbidden["delete an endpoint on another droplet"] = intruder.Endpoints(ns).Delete(ctx, ep.Name, metav1.DeleteOptions{})
	_, forbidden["patch an endpoint's status"] = intruder.Endpoints(ns).Patch(ctx, ep.Name, types.MergePatchType, []byte(`{"status":{"phase":"Failed"}}`), metav1.PatchOptions{}, "status")
	forbidden["delete a VPC"] = intruder.Vpcs().Delete(ctx, vpc.Name, metav1.DeleteOptions{})
	for what, err := range forbidden {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s as droplet %s: got %v, want 403 Forbidden", what, other, err)
		}
	}
	if after := snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("forbidden writes changed objects: resourceVersions %v -> %v", before, after)
	}
	if _, err := admin.Endpoints(ns).Get(ctx, "theirs", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("forbidden endpoint create left an object: %v", err)
	}
}
