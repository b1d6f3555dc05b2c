package apiserver

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"mizar.dev/pkg/admission/dropletrestriction"
	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/generated/clientset/versioned"
)

// DefaultNetwork is the VPC and subnets pods land in when they name none
// (--default-vpc, --default-subnet). mizar-apiserver is their one writer: it
// creates what is absent at start and never changes what exists, so an
// operator's edits and a second replica's start are both harmless. The node
// agents (one per node, each bound to its own droplet) are not given the power
// to create VPCs for it.
type DefaultNetwork struct {
	VPC     NamedCIDR
	Subnets []NamedCIDR
}

// NamedCIDR is a flag value NAME=CIDR.
type NamedCIDR struct {
	Name string
	CIDR netip.Prefix
}

func parseNamedCIDR(flag, s string) (NamedCIDR, error) {
	name, cidr, ok := strings.Cut(s, "=")
	if !ok {
		return NamedCIDR{}, fmt.Errorf("--%s %q: want NAME=CIDR, e.g. pods=10.244.0.0/16", flag, s)
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return NamedCIDR{}, fmt.Errorf("--%s %q: name: %s", flag, s, strings.Join(errs, "; "))
	}
	p, err := netip.ParsePrefix(cidr)
	if err != nil || !p.Addr().Is4() || p.Masked() != p {
		return NamedCIDR{}, fmt.Errorf("--%s %q: want a canonical IPv4 CIDR such as 10.244.0.0/16", flag, s)
	}
	return NamedCIDR{Name: name, CIDR: p}, nil
}

// parseDefaultNetwork checks the flags' values; nil when no default VPC is asked for.
func parseDefaultNetwork(vpc string, subnets []string) (*DefaultNetwork, error) {
	if vpc == "" {
		if len(subnets) > 0 {
			return nil, fmt.Errorf("--default-subnet needs --default-vpc")
		}
		return nil, nil
	}
	v, err := parseNamedCIDR("default-vpc", vpc)
	if err != nil {
		return nil, err
	}
	if len(subnets) == 0 {
		return nil, fmt.Errorf("--default-vpc %s needs at least one --default-subnet for pods", v.Name)
	}
	d := &DefaultNetwork{VPC: v}
	for _, s := range subnets {
		sn, err := parseNamedCIDR("default-subnet", s)
		if err != nil {
			return nil, err
		}
		if !v.CIDR.Contains(sn.CIDR.Addr()) || sn.CIDR.Bits() < v.CIDR.Bits() {
			return nil, fmt.Errorf("--default-subnet %s=%s lies outside --default-vpc %s=%s", sn.Name, sn.CIDR, v.Name, v.CIDR)
		}
		for _, o := range d.Subnets {
			if o.Name == sn.Name || o.CIDR.Overlaps(sn.CIDR) {
				return nil, fmt.Errorf("--default-subnet %s=%s clashes with %s=%s", sn.Name, sn.CIDR, o.Name, o.CIDR)
			}
		}
		d.Subnets = append(d.Subnets, sn)
	}
	return d, nil
}

// ensure creates the VPC and subnets that do not exist yet, retrying until
// they all exist or ctx ends. An existing object of the same name is kept as
// it is, even if its CIDR differs (logged): the flags seed, they do not own.
func (d *DefaultNetwork) ensure(ctx context.Context, cfg *rest.Config) error {
	client, err := versioned.NewForConfig(cfg)
	if err != nil {
		return err
	}
	api := client.NetworkingV1alpha1()
	create := func(kind, name, want string, f func() (string, error)) error {
		have, err := f()
		switch {
		case err == nil:
			klog.InfoS("Created the default network's object", "kind", kind, "name", name, "cidr", want)
		case apierrors.IsAlreadyExists(err):
			if have != "" && have != want {
				klog.InfoS("The default network's object exists with another CIDR; keeping it", "kind", kind, "name", name, "cidr", have, "flag", want)
			}
		default:
			return err
		}
		return nil
	}
	var invalid error
	err = wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		err := create("Vpc", d.VPC.Name, d.VPC.CIDR.String(), func() (string, error) {
			_, err := api.Vpcs().Create(ctx, &v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: d.VPC.Name}, Spec: v1alpha1.VpcSpec{CIDR: d.VPC.CIDR.String()}}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				if v, gerr := api.Vpcs().Get(ctx, d.VPC.Name, metav1.GetOptions{}); gerr == nil {
					return v.Spec.CIDR, err
				}
			}
			return "", err
		})
		for _, s := range d.Subnets {
			if err != nil {
				break
			}
			err = create("Subnet", s.Name, s.CIDR.String(), func() (string, error) {
				_, err := api.Subnets().Create(ctx, &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: s.Name}, Spec: v1alpha1.SubnetSpec{VPC: d.VPC.Name, CIDR: s.CIDR.String()}}, metav1.CreateOptions{})
				if apierrors.IsAlreadyExists(err) {
					if v, gerr := api.Subnets().Get(ctx, s.Name, metav1.GetOptions{}); gerr == nil {
						return v.Spec.CIDR, err
					}
				}
				return "", err
			})
		}
		switch {
		case apierrors.IsInvalid(err):
			// Retrying cannot help (e.g. another subnet overlaps): say so and stop.
			invalid = err
			return true, nil
		case err != nil:
			klog.ErrorS(err, "Creating the default network failed; retrying", "vpc", d.VPC.Name)
			return false, nil
		}
		return true, nil
	})
	if err == nil && invalid != nil {
		err = fmt.Errorf("the default network is refused by validation: %w", invalid)
	}
	return err
}

// validateMizarFlags checks what can be checked without serving: the mode's
// flags, the shutdown settings, the agents' ServiceAccounts and the default
// network. --check-flags stops after it.
func (o *Options) validateMizarFlags() (agentSAs []string, d *DefaultNetwork, err error) {
	if err := o.checkModeFlags(); err != nil {
		return nil, nil, err
	}
	if errs := o.Shutdown.Validate(); len(errs) > 0 {
		return nil, nil, utilerrors.NewAggregate(errs)
	}
	for _, sa := range o.NodeAgentServiceAccounts {
		u, err := dropletrestriction.ParseServiceAccount(sa)
		if err != nil {
			return nil, nil, fmt.Errorf("--node-agent-service-account: %w", err)
		}
		agentSAs = append(agentSAs, u)
	}
	if len(agentSAs) > 0 && o.Standalone {
		return nil, nil, fmt.Errorf("--node-agent-service-account has no effect with --standalone: agents there authenticate with droplet certificates (droplet-kubeconfig)")
	}
	if d, err = parseDefaultNetwork(o.DefaultVPC, o.DefaultSubnets); err != nil {
		return nil, nil, err
	}
	if o.CheckFlags {
		// The generic options' own checks; the embedded etcd is not started to pass them.
		r := *o.Recommended
		etcdOpts := *r.Etcd
		if len(etcdOpts.StorageConfig.Transport.ServerList) == 0 {
			etcdOpts.StorageConfig.Transport.ServerList = []string{"unix://embedded"}
		}
		r.Etcd = &etcdOpts
		if errs := r.Validate(); len(errs) > 0 {
			return nil, nil, utilerrors.NewAggregate(errs)
		}
	}
	return agentSAs, d, nil
}
