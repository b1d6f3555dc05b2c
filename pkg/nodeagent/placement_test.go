package nodeagent

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/test/workloadcluster"
)

// startKube runs a real kube-apiserver (test/workloadcluster) and returns
// an admin client.
func startKube(t *testing.T) kubernetes.Interface {
	t.Helper()
	c := workloadcluster.StartAPIServer(t)
	kc, err := kubernetes.NewForConfig(c.Admin)
	if err != nil {
		t.Fatal(err)
	}
	return kc
}

// Pod annotations place a pod's endpoint over the conflist when the agent
// reads pods from a real kube-apiserver; bad ones fail ADD with a CNI error
// that names the annotation, and leave nothing behind.
func TestCNIPodAnnotations(t *testing.T) {
	requireRoot(t)
	kc := startKube(t)
	e := newCNIEnv(t, func(o *CNIOptions) { o.WorkloadPods = kc.CoreV1() })
	ctx := context.Background()
	api := e.client.Client.NetworkingV1alpha1()
	vpc2, other, sub2 := "avpc-"+e.sfx, "asn-"+e.sfx, "asn2-"+e.sfx
	if _, err := api.Vpcs().Create(ctx, &v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: vpc2}, Spec: v1alpha1.VpcSpec{CIDR: "10.88.0.0/16"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, sp := range map[string]v1alpha1.SubnetSpec{other: {VPC: e.vpc, CIDR: "10.77.3.0/24"}, sub2: {VPC: vpc2, CIDR: "10.88.1.0/24"}} {
		if _, err := api.Subnets().Create(ctx, &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: sp}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// No controller-manager makes it: pods need their service account.
	if _, err := kc.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	l := e.conflist("1.1.0", e.subnet)
	cases := []struct {
		pod     string
		ann     map[string]string // nil: no pod in the cluster at all
		subnet  string            // the endpoint's, on success
		cidr    string
		errCode uint
		errHas  string
	}{
		{pod: "plain", ann: map[string]string{}, subnet: e.subnet, cidr: "10.77.1.0/24"},
		{pod: "ghost", subnet: e.subnet, cidr: "10.77.1.0/24"},
		{pod: "sub", ann: map[string]string{AnnotationSubnet: other}, subnet: other, cidr: "10.77.3.0/24"},
		{pod: "subvpc", ann: map[string]string{AnnotationSubnet: sub2}, subnet: sub2, cidr: "10.88.1.0/24"},
		{pod: "both", ann: map[string]string{AnnotationVPC: vpc2, AnnotationSubnet: sub2}, subnet: sub2, cidr: "10.88.1.0/24"},
		{pod: "vpconly", ann: map[string]string{AnnotationVPC: vpc2}, errCode: types.ErrInvalidNetworkConfig,
			errHas: `belongs to VPC "` + e.vpc + `", not "` + vpc2 + `" as annotation mizar.dev/vpc of pod default/vpconly says`},
		{pod: "mismatch", ann: map[string]string{AnnotationVPC: e.vpc, AnnotationSubnet: sub2}, errCode: types.ErrInvalidNetworkConfig,
			errHas: `subnet "` + sub2 + `" (from annotation mizar.dev/subnet of pod default/mismatch) belongs to VPC "` + vpc2 + `"`},
		{pod: "unknown", ann: map[string]string{AnnotationSubnet: "nope-" + e.sfx}, errCode: types.ErrInvalidNetworkConfig,
			errHas: `subnet "nope-` + e.sfx + `" named by annotation mizar.dev/subnet of pod default/unknown does not exist: create it or fix the pod's annotation`},
	}
	for _, c := range cases {
		t.Run(c.pod, func(t *testing.T) {
			e.t = t
			defer func() { e.t = t }()
			if c.ann != nil {
				po := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: c.pod, Namespace: "default", Annotations: c.ann},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}}
				if _, err := kc.CoreV1().Pods("default").Create(ctx, po, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			rt, podH := e.pod(c.pod)
			res, err := e.cni.AddNetworkList(ctx, l, rt)
			if c.errCode != 0 {
				if err == nil {
					t.Fatalf("ADD succeeded: %s", res)
				}
				if cniCode(t, err) != c.errCode || !strings.Contains(err.Error(), c.errHas) {
					t.Errorf("ADD: %v\nwant code %d saying %s", err, c.errCode, c.errHas)
				}
				e.nothingLeft(rt, podH)
				return
			}
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			r, err := types100.GetResult(res)
			if err != nil {
				t.Fatal(err)
			}
			if ip := netip.MustParseAddr(r.IPs[0].Address.IP.String()); !netip.MustParsePrefix(c.cidr).Contains(ip) {
				t.Errorf("address %s, want one in %s", ip, c.cidr)
			}
			epName, _ := names(attachmentID(rt.ContainerID, rt.IfName))
			ep, err := api.Endpoints("default").Get(ctx, epName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if ep.Spec.Subnet != c.subnet || ep.Spec.Pod != c.pod {
				t.Errorf("endpoint subnet %q pod %q, want %q %q", ep.Spec.Subnet, ep.Spec.Pod, c.subnet, c.pod)
			}
			if err := e.cni.DelNetworkList(ctx, l, rt); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			e.nothingLeft(rt, podH)
		})
	}
}
