package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/retry"

	v1 "mizar.dev/pkg/apis/broker/v1alpha1"
	"mizar.dev/pkg/broker/osb"
)

// syncBuffer is a log sink tests read while the handler writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newOSBLogged is newOSB with the facade's log kept.
func newOSBLogged(t *testing.T) (*osbFixture, *syncBuffer) {
	c := createClassWithIDs(t)
	kube, _ := workload()
	startOperator(t, kube)
	ns := "osb-" + utilrand.String(6)
	log := &syncBuffer{}
	srv := httptest.NewTLSServer(startBroker(t, kube, ns).Handler(creds, slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	t.Cleanup(srv.Close)
	return &osbFixture{t: t, url: srv.URL, http: srv.Client(), ns: ns, kube: kube, class: c,
		serviceID: c.Spec.ID, smallID: c.Spec.Plans[0].ID, haID: c.Spec.Plans[1].ID}, log
}

// randomGUID is a version 4 GUID whose first character is first.
func randomGUID(first byte) string {
	return fmt.Sprintf("%c%07x-%04x-4%03x-%x%03x-%012x", first, rand.Uint32()>>4, rand.Uint32()>>16, rand.Uint32()>>20,
		8+rand.IntN(4), rand.Uint32()>>20, rand.Uint64()>>16)
}

// instancePath escapes an id as a platform puts it in a URL.
func instancePath(id string) string { return "/v2/service_instances/" + url.PathEscape(id) }

// waitProvisioned marks the order's replicas ready and waits for last_operation to succeed.
func (f *osbFixture) waitProvisioned(id string, replicas int32) {
	f.t.Helper()
	t := f.t.(*testing.T)
	markReady(t, f.kube, f.ns, osb.ObjectName(id), replicas)
	var lo reply
	err := wait.PollUntilContextTimeout(testContext(t), 20*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		lo = f.do("GET", instancePath(id)+"/last_operation", nil, nil)
		return lo.body["state"] == "succeeded", nil
	})
	if err != nil {
		t.Fatalf("instance %q never provisioned: %v", id, lo.body)
	}
}

// Any id the spec allows works, end to end through the facade: random GUIDs
// of every leading character, upper-case GUIDs, ids with the other
// unreserved characters and percent-encoded bytes. Each order's workload
// names are DNS-1035 labels; only an empty or oversized id is refused.
func TestOSBAnyInstanceID(t *testing.T) {
	f := newOSB(t)
	var ids []string
	for _, c := range []byte("0123456789abcdef") {
		ids = append(ids, randomGUID(c))
	}
	ids = append(ids, strings.ToUpper(randomGUID('A')), "Svc_"+utilrand.String(5)+".x~y", "with space/and ü "+utilrand.String(4), strings.Repeat("7", 200)+utilrand.String(4))
	for _, id := range ids {
		r := f.expect(f.do("PUT", instancePath(id)+"?accepts_incomplete=true", f.provisionBody(f.smallID, nil), nil), 202, "provision "+id)
		if r.code != 202 {
			continue
		}
		name := osb.ObjectName(id)
		in, err := shared.Client.BrokerV1alpha1().ServiceInstances(f.ns).Get(testContext(t), name, metav1.GetOptions{})
		if err != nil || in.Annotations[osb.AnnotationID] != id {
			t.Fatalf("order of id %q: %v %v", id, err, in)
		}
		w := workloadOf(t, f.ns, name)
		if msgs := validation.IsDNS1035Label(w); len(msgs) > 0 || len(w) > 52 {
			t.Errorf("id %q: workload name %q: %v", id, w, msgs)
		}
		f.expect(f.do("PUT", instancePath(id)+"?accepts_incomplete=true", f.provisionBody(f.smallID, nil), nil), 202, "same provision again "+id)
		f.waitProvisioned(id, 1)
		bid := strings.ToUpper(randomGUID('9'))
		f.expect(f.do("PUT", instancePath(id)+"/service_bindings/"+url.PathEscape(bid), map[string]any{"service_id": f.serviceID, "plan_id": f.smallID}, nil), 201, "bind "+id)
		f.expect(f.do("DELETE", instancePath(id)+"/service_bindings/"+url.PathEscape(bid)+"?service_id="+f.serviceID+"&plan_id="+f.smallID, nil, nil), 200, "unbind "+id)
		f.expect(f.do("DELETE", instancePath(id)+"?accepts_incomplete=true&service_id="+f.serviceID+"&plan_id="+f.smallID, nil, nil), 202, "deprovision "+id)
	}
	for _, id := range ids {
		waitOrder(t, f.ns, osb.ObjectName(id), "deprovisioned", func(in *v1.ServiceInstance) bool { return in == nil })
		workloadGone(t, f.kube, f.ns, osb.ObjectName(id))
	}
	f.expect(f.do("PUT", instancePath(strings.Repeat("x", osb.MaxIDBytes+1))+"?accepts_incomplete=true", f.provisionBody(f.smallID, nil), nil), 400, "an id over the limit")
	// An id whose name another id's order holds is not that order.
	other := randomGUID('c')
	f.expect(f.do("PUT", instancePath(other)+"?accepts_incomplete=true", f.provisionBody(f.smallID, nil), nil), 202, "provision")
	hashed := "X" + other
	// The operator writes the order too (finalizer, status): retry on conflict.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		in, err := shared.Client.BrokerV1alpha1().ServiceInstances(f.ns).Get(testContext(t), other, metav1.GetOptions{})
		if err != nil {
			return err
		}
		in.Annotations[osb.AnnotationID] = hashed
		_, err = shared.Client.BrokerV1alpha1().ServiceInstances(f.ns).Update(testContext(t), in, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	f.expect(f.do("GET", instancePath(other)+"/last_operation", nil, nil), 404, "last_operation of an id whose name holds another id's order")
}

// An order placed with kubectl under a name that begins with a digit (a
// GUID) is fulfilled too: its workload is named from its class and uid.
func TestKubectlOrderNamedLikeAGUID(t *testing.T) {
	ctx := testContext(t)
	c := createClass(t)
	kube, _ := workload()
	startOperator(t, kube)
	ns := "team-" + utilrand.String(6)
	for _, first := range []byte("0123456789abcdef") {
		name := randomGUID(first)
		if _, err := shared.Client.BrokerV1alpha1().ServiceInstances(ns).Create(ctx, order(ns, name, c.Name, "small", ""), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		w := workloadOf(t, ns, name)
		if !strings.HasPrefix(w, c.Name+"-") || len(w) > 52 {
			t.Errorf("order %s: workload name %q", name, w)
		}
		markReady(t, kube, ns, name, 1)
		in := waitOrder(t, ns, name, "Provisioned", func(in *v1.ServiceInstance) bool { return in.Status.Phase == v1.PhaseProvisioned })
		if in.Status.ConnectionSecret != w+"-credentials" {
			t.Errorf("connection secret %q", in.Status.ConnectionSecret)
		}
		// The operator alone writes it, once.
		in.Status.WorkloadName, in.ResourceVersion = "renamed", "" // unconditional: no conflict in the way
		if _, err := shared.Client.BrokerV1alpha1().ServiceInstances(ns).UpdateStatus(ctx, in, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
			t.Errorf("changing status.workloadName: %v, want 422", err)
		}
	}
}

// Bodies are capped before they are read, must be JSON objects (400, not
// the library's 422), and a bind without a Content-Type is processed; the
// provision body must carry organization_guid and space_guid; every error
// names itself; and no parameter ever reaches the log, refused or not.
func TestOSBRequestBodies(t *testing.T) {
	f, log := newOSBLogged(t)
	id := randomGUID('1')
	path := instancePath(id) + "?accepts_incomplete=true"
	raw := func(method, path, contentType string, body io.Reader, length int64) reply {
		req, _ := http.NewRequest(method, f.url+path, body)
		req.SetBasicAuth(creds.Username, creds.Password)
		req.Header.Set("X-Broker-API-Version", "2.17")
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		if length >= 0 {
			req.ContentLength = length
		}
		resp, err := f.http.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		r := reply{code: resp.StatusCode, header: resp.Header, body: map[string]any{}}
		b, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(b, &r.body)
		return r
	}
	big := `{"service_id":"x","plan_id":"y","parameters":{"blob":"` + strings.Repeat("a", osb.MaxBodyBytes) + `"}}`
	r := f.expect(raw("PUT", path, "application/json", strings.NewReader(big), int64(len(big))), 413, "a body over the cap")
	// Without a length, streamed: refused once the cap is passed.
	r2 := f.expect(raw("PUT", path, "application/json", io.MultiReader(strings.NewReader(big), strings.NewReader(big)), -1), 413, "a streamed body over the cap")
	for _, r := range []reply{r, r2} {
		if r.body["error"] != osb.ErrKeyTooLarge {
			t.Errorf("413 body %v", r.body)
		}
	}
	f.expect(raw("PATCH", path, "application/json", strings.NewReader(big), int64(len(big))), 413, "an update over the cap")
	f.expect(raw("PUT", instancePath(id)+"/service_bindings/b1", "application/json", strings.NewReader(big), int64(len(big))), 413, "a bind over the cap")
	for _, body := range []string{`{"service_id":`, `not json`, `[1,2]`, `{"a":1} {"b":2}`, ``} {
		r := f.expect(raw("PUT", path, "application/json", strings.NewReader(body), -1), 400, "malformed body "+body)
		if r.body["error"] != osb.ErrKeyMalformed || r.body["description"] == "" {
			t.Errorf("400 body %v", r.body)
		}
	}
	f.expect(raw("PUT", path, "text/plain", strings.NewReader(`{}`), -1), 400, "a body that says it is not JSON")
	f.notStored(osb.ObjectName(id))

	for _, missing := range []string{"organization_guid", "space_guid"} {
		b := f.provisionBody(f.smallID, nil)
		delete(b, missing)
		r := f.expect(f.do("PUT", path, b, nil), 400, "provision without "+missing)
		if !strings.Contains(fmt.Sprint(r.body["description"]), "organization_guid and space_guid are required") {
			t.Errorf("description %v", r.body)
		}
	}
	f.notStored(osb.ObjectName(id))
	if r := f.expect(f.do("GET", "/v2/catalog", nil, map[string]string{"X-Broker-API-Version": "2.99"}), 412, "unsupported version"); r.body["error"] != osb.ErrKeyVersion {
		t.Errorf("412 body %v", r.body)
	}

	// A secret-looking parameter, refused and then accepted: never logged.
	secret := "s3cr3t_" + utilrand.String(12)
	f.expect(f.do("PUT", path, f.provisionBody(f.smallID, map[string]any{"database": secret + " drop"}), nil), 400, "invalid parameters")
	f.expect(f.do("PUT", path, f.provisionBody(f.smallID, map[string]any{"nosuch": secret}), nil), 400, "unknown parameter")
	f.expect(f.do("PUT", path, f.provisionBody(f.smallID, map[string]any{"database": "d" + secret[7:]}), nil), 202, "provision")
	f.expect(f.do("PUT", path, f.provisionBody(f.smallID, map[string]any{"database": secret}), nil), 409, "another provision under the id")
	f.waitProvisioned(id, 1)
	// A bind without Content-Type is processed, as the spec allows.
	bind := fmt.Sprintf(`{"service_id":%q,"plan_id":%q}`, f.serviceID, f.smallID)
	f.expect(raw("PUT", instancePath(id)+"/service_bindings/b-noct", "", strings.NewReader(bind), -1), 201, "bind without a Content-Type")
	f.expect(raw("PUT", instancePath(id)+"/service_bindings/b-empty", "", strings.NewReader(""), -1), 400, "bind without a body")
	if strings.Contains(log.String(), secret[7:]) || strings.Contains(log.String(), secret) {
		t.Errorf("parameters reached the log:\n%s", log.String())
	}
	if !strings.Contains(log.String(), "refused") {
		t.Errorf("refusals are not logged at all:\n%s", log.String())
	}
}

// The catalog has schemas or nothing (never null), with $schema; a plan is
// plan_updateable only when another plan of the same storage exists.
func TestOSBCatalogSchemasAndPlanUpdateable(t *testing.T) {
	ctx := testContext(t)
	c := createClassWithIDs(t)
	c.Spec.Plans = append(c.Spec.Plans, c.Spec.Plans[1])
	c.Spec.Plans[2].Name, c.Spec.Plans[2].ID, c.Spec.Plans[2].Replicas = "ha-plus", c.Spec.Plans[1].ID+"-plus", 5
	c.Spec.Plans[2].BindingParametersSchema = rawJSON(`{"type":"object","properties":{"readOnly":{"type":"boolean"}}}`)
	c.Spec.Plans[0].ParametersSchema = nil
	c, err := shared.Client.BrokerV1alpha1().ServiceClasses().Update(ctx, c, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kube, _ := workload()
	srv := httptest.NewTLSServer(startBroker(t, kube, "osb-"+utilrand.String(6)).Handler(creds, slog.New(slog.NewTextHandler(io.Discard, nil))))
	t.Cleanup(srv.Close)
	f := &osbFixture{t: t, url: srv.URL, http: srv.Client()}
	var svc map[string]any
	for _, s := range f.expect(f.do("GET", "/v2/catalog", nil, nil), 200, "catalog").body["services"].([]any) {
		if s := s.(map[string]any); s["id"] == c.Spec.ID {
			svc = s
		}
	}
	if svc == nil || svc["plan_updateable"] != false {
		t.Fatalf("service %v", svc)
	}
	for _, p := range svc["plans"].([]any) {
		p := p.(map[string]any)
		want := p["name"] != "small"
		if got, _ := p["plan_updateable"].(bool); got != want {
			t.Errorf("plan %v plan_updateable %v, want %v", p["name"], p["plan_updateable"], want)
		}
		if p["name"] == "small" {
			if _, ok := p["schemas"]; ok {
				t.Errorf("plan small takes no parameters, yet has schemas %v", p["schemas"])
			}
			continue
		}
		s := p["schemas"].(map[string]any)
		for _, path := range [][]string{{"service_instance", "create"}, {"service_instance", "update"}, {"service_binding", "create"}} {
			params, _ := s[path[0]].(map[string]any)[path[1]].(map[string]any)["parameters"].(map[string]any)
			if params == nil || params["$schema"] == nil || params["type"] != "object" {
				t.Errorf("plan %v %v: parameters %v", p["name"], path, params)
			}
		}
	}
}

func rawJSON(s string) *k8sruntime.RawExtension { return &k8sruntime.RawExtension{Raw: []byte(s)} }

// Bind checks service_id and plan_id against the instance (400), validates
// and stores binding parameters, answers 200 to the same binding and 409 to
// another under the same id; binding a failed order says so and what to do.
// Deprovisioning an instance with bindings removes them: nothing is left.
func TestOSBBindRules(t *testing.T) {
	f := newOSB(t)
	ctx := testContext(t)
	c := f.class
	c.Spec.Plans[1].BindingParametersSchema = rawJSON(`{"type":"object","additionalProperties":false,"properties":{"readOnly":{"type":"boolean"}}}`)
	if _, err := shared.Client.BrokerV1alpha1().ServiceClasses().Update(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The catalog follows the watch.
	waitCatalog := func() {
		_ = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			return strings.Contains(fmt.Sprint(f.do("GET", "/v2/catalog", nil, nil).body), "readOnly"), nil
		})
	}
	waitCatalog()
	id := randomGUID('2')
	f.expect(f.do("PUT", instancePath(id)+"?accepts_incomplete=true", f.provisionBody(f.haID, nil), nil), 202, "provision")
	f.waitProvisioned(id, 3)
	bp := instancePath(id) + "/service_bindings/"
	body := func(service, plan string, params map[string]any) map[string]any {
		b := map[string]any{"service_id": service, "plan_id": plan}
		if params != nil {
			b["parameters"] = params
		}
		return b
	}
	f.expect(f.do("PUT", bp+"b1", body("no-such-service", f.haID, nil), nil), 400, "bind with a bogus service_id")
	f.expect(f.do("PUT", bp+"b1", body(f.serviceID, f.smallID, nil), nil), 400, "bind with another plan's id")
	f.expect(f.do("PUT", bp+"b1", body(f.serviceID, f.haID, map[string]any{"readOnly": "yes"}), nil), 400, "bind with invalid parameters")
	f.expect(f.do("PUT", bp+"b1", body(f.serviceID, f.haID, map[string]any{"other": 1}), nil), 400, "bind with unknown parameters")
	if _, err := shared.Client.BrokerV1alpha1().ServiceBindings(f.ns).Get(ctx, "b1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a refused bind stored a binding: %v", err)
	}
	f.expect(f.do("PUT", bp+"b1", body(f.serviceID, f.haID, map[string]any{"readOnly": true}), nil), 201, "bind")
	sb, err := shared.Client.BrokerV1alpha1().ServiceBindings(f.ns).Get(ctx, "b1", metav1.GetOptions{})
	if err != nil || sb.Spec.Parameters == nil || string(sb.Spec.Parameters.Raw) != `{"readOnly":true}` {
		t.Errorf("stored binding %v %v", err, sb)
	}
	f.expect(f.do("PUT", bp+"b1", body(f.serviceID, f.haID, map[string]any{"readOnly": true}), nil), 200, "the same bind again")
	f.expect(f.do("PUT", bp+"b1", body(f.serviceID, f.haID, map[string]any{"readOnly": false}), nil), 409, "another bind under the id")
	f.expect(f.do("PUT", bp+"b1", body(f.serviceID, f.haID, nil), nil), 409, "another bind (no parameters) under the id")
	f.expect(f.do("PUT", bp+"b2", body(f.serviceID, f.haID, nil), nil), 201, "a second binding")

	// Deprovision with two bindings: they go with the instance.
	f.expect(f.do("DELETE", instancePath(id)+"?accepts_incomplete=true&service_id="+f.serviceID+"&plan_id="+f.haID, nil, nil), 202, "deprovision")
	waitOrder(t, f.ns, osb.ObjectName(id), "deprovisioned", func(in *v1.ServiceInstance) bool { return in == nil })
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := shared.Client.BrokerV1alpha1().ServiceBindings(f.ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0, nil
	})
	if err != nil {
		t.Errorf("bindings outlived their deprovisioned instance")
	}
	workloadGone(t, f.kube, f.ns, osb.ObjectName(id))
	f.expect(f.do("DELETE", bp+"b1?service_id="+f.serviceID+"&plan_id="+f.haID, nil, nil), 410, "unbind after deprovision")

	// A failed order (the workload cluster refuses its StatefulSet): the
	// description says it failed and what to do.
	f.kube.PrependReactor("create", "statefulsets", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "statefulsets"}, "", errors.New("not here"))
	})
	failed := randomGUID('3')
	f.expect(f.do("PUT", instancePath(failed)+"?accepts_incomplete=true", f.provisionBody(f.smallID, nil), nil), 202, "provision")
	waitOrder(t, f.ns, osb.ObjectName(failed), "Failed", func(in *v1.ServiceInstance) bool { return in != nil && in.Status.Phase == v1.PhaseFailed })
	r := f.expect(f.do("PUT", instancePath(failed)+"/service_bindings/bf", body(f.serviceID, f.smallID, nil), nil), 422, "bind a failed order")
	if desc := fmt.Sprint(r.body["description"]); r.body["error"] != "InstanceNotUsable" || strings.Contains(desc, "poll last_operation") || !strings.Contains(desc, "deprovision") {
		t.Errorf("binding a failed order: %v", r.body)
	}
}
