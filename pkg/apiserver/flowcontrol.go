package apiserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	fcboot "k8s.io/apiserver/pkg/apis/flowcontrol/bootstrap"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/endpoints/request"
	genericapiserver "k8s.io/apiserver/pkg/server"
	utilflowcontrol "k8s.io/apiserver/pkg/util/flowcontrol"
	fq "k8s.io/apiserver/pkg/util/flowcontrol/fairqueuing"
	fcrequest "k8s.io/apiserver/pkg/util/flowcontrol/request"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"mizar.dev/pkg/admission/dropletrestriction"
	"mizar.dev/pkg/apis/networking"
)

// mizar's priority levels and flow schemas. API Priority and Fairness runs
// with this configuration in every mode: standalone has no kube-apiserver to
// read one from, and behind kube-apiserver the host cluster's FlowSchemas
// know nothing of droplets (and mizar's must not change how kube-apiserver
// treats its own clients).
const (
	// PriorityLevelNodeWrites serves node agents' writes, one flow per droplet.
	PriorityLevelNodeWrites = "mizar-node-writes"
	// PriorityLevelNodeReads serves node agents' reads (their lists and the
	// initialization of their watches), one flow per droplet; separate from
	// writes, so a node replaying lists does not hold up acknowledgements.
	PriorityLevelNodeReads = "mizar-node-reads"
	// PriorityLevelDefault serves every other authenticated client (kubectl
	// users, kube-apiserver's controllers, the broker's platform), one flow per user.
	PriorityLevelDefault = "mizar-default"

	flowSchemaProbes     = "probes"
	flowSchemaNodeWrites = PriorityLevelNodeWrites
	flowSchemaNodeReads  = PriorityLevelNodeReads
	flowSchemaDefault    = PriorityLevelDefault
)

// Concurrency shares: of the server's total (--max-requests-inflight plus
// --max-mutating-requests-inflight, 600 by default) node writes get 19%
// (115 seats), node reads 5% (29: list and watch-initialization of a node's
// slice are small; a node listing whole collections is what must not take
// the server's memory), others 71%, and catch-all (mandatory, 5 shares) the
// rest. Exempt (system:masters: admins and the loopback client the operators
// use; probes) takes no seats.
const (
	sharesNodeWrites = 20
	sharesNodeReads  = 5
	sharesDefault    = 75
)

// fcConfig returns mizar's priority levels and flow schemas, each with the
// status the controller would write (so it writes none) and its name as UID:
// the X-Kubernetes-PF-*-UID response headers then name them.
func fcConfig() ([]flowcontrolv1.PriorityLevelConfiguration, []flowcontrolv1.FlowSchema) {
	limited := func(name string, shares int32, queues, handSize, queueLength int32) *flowcontrolv1.PriorityLevelConfiguration {
		return &flowcontrolv1.PriorityLevelConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: flowcontrolv1.PriorityLevelConfigurationSpec{
				Type: flowcontrolv1.PriorityLevelEnablementLimited,
				Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{
					NominalConcurrencyShares: ptr.To(shares),
					// No lending and no borrowing: a level's seats are its own,
					// so a hostile node cannot take the others' by keeping its
					// level busy, nor lose the nodes' to a busy default level.
					LendablePercent:       ptr.To(int32(0)),
					BorrowingLimitPercent: ptr.To(int32(0)),
					LimitResponse: flowcontrolv1.LimitResponse{
						Type: flowcontrolv1.LimitResponseTypeQueue,
						Queuing: &flowcontrolv1.QueuingConfiguration{
							Queues: queues, HandSize: handSize, QueueLengthLimit: queueLength,
						},
					},
				},
			},
		}
	}
	pls := []*flowcontrolv1.PriorityLevelConfiguration{
		fcboot.MandatoryPriorityLevelConfigurationExempt.DeepCopy(),
		fcboot.MandatoryPriorityLevelConfigurationCatchAll.DeepCopy(),
		// Many queues and a small hand: with a thousand droplets, two share
		// all their queues rarely.
		limited(PriorityLevelNodeWrites, sharesNodeWrites, 128, 6, 50),
		limited(PriorityLevelNodeReads, sharesNodeReads, 128, 6, 50),
		limited(PriorityLevelDefault, sharesDefault, 128, 6, 50),
	}

	droplets := []flowcontrolv1.Subject{{Kind: flowcontrolv1.SubjectKindGroup, Group: &flowcontrolv1.GroupSubject{Name: dropletrestriction.Group}}}
	everyone := []flowcontrolv1.Subject{
		{Kind: flowcontrolv1.SubjectKindGroup, Group: &flowcontrolv1.GroupSubject{Name: user.AllAuthenticated}},
		{Kind: flowcontrolv1.SubjectKindGroup, Group: &flowcontrolv1.GroupSubject{Name: user.AllUnauthenticated}},
	}
	rule := func(verbs ...string) flowcontrolv1.ResourcePolicyRule {
		return flowcontrolv1.ResourcePolicyRule{Verbs: verbs, APIGroups: []string{flowcontrolv1.APIGroupAll},
			Resources: []string{flowcontrolv1.ResourceAll}, Namespaces: []string{flowcontrolv1.NamespaceEvery}, ClusterScope: true}
	}
	schema := func(name, pl string, precedence int32, rules flowcontrolv1.PolicyRulesWithSubjects) *flowcontrolv1.FlowSchema {
		return &flowcontrolv1.FlowSchema{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: flowcontrolv1.FlowSchemaSpec{
				PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: pl},
				MatchingPrecedence:         precedence,
				DistinguisherMethod:        &flowcontrolv1.FlowDistinguisherMethod{Type: flowcontrolv1.FlowDistinguisherMethodByUserType},
				Rules:                      []flowcontrolv1.PolicyRulesWithSubjects{rules},
			},
		}
	}
	fss := []*flowcontrolv1.FlowSchema{
		fcboot.MandatoryFlowSchemaExempt.DeepCopy(),
		fcboot.MandatoryFlowSchemaCatchAll.DeepCopy(),
		// Health checks are never queued behind a busy server.
		fcboot.SuggestedFlowSchemaProbes.DeepCopy(),
		// Each droplet is its own flow: its user name (agents authenticated by
		// ServiceAccount token are classified by the node their token names, see
		// dropletFlows).
		schema(flowSchemaNodeWrites, PriorityLevelNodeWrites, 500, flowcontrolv1.PolicyRulesWithSubjects{
			Subjects:      droplets,
			ResourceRules: []flowcontrolv1.ResourcePolicyRule{rule("create", "update", "patch", "delete", "deletecollection")},
		}),
		schema(flowSchemaNodeReads, PriorityLevelNodeReads, 510, flowcontrolv1.PolicyRulesWithSubjects{
			Subjects:         droplets,
			ResourceRules:    []flowcontrolv1.ResourcePolicyRule{rule(flowcontrolv1.VerbAll)},
			NonResourceRules: []flowcontrolv1.NonResourcePolicyRule{{Verbs: []string{flowcontrolv1.VerbAll}, NonResourceURLs: []string{flowcontrolv1.NonResourceAll}}},
		}),
		schema(flowSchemaDefault, PriorityLevelDefault, 9000, flowcontrolv1.PolicyRulesWithSubjects{
			Subjects:         everyone,
			ResourceRules:    []flowcontrolv1.ResourcePolicyRule{rule(flowcontrolv1.VerbAll)},
			NonResourceRules: []flowcontrolv1.NonResourcePolicyRule{{Verbs: []string{flowcontrolv1.VerbAll}, NonResourceURLs: []string{flowcontrolv1.NonResourceAll}}},
		}),
	}

	plOut := make([]flowcontrolv1.PriorityLevelConfiguration, len(pls))
	for i, pl := range pls {
		pl.UID, pl.ResourceVersion = types.UID(pl.Name), "1"
		plOut[i] = *pl
	}
	fsOut := make([]flowcontrolv1.FlowSchema, len(fss))
	for i, fs := range fss {
		fs.UID, fs.ResourceVersion = types.UID(fs.Name), "1"
		pl := fs.Spec.PriorityLevelConfiguration.Name
		fs.Status.Conditions = []flowcontrolv1.FlowSchemaCondition{{
			Type: flowcontrolv1.FlowSchemaConditionDangling, Status: flowcontrolv1.ConditionFalse, Reason: "Found",
			// The controller's own wording: it compares it.
			Message: fmt.Sprintf("This FlowSchema references the PriorityLevelConfiguration object named %q and it exists", pl),
		}}
		fsOut[i] = *fs
	}
	return plOut, fsOut
}

// newFlowControl returns priority and fairness over mizar's configuration,
// served to the library's config controller from memory, and the function
// that starts feeding it. The controller reads its configuration through a
// clientset and informers; those here talk to fcConfigServer in process
// (handlerTransport), not to an API server. client-go's fake clientset would
// do the same, but it links a fake of every API group into the binary (it
// grew mizar-apiserver from 118 to 140 MB); the real clientset and informers
// are linked already (this way: 118.17 -> 118.27 MB).
func newFlowControl(concurrency int, ids dropletrestriction.Identities) (*dropletFlows, func(stop <-chan struct{}), error) {
	pls, fss := fcConfig()
	srv := &fcConfigServer{pls: pls, fss: fss}
	cfg := &rest.Config{Host: "https://mizar-flowcontrol.invalid", ContentConfig: rest.ContentConfig{ContentType: runtime.ContentTypeJSON}}
	client, err := kubernetes.NewForConfigAndClient(cfg, &http.Client{Transport: handlerTransport{srv}})
	if err != nil {
		return nil, nil, fmt.Errorf("priority and fairness configuration client: %w", err)
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	fc := &dropletFlows{Interface: utilflowcontrol.New(factory, client.FlowcontrolV1(), concurrency), ids: ids}
	return fc, factory.Start, nil
}

// dropletFlows classifies every droplet identity as that droplet: a node
// agent authenticated by its ServiceAccount's token is, for priority and
// fairness, the user mizar:droplet:<node> in the droplets' group, so each
// node is its own flow (all agents share one ServiceAccount name). Only the
// classification sees that user; the request keeps its own.
type dropletFlows struct {
	utilflowcontrol.Interface
	ids    dropletrestriction.Identities
	loaded atomic.Bool
}

func (d *dropletFlows) Handle(ctx context.Context, digest utilflowcontrol.RequestDigest,
	noteFn func(*flowcontrolv1.FlowSchema, *flowcontrolv1.PriorityLevelConfiguration, string),
	workEstimator func() fcrequest.WorkEstimate, queueNoteFn fq.QueueNoteFn, execFn func()) {
	digest.User = d.flowUser(digest.User)
	d.Interface.Handle(ctx, digest, noteFn, workEstimator, queueNoteFn, execFn)
}

// flowUser is the user u is classified as.
func (d *dropletFlows) flowUser(u user.Info) user.Info {
	if u == nil {
		return u
	}
	if _, ok := dropletrestriction.DropletOf(u); ok {
		return u
	}
	droplet, ok := d.ids.Of(u)
	if !ok {
		return u
	}
	groups := []string{dropletrestriction.Group, user.AllAuthenticated}
	if droplet == "" {
		// A token bound to no node writes nothing, but its reads are a node
		// agent's: its own flow under its own name.
		return &user.DefaultInfo{Name: u.GetName(), Groups: groups}
	}
	return &user.DefaultInfo{Name: dropletrestriction.UserPrefix + droplet, Groups: groups}
}

// configLoaded reports whether the controller classifies by mizar's
// configuration yet. Until then it knows only the mandatory exempt and
// catch-all schemas and serves every request as catch-all. It asks with a
// probe request of a droplet (taking one node-reads seat for no work).
func (d *dropletFlows) configLoaded(ctx context.Context) bool {
	if d.loaded.Load() {
		return true
	}
	var matched string
	digest := utilflowcontrol.RequestDigest{
		RequestInfo: &request.RequestInfo{IsResourceRequest: true, Verb: "get", APIGroup: networking.GroupName, APIVersion: "v1alpha1",
			Resource: "droplets", Name: "priority-and-fairness-probe"},
		User: &user.DefaultInfo{Name: dropletrestriction.UserPrefix + "priority-and-fairness-probe", Groups: []string{dropletrestriction.Group, user.AllAuthenticated}},
	}
	d.Interface.Handle(ctx, digest, func(fs *flowcontrolv1.FlowSchema, _ *flowcontrolv1.PriorityLevelConfiguration, _ string) {
		matched = fs.Name
	}, func() fcrequest.WorkEstimate { return fcrequest.WorkEstimate{InitialSeats: 1} }, func(bool) {}, func() {})
	if matched != flowSchemaNodeReads {
		return false
	}
	d.loaded.Store(true)
	return true
}

// addPriorityAndFairnessHooks starts feeding the controller its configuration
// and holds readiness until it classifies by it, so that no client of a ready
// server is served as catch-all.
func addPriorityAndFairnessHooks(s *genericapiserver.GenericAPIServer, fc *dropletFlows, start func(stop <-chan struct{})) error {
	if err := s.AddPostStartHook("mizar-priority-and-fairness-config", func(hc genericapiserver.PostStartHookContext) error {
		start(hc.Done())
		return nil
	}); err != nil {
		return err
	}
	// A hook that has not returned fails /readyz (poststarthook/<name>).
	return s.AddPostStartHook("mizar-priority-and-fairness-loaded", func(hc genericapiserver.PostStartHookContext) error {
		began := time.Now()
		for !fc.configLoaded(hc) {
			select {
			case <-hc.Done():
				return fmt.Errorf("priority and fairness configuration not loaded before the server stopped")
			case <-time.After(10 * time.Millisecond):
			}
		}
		klog.InfoS("Priority and fairness classifies by mizar's flow schemas", "after", time.Since(began))
		return nil
	})
}

// fcConfigServer serves the flowcontrol.apiserver.k8s.io/v1 objects of
// fcConfig to the config controller's clientset: lists, watches (which never
// see a change: the configuration is fixed), and status writes (accepted and
// ignored: the objects carry the status the controller wants).
type fcConfigServer struct {
	pls []flowcontrolv1.PriorityLevelConfiguration
	fss []flowcontrolv1.FlowSchema
}

const fcPrefix = "/apis/flowcontrol.apiserver.k8s.io/v1/"

func (s *fcConfigServer) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	resource, name, _ := strings.Cut(strings.TrimPrefix(req.URL.Path, fcPrefix), "/")
	var items []runtime.Object
	var list runtime.Object
	switch resource {
	case "prioritylevelconfigurations":
		for i := range s.pls {
			pl := s.pls[i]
			pl.TypeMeta = metav1.TypeMeta{APIVersion: flowcontrolv1.SchemeGroupVersion.String(), Kind: "PriorityLevelConfiguration"}
			items = append(items, &pl)
		}
		list = &flowcontrolv1.PriorityLevelConfigurationList{TypeMeta: metav1.TypeMeta{APIVersion: flowcontrolv1.SchemeGroupVersion.String(),
			Kind: "PriorityLevelConfigurationList"}, ListMeta: metav1.ListMeta{ResourceVersion: "1"}, Items: s.pls}
	case "flowschemas":
		for i := range s.fss {
			fs := s.fss[i]
			fs.TypeMeta = metav1.TypeMeta{APIVersion: flowcontrolv1.SchemeGroupVersion.String(), Kind: "FlowSchema"}
			items = append(items, &fs)
		}
		list = &flowcontrolv1.FlowSchemaList{TypeMeta: metav1.TypeMeta{APIVersion: flowcontrolv1.SchemeGroupVersion.String(), Kind: "FlowSchemaList"},
			ListMeta: metav1.ListMeta{ResourceVersion: "1"}, Items: s.fss}
	default:
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", runtime.ContentTypeJSON)
	switch {
	case req.Method == http.MethodPatch || req.Method == http.MethodPut:
		// A status write: answer with the object as it is.
		obj, found := named(items, strings.TrimSuffix(name, "/status"))
		if !found {
			http.Error(w, "not found", http.StatusNotFound)
			return
		}
		_ = json.NewEncoder(w).Encode(obj)
	case req.Method != http.MethodGet:
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	case req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1":
		s.watch(w, req, items)
	default:
		_ = json.NewEncoder(w).Encode(list)
	}
}

// watch streams the initial events a streaming list asks for
// (sendInitialEvents, client-go's default since 1.35) and then nothing until
// the client goes.
func (s *fcConfigServer) watch(w http.ResponseWriter, req *http.Request, items []runtime.Object) {
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	if req.URL.Query().Get("sendInitialEvents") == "true" {
		for _, obj := range items {
			_ = enc.Encode(map[string]any{"type": "ADDED", "object": obj})
		}
		kind := "FlowSchema"
		if strings.Contains(req.URL.Path, "prioritylevelconfigurations") {
			kind = "PriorityLevelConfiguration"
		}
		_ = enc.Encode(map[string]any{"type": "BOOKMARK", "object": map[string]any{
			"apiVersion": flowcontrolv1.SchemeGroupVersion.String(), "kind": kind,
			"metadata": map[string]any{"resourceVersion": "1", "annotations": map[string]string{metav1.InitialEventsAnnotationKey: "true"}},
		}})
	}
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	<-req.Context().Done()
}

func named(items []runtime.Object, name string) (runtime.Object, bool) {
	i := slices.IndexFunc(items, func(o runtime.Object) bool {
		m, ok := o.(metav1.Object)
		return ok && m.GetName() == name
	})
	if i < 0 {
		return nil, false
	}
	return items[i], true
}
