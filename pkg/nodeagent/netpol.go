package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/labels"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"mizar.dev/pkg/dataplane"
	listers "mizar.dev/pkg/generated/listers/networking/v1alpha1"
	"mizar.dev/pkg/netpol"
)

// PolicyApplier is what the policy controller asks of the dataplane
// (pkg/dataplane's Datapath, loaded with Options.NetworkPolicy).
type PolicyApplier interface {
	ApplyPolicy(c *netpol.Compiled) (dataplane.PolicyApplied, error)
}

// PolicyOptions configure NewPolicyController.
type PolicyOptions struct {
	// Workload is the Kubernetes cluster whose NetworkPolicies, Pods and
	// Namespaces are enforced.
	Workload kubernetes.Interface
	// VPCs and Subnets resolve a pod's placement to its VNI (the agent's
	// informers on mizar's API, started elsewhere).
	VPCs    listers.VpcLister
	Subnets listers.SubnetLister
	// Synced reports whether those informers have synced.
	Synced []cache.InformerSynced
	// DefaultVPC is the VPC of pods without a mizar.dev/vpc or
	// mizar.dev/subnet annotation (the conflist's VPC, --host-vpc); empty:
	// such pods are no pods to policy (ipBlocks still match them).
	DefaultVPC string
	// DefaultSubnet, if set, places such pods in its VPC instead.
	DefaultSubnet string
	DP            PolicyApplier
	// Resync bounds how long a failed apply waits before the next try.
	Resync time.Duration
	// NodeName is this node's: ServeHTTP lists its pods (all with ?all=1).
	NodeName string
}

// PolicyController keeps the node's policy maps equal to what the
// workload cluster's NetworkPolicies say about its pods. It is level
// triggered: any change of a policy, a namespace's labels or a pod's
// labels, address, ports or placement recompiles the whole rule set, and
// ApplyPolicy writes only what differs.
type PolicyController struct {
	o        PolicyOptions
	factory  kubeinformers.SharedInformerFactory
	pods     corelisters.PodLister
	nss      corelisters.NamespaceLister
	policies networkinglisters.NetworkPolicyLister
	synced   []cache.InformerSynced
	compiler *netpol.Compiler
	kick     chan struct{}

	mu      sync.Mutex
	applied PolicyStatus
	last    *netpol.Input     // what was applied last
	comp    *netpol.Compiled  // and its compiled form
	nodes   map[string]string // "namespace/name" -> node, of the pods in last
}

// PolicyStatus is what the controller applied last.
type PolicyStatus struct {
	// Generation is the dataplane's policy generation after the last
	// successful apply (0: none yet).
	Generation uint64 `json:"generation"`
	// Policies, Pods and Rules counted in that apply.
	Policies int `json:"policies"`
	Pods     int `json:"pods"`
	Rules    int `json:"rules"`
	// At is when it completed; LastError the error of a later failed try.
	At        time.Time `json:"appliedAt"`
	LastError string    `json:"lastError,omitempty"`
}

// NewPolicyController sets up the informers; Run starts them.
func NewPolicyController(o PolicyOptions) *PolicyController {
	if o.Resync <= 0 {
		o.Resync = 5 * time.Second
	}
	f := kubeinformers.NewSharedInformerFactory(o.Workload, 10*time.Minute)
	c := &PolicyController{o: o, factory: f, compiler: netpol.NewCompiler(), kick: make(chan struct{}, 1),
		pods: f.Core().V1().Pods().Lister(), nss: f.Core().V1().Namespaces().Lister(),
		policies: f.Networking().V1().NetworkPolicies().Lister()}
	poke := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.poke() },
		DeleteFunc: func(any) { c.poke() },
		UpdateFunc: func(old, cur any) {
			if policyRelevant(old, cur) {
				c.poke()
			}
		},
	}
	for _, inf := range []cache.SharedIndexInformer{f.Core().V1().Pods().Informer(), f.Core().V1().Namespaces().Informer(),
		f.Networking().V1().NetworkPolicies().Informer()} {
		_, _ = inf.AddEventHandler(poke)
		c.synced = append(c.synced, inf.HasSynced)
	}
	return c
}

// policyRelevant: did an update change what policy reads? Pod status
// churns (conditions, container states) without touching it.
func policyRelevant(old, cur any) bool {
	switch o := old.(type) {
	case *corev1.Pod:
		n := cur.(*corev1.Pod)
		return o.Status.PodIP != n.Status.PodIP || !equality.Semantic.DeepEqual(o.Labels, n.Labels) ||
			!equality.Semantic.DeepEqual(o.Annotations, n.Annotations) || o.Spec.HostNetwork != n.Spec.HostNetwork ||
			!equality.Semantic.DeepEqual(containerPorts(o), containerPorts(n))
	case *corev1.Namespace:
		return !equality.Semantic.DeepEqual(o.Labels, cur.(*corev1.Namespace).Labels)
	case *networkingv1.NetworkPolicy:
		return !equality.Semantic.DeepEqual(o.Spec, cur.(*networkingv1.NetworkPolicy).Spec)
	}
	return true
}

func containerPorts(p *corev1.Pod) []netpol.Port {
	var out []netpol.Port
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name != "" && cp.ContainerPort > 0 && cp.ContainerPort <= 65535 {
				out = append(out, netpol.Port{Name: cp.Name, Protocol: netpol.ProtocolNumber(cp.Protocol), Port: uint16(cp.ContainerPort)})
			}
		}
	}
	return out
}

func (c *PolicyController) poke() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Status returns what was applied last.
func (c *PolicyController) Status() PolicyStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.applied
}

// Run watches and applies until ctx ends.
func (c *PolicyController) Run(ctx context.Context) error {
	c.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), append(c.synced, c.o.Synced...)...) {
		return fmt.Errorf("network policy: informers did not sync: %w", ctx.Err())
	}
	klog.InfoS("Network policy controller started", "defaultVPC", c.o.DefaultVPC, "defaultSubnet", c.o.DefaultSubnet)
	c.poke()
	retry := time.NewTimer(c.o.Resync)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.kick:
		case <-retry.C:
		}
		err := c.sync()
		c.mu.Lock()
		if err != nil {
			c.applied.LastError = err.Error()
		} else {
			c.applied.LastError = ""
		}
		c.mu.Unlock()
		if err != nil {
			klog.ErrorS(err, "Applying network policy failed; retrying", "in", c.o.Resync)
			retry.Reset(c.o.Resync)
		}
	}
}

// sync compiles and applies the whole rule set once.
func (c *PolicyController) sync() error {
	start := time.Now()
	in, nodes, err := c.input()
	if err != nil {
		return err
	}
	comp, err := c.compiler.Compile(in)
	if err != nil {
		return fmt.Errorf("compile network policies: %w", err)
	}
	st, err := c.o.DP.ApplyPolicy(comp)
	if err != nil {
		return fmt.Errorf("apply network policies: %w", err)
	}
	c.mu.Lock()
	c.applied = PolicyStatus{Generation: st.Generation, Policies: len(in.Policies), Pods: len(in.Pods), Rules: len(comp.Rules), At: time.Now()}
	c.last, c.comp, c.nodes = in, comp, nodes
	c.mu.Unlock()
	klog.V(2).InfoS("Applied network policy", "generation", st.Generation, "policies", len(in.Policies), "pods", len(in.Pods),
		"rules", len(comp.Rules), "written", st.Written, "deleted", st.Deleted, "took", time.Since(start))
	return nil
}

// input reads the listers into a netpol.Input. Pods without an address,
// on the host network, or whose VPC is unknown are left out: to policy
// they are plain addresses.
func (c *PolicyController) input() (*netpol.Input, map[string]string, error) {
	nps, err := c.policies.List(labels.Everything())
	if err != nil {
		return nil, nil, err
	}
	nss, err := c.nss.List(labels.Everything())
	if err != nil {
		return nil, nil, err
	}
	pods, err := c.pods.List(labels.Everything())
	if err != nil {
		return nil, nil, err
	}
	nodes := map[string]string{}
	byName := make(map[string]*corev1.Pod, len(pods))
	for _, p := range pods {
		byName[p.Namespace+"/"+p.Name] = p
	}
	in := &netpol.Input{Policies: nps, Namespaces: make(map[string]map[string]string, len(nss))}
	for _, ns := range nss {
		in.Namespaces[ns.Name] = ns.Labels
	}
	// Deterministic order: identities are assigned in it.
	sort.Slice(pods, func(i, j int) bool {
		return pods[i].Namespace+"/"+pods[i].Name < pods[j].Namespace+"/"+pods[j].Name
	})
	// One pod per (VNI, address): a finished pod keeps its address in its
	// status after the address went to another pod; of two live ones
	// (a restart's overlap), the newer holds it.
	owner := map[netpol.EndpointKey]int{}
	for _, p := range pods {
		if p.Spec.HostNetwork || p.Status.PodIP == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		ip, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil || !ip.Is4() {
			continue
		}
		vni, ok := c.vniOf(p)
		if !ok {
			continue
		}
		pp := netpol.Pod{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels, VNI: vni, IP: ip, Ports: containerPorts(p)}
		key := netpol.EndpointKey{VNI: vni, IP: ip}
		if i, dup := owner[key]; dup {
			if prev := byName[in.Pods[i].Namespace+"/"+in.Pods[i].Name]; !prev.CreationTimestamp.Before(&p.CreationTimestamp) {
				continue
			}
			delete(nodes, in.Pods[i].Namespace+"/"+in.Pods[i].Name)
			in.Pods[i] = pp
		} else {
			owner[key] = len(in.Pods)
			in.Pods = append(in.Pods, pp)
		}
		nodes[p.Namespace+"/"+p.Name] = p.Spec.NodeName
	}
	return in, nodes, nil
}

// PodPolicy is one pod's policy as this agent applied it.
type PodPolicy struct {
	Pod      string `json:"pod"`
	Node     string `json:"node"`
	VNI      uint32 `json:"vni"`
	IP       string `json:"ip"`
	Identity uint32 `json:"identity"`
	// Ingress and Egress name the policies that isolate the pod in that
	// direction (none: everything allowed that way).
	Ingress []string `json:"ingress,omitempty"`
	Egress  []string `json:"egress,omitempty"`
}

// PolicyReport is what ServeHTTP answers.
type PolicyReport struct {
	PolicyStatus
	Pods []PodPolicy `json:"pods"`
}

// ServeHTTP answers (on the agent's health address, /policy) which
// policies apply to this node's pods and whether the agent has applied
// them: the generation the programs decide under, when, and the last
// error. ?all=1 lists every pod the agent knows.
func (c *PolicyController) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	rep := PolicyReport{PolicyStatus: c.applied, Pods: []PodPolicy{}}
	in, comp, nodes := c.last, c.comp, c.nodes
	c.mu.Unlock()
	all := r.URL.Query().Get("all") == "1"
	if in != nil {
		for i := range in.Pods {
			p := &in.Pods[i]
			key := p.Namespace + "/" + p.Name
			if !all && nodes[key] != c.o.NodeName {
				continue
			}
			ing, eg := netpol.PoliciesFor(in, p)
			rep.Pods = append(rep.Pods, PodPolicy{Pod: key, Node: nodes[key], VNI: p.VNI, IP: p.IP.String(),
				Identity: comp.Endpoints[netpol.EndpointKey{VNI: p.VNI, IP: p.IP}].Identity, Ingress: ing, Egress: eg})
		}
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(rep)
}

// vniOf places a pod as the CNI server did: its subnet annotation's VPC,
// its VPC annotation, else the default subnet's VPC or the default VPC.
func (c *PolicyController) vniOf(p *corev1.Pod) (uint32, bool) {
	vpc, subnet := c.o.DefaultVPC, c.o.DefaultSubnet
	if s := p.Annotations[AnnotationSubnet]; s != "" {
		subnet = s
	} else if p.Annotations[AnnotationVPC] != "" {
		subnet = ""
	}
	if subnet != "" {
		sub, err := c.o.Subnets.Get(subnet)
		if err != nil {
			return 0, false
		}
		vpc = sub.Spec.VPC
	} else if v := p.Annotations[AnnotationVPC]; v != "" {
		vpc = v
	}
	if vpc == "" {
		return 0, false
	}
	v, err := c.o.VPCs.Get(vpc)
	if err != nil || v.Spec.VNI <= 0 {
		return 0, false
	}
	return uint32(v.Spec.VNI), true
}

// defaultPlacement is where pods without placement annotations are: the
// mizar plugin's vpc and subnet in the conflist the agent installs, else
// hostVPC.
func defaultPlacement(conflist, hostVPC string) (vpc, subnet string, err error) {
	if conflist == "" {
		return hostVPC, "", nil
	}
	data, err := os.ReadFile(conflist)
	if err != nil {
		return "", "", fmt.Errorf("--network-policy: read --cni-conflist for the pods' default VPC: %w", err)
	}
	var l struct {
		Plugins []struct {
			Type   string `json:"type"`
			VPC    string `json:"vpc"`
			Subnet string `json:"subnet"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(data, &l); err != nil {
		return "", "", fmt.Errorf("--network-policy: parse --cni-conflist %s: %w", conflist, err)
	}
	for _, p := range l.Plugins {
		if p.Type == "mizar" {
			return p.VPC, p.Subnet, nil
		}
	}
	return "", "", fmt.Errorf("--network-policy: --cni-conflist %s has no mizar plugin to place pods by", conflist)
}

var (
	descPolicyPackets = prometheus.NewDesc("mizar_policy_packets_total",
		"Packets the network policy code decided, by outcome (allow_*, drop_egress, drop_ingress, drop_cut_*).", []string{"outcome"}, nil)
	descPolicyRefused = prometheus.NewDesc("mizar_policy_refused_packets_total",
		"Packets a pod's network policy refused, by pod address, VNI and direction.", []string{"vni", "ip", "direction"}, nil)
	descPolicyGeneration = prometheus.NewDesc("mizar_policy_generation",
		"Policy generation the programs decide under (0: nothing applied yet).", nil, nil)
	descPolicyApplied = prometheus.NewDesc("mizar_policy_applied",
		"What the last successful apply held, by kind (policies, pods, rules).", []string{"kind"}, nil)
)

// policyMetrics exports the policy counters on /metrics.
type policyMetrics struct {
	dp interface {
		PolicyCounters() (map[string]uint64, error)
		PolicyRefusals() ([]dataplane.PolicyRefusal, error)
	}
	c *PolicyController
}

func (m *policyMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPolicyPackets, descPolicyRefused, descPolicyGeneration, descPolicyApplied} {
		ch <- d
	}
}

func (m *policyMetrics) Collect(ch chan<- prometheus.Metric) {
	if c, err := m.dp.PolicyCounters(); err == nil {
		for k, v := range c {
			ch <- prometheus.MustNewConstMetric(descPolicyPackets, prometheus.CounterValue, float64(v), k)
		}
	}
	if rs, err := m.dp.PolicyRefusals(); err == nil {
		for _, r := range rs {
			dir := "ingress"
			if r.Egress {
				dir = "egress"
			}
			ch <- prometheus.MustNewConstMetric(descPolicyRefused, prometheus.CounterValue, float64(r.Packets), fmt.Sprint(r.VNI), r.IP.String(), dir)
		}
	}
	st := m.c.Status()
	ch <- prometheus.MustNewConstMetric(descPolicyGeneration, prometheus.GaugeValue, float64(st.Generation))
	for k, v := range map[string]int{"policies": st.Policies, "pods": st.Pods, "rules": st.Rules} {
		ch <- prometheus.MustNewConstMetric(descPolicyApplied, prometheus.GaugeValue, float64(v), k)
	}
}
