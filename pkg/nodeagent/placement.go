package nodeagent

import (
	"context"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/cni"
)

// Pod annotations that place a pod's endpoint, overriding the conflist's
// "vpc" and "subnet" when the agent can read pods (--workload-kubeconfig).
const (
	AnnotationVPC    = v1alpha1.PodAnnotationVPC
	AnnotationSubnet = v1alpha1.PodAnnotationSubnet
)

// placement is where an ADD puts the pod, and what named it (for errors).
type placement struct {
	vpc, subnet         string
	vpcFrom, subnetFrom string
	subnetObj           *v1alpha1.Subnet
	vpcObj              *v1alpha1.Vpc
}

// place resolves the pod's VPC and subnet: the conflist's, overridden by the
// pod's annotations.
func (s *CNIServer) place(ctx context.Context, conf *cni.NetConf, namespace, pod string) (*placement, *types.Error) {
	p := &placement{vpc: conf.VPC, subnet: conf.Subnet, vpcFrom: fmt.Sprintf("network %q", conf.Name), subnetFrom: fmt.Sprintf("network %q", conf.Name)}
	var ann map[string]string
	if s.o.WorkloadPods != nil && pod != "" {
		po, err := s.o.WorkloadPods.Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			// Not a Kubernetes pod (a runtime driven by hand): the conflist decides.
		case err != nil:
			return nil, cniErr(cni.CodeAPI, fmt.Sprintf("mizar: reading pod %s/%s for its %s and %s annotations failed", namespace, pod, AnnotationVPC, AnnotationSubnet), err)
		default:
			ann = po.Annotations
		}
	}
	from := fmt.Sprintf("annotation %%s of pod %s/%s", namespace, pod)
	if v := ann[AnnotationSubnet]; v != "" {
		p.subnet, p.subnetFrom = v, fmt.Sprintf(from, AnnotationSubnet)
		p.vpc, p.vpcFrom = "", "" // the subnet's own, unless annotated too
	}
	if v := ann[AnnotationVPC]; v != "" {
		p.vpc, p.vpcFrom = v, fmt.Sprintf(from, AnnotationVPC)
	}

	subnet, err := s.subnet(ctx, p.subnet)
	if apierrors.IsNotFound(err) {
		fix := "conflist"
		if ann[AnnotationSubnet] != "" {
			fix = "pod's annotation"
		}
		return nil, cniErr(types.ErrInvalidNetworkConfig, fmt.Sprintf("mizar: subnet %q named by %s does not exist: create it or fix the %s", p.subnet, p.subnetFrom, fix), nil)
	}
	if err != nil {
		return nil, cniErr(cni.CodeAPI, "mizar: reading subnet "+p.subnet+" from mizar-apiserver failed", err)
	}
	if p.vpc == "" {
		p.vpc, p.vpcFrom = subnet.Spec.VPC, p.subnetFrom
	}
	if subnet.Spec.VPC != p.vpc {
		return nil, cniErr(types.ErrInvalidNetworkConfig, fmt.Sprintf("mizar: subnet %q (from %s) belongs to VPC %q, not %q as %s says", p.subnet, p.subnetFrom, subnet.Spec.VPC, p.vpc, p.vpcFrom), nil)
	}
	vpc, err := s.vpc(ctx, p.vpc)
	if err != nil {
		return nil, cniErr(cni.CodeAPI, "mizar: reading VPC "+p.vpc+" from mizar-apiserver failed", err)
	}
	p.subnetObj, p.vpcObj = subnet, vpc
	return p, nil
}

// subnet and vpc read from the informers' caches (VPCs and subnets are few
// and change rarely: a request each per ADD would cost more than the rest of
// the API side); a miss asks the server, for objects created a moment ago.
func (s *CNIServer) subnet(ctx context.Context, name string) (*v1alpha1.Subnet, error) {
	if s.subnetsSynced() {
		if sn, err := s.subnets.Get(name); err == nil {
			return sn, nil
		}
	}
	return s.o.Client.NetworkingV1alpha1().Subnets().Get(ctx, name, metav1.GetOptions{})
}

func (s *CNIServer) vpc(ctx context.Context, name string) (*v1alpha1.Vpc, error) {
	if s.vpcsSynced() {
		if v, err := s.vpcs.Get(name); err == nil && v.Spec.VNI > 0 {
			return v, nil
		}
	}
	return s.o.Client.NetworkingV1alpha1().Vpcs().Get(ctx, name, metav1.GetOptions{})
}
