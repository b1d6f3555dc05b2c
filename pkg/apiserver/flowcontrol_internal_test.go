package apiserver

import (
	"context"
	"testing"
	"time"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/endpoints/request"
	utilflowcontrol "k8s.io/apiserver/pkg/util/flowcontrol"
	fcrequest "k8s.io/apiserver/pkg/util/flowcontrol/request"

	"mizar.dev/pkg/admission/dropletrestriction"
)

// TestAgentTokensAreFlowsOfTheirNode: node agents authenticated by their
// ServiceAccount's bound token share one user name; priority and fairness
// classifies each by the node its token names, so each node is its own flow
// (and one node's flood queues only behind itself).
func TestAgentTokensAreFlowsOfTheirNode(t *testing.T) {
	const agentSA = "system:serviceaccount:mizar-system:mizar-nodeagent"
	fc, start, err := newFlowControl(100, dropletrestriction.Identities{AgentServiceAccounts: []string{agentSA}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start(ctx.Done())
	go func() { _ = fc.Run(ctx.Done()) }()
	for !fc.configLoaded(ctx) {
		if ctx.Err() != nil {
			t.Fatal("the priority and fairness configuration was never loaded")
		}
		time.Sleep(10 * time.Millisecond)
	}

	agent := func(node string) user.Info {
		extra := map[string][]string{}
		if node != "" {
			extra[dropletrestriction.NodeNameExtra] = []string{node}
		}
		return &user.DefaultInfo{Name: agentSA, Groups: []string{"system:serviceaccounts", user.AllAuthenticated}, Extra: extra}
	}
	for _, c := range []struct {
		who            user.Info
		verb           string
		schema, flowOf string
	}{
		{agent("node-a"), "create", flowSchemaNodeWrites, "mizar:droplet:node-a"},
		{agent("node-b"), "create", flowSchemaNodeWrites, "mizar:droplet:node-b"},
		{agent("node-a"), "watch", flowSchemaNodeReads, "mizar:droplet:node-a"},
		{agent(""), "list", flowSchemaNodeReads, agentSA},
		{&user.DefaultInfo{Name: "mizar:droplet:c", Groups: []string{dropletrestriction.Group}}, "patch", flowSchemaNodeWrites, "mizar:droplet:c"},
		{&user.DefaultInfo{Name: "system:serviceaccount:default:app", Groups: []string{user.AllAuthenticated}}, "create", flowSchemaDefault, "system:serviceaccount:default:app"},
		{&user.DefaultInfo{Name: "admin", Groups: []string{user.SystemPrivilegedGroup, user.AllAuthenticated}}, "create", "exempt", ""},
	} {
		var schema, flow string
		digest := utilflowcontrol.RequestDigest{
			RequestInfo: &request.RequestInfo{IsResourceRequest: true, Verb: c.verb, APIGroup: "networking.mizar.dev", APIVersion: "v1alpha1", Resource: "endpoints", Namespace: "default"},
			User:        c.who,
		}
		fc.Handle(ctx, digest, func(fs *flowcontrolv1.FlowSchema, _ *flowcontrolv1.PriorityLevelConfiguration, distinguisher string) {
			schema, flow = fs.Name, distinguisher
		}, func() fcrequest.WorkEstimate { return fcrequest.WorkEstimate{InitialSeats: 1} }, func(bool) {}, func() {})
		if schema != c.schema || flow != c.flowOf {
			t.Errorf("%s by %s %v: flow schema %q, flow %q; want %q, %q", c.verb, c.who.GetName(), c.who.GetExtra(), schema, flow, c.schema, c.flowOf)
		}
	}
}
