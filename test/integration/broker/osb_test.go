package broker

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	osbclient "github.com/pmorie/go-open-service-broker-client/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	kubefake "k8s.io/client-go/kubernetes/fake"

	v1 "mizar.dev/pkg/apis/broker/v1alpha1"
	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/pkg/broker/osb"
)

var creds = osb.Credentials{Username: "platform", Password: "a-long-enough-password"}

// osbFixture is a facade over the shared mizar-apiserver on its own TLS
// listener, with the fulfillment operator and a fake workload cluster.
type osbFixture struct {
	t         testing.TB
	url       string
	http      *http.Client
	ns        string
	kube      *kubefake.Clientset
	class     *v1.ServiceClass
	serviceID string
	smallID   string
	haID      string
}

func newOSB(t *testing.T) *osbFixture {
	c := createClassWithIDs(t)
	kube, _ := workload()
	startOperator(t, kube)
	ns := "osb-" + utilrand.String(6)
	srv := httptest.NewTLSServer(startBroker(t, kube, ns).Handler(creds, slog.New(slog.NewTextHandler(io.Discard, nil))))
	t.Cleanup(srv.Close)
	return &osbFixture{t: t, url: srv.URL, http: srv.Client(), ns: ns, kube: kube, class: c,
		serviceID: c.Spec.ID, smallID: c.Spec.Plans[0].ID, haID: c.Spec.Plans[1].ID}
}

// createClassWithIDs is the mysql class with ids of the test's own, so the
// catalog lookups of parallel runs cannot meet.
func createClassWithIDs(t testing.TB) *v1.ServiceClass {
	c := createClass(t)
	suffix := utilrand.String(8)
	c.Spec.ID += "-" + suffix
	for i := range c.Spec.Plans {
		c.Spec.Plans[i].ID += "-" + suffix
	}
	// Ids are immutable; a new class under another name carries the new ones.
	c.Name, c.ResourceVersion = c.Name+"x", ""
	c, err := shared.Client.BrokerV1alpha1().ServiceClasses().Create(testContext(t), c, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = shared.Client.BrokerV1alpha1().ServiceClasses().Delete(context.Background(), c.Name, metav1.DeleteOptions{})
	})
	return c
}

type reply struct {
	code   int
	body   map[string]any
	header http.Header
}

func (f *osbFixture) do(method, path string, body any, hdr map[string]string) reply {
	f.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, f.url+path, rd)
	req.SetBasicAuth(creds.Username, creds.Password)
	req.Header.Set("X-Broker-API-Version", "2.17")
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := f.http.Do(req)
	if err != nil {
		f.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	r := reply{code: resp.StatusCode, header: resp.Header, body: map[string]any{}}
	_ = json.NewDecoder(resp.Body).Decode(&r.body)
	return r
}

func (f *osbFixture) expect(r reply, code int, what string) reply {
	f.t.Helper()
	if r.code != code {
		f.t.Errorf("%s: HTTP %d %v, want %d", what, r.code, r.body, code)
	}
	return r
}

func (f *osbFixture) provisionBody(plan string, params map[string]any) map[string]any {
	b := map[string]any{"service_id": f.serviceID, "plan_id": plan, "organization_guid": "org", "space_guid": "space"}
	if params != nil {
		b["parameters"] = params
	}
	return b
}

func (f *osbFixture) notStored(id string) {
	f.t.Helper()
	if _, err := shared.Client.BrokerV1alpha1().ServiceInstances(f.ns).Get(testContext(f.t), id, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		f.t.Errorf("a rejected request stored instance %s (%v)", id, err)
	}
}

func TestOSBHeadersAndAuth(t *testing.T) {
	f := newOSB(t)
	f.expect(f.do("GET", "/v2/catalog", nil, map[string]string{"Authorization": ""}), 401, "no credentials")
	req, _ := http.NewRequest("GET", f.url+"/v2/catalog", nil)
	req.SetBasicAuth(creds.Username, "wrong-password-of-length")
	req.Header.Set("X-Broker-API-Version", "2.14")
	if resp, err := f.http.Do(req); err != nil || resp.StatusCode != 401 {
		t.Errorf("wrong password: %v %v", resp.StatusCode, err)
	}
	for _, v := range []string{"", "2.12", "2.18", "3.0", "two"} {
		f.expect(f.do("GET", "/v2/catalog", nil, map[string]string{"X-Broker-API-Version": v}), 412, "version "+v)
	}
	for _, v := range []string{"2.13", "2.14", "2.15", "2.16", "2.17"} {
		f.expect(f.do("GET", "/v2/catalog", nil, map[string]string{"X-Broker-API-Version": v}), 200, "version "+v)
	}
	cat := f.expect(f.do("GET", "/v2/catalog", nil, nil), 200, "catalog")
	found := false
	for _, s := range cat.body["services"].([]any) {
		s := s.(map[string]any)
		if s["id"] != f.serviceID {
			continue
		}
		found = true
		plans := s["plans"].([]any)
		if len(plans) != 2 || s["bindable"] != true {
			t.Errorf("catalog entry %v", s)
		}
		if _, ok := plans[1].(map[string]any)["schemas"]; !ok {
			t.Errorf("plan without its parameter schema: %v", plans[1])
		}
	}
	if !found {
		t.Errorf("catalog lacks service %s: %v", f.serviceID, cat.body)
	}
	if _, err := osb.LoadCredentials("/nonexistent"); err == nil {
		t.Error("credentials from a missing file")
	}
}

func TestOSBProvisionBindDeprovision(t *testing.T) {
	f := newOSB(t)
	id := "4a1b" + strings.ToLower(utilrand.String(8))
	path := "/v2/service_instances/" + id

	f.expect(f.do("PUT", path, f.provisionBody(f.haID, nil), nil), 422, "provision without accepts_incomplete")
	f.notStored(id)
	f.expect(f.do("PUT", path+"?accepts_incomplete=true", f.provisionBody("nosuchplan", nil), nil), 400, "unknown plan")
	bad := f.expect(f.do("PUT", path+"?accepts_incomplete=true", f.provisionBody(f.haID, map[string]any{"maxConnections": 1}), nil), 400, "invalid parameters")
	if d, _ := bad.body["description"].(string); !strings.Contains(d, "spec.parameters.maxConnections") {
		t.Errorf("400 description %q does not name the parameter", d)
	}
	f.notStored(id)

	params := map[string]any{"database": "shop"}
	first := f.expect(f.do("PUT", path+"?accepts_incomplete=true", f.provisionBody(f.haID, params), nil), 202, "provision")
	op, _ := first.body["operation"].(string)
	if !strings.HasPrefix(op, "provision-") {
		t.Fatalf("operation %q", op)
	}
	again := f.expect(f.do("PUT", path+"?accepts_incomplete=true", f.provisionBody(f.haID, params), nil), 202, "same provision while running")
	if again.body["operation"] != op {
		t.Errorf("second 202 has operation %v, want %s", again.body["operation"], op)
	}
	f.expect(f.do("PUT", path+"?accepts_incomplete=true", f.provisionBody(f.haID, map[string]any{"database": "other"}), nil), 409, "different parameters")
	f.expect(f.do("PUT", path+"?accepts_incomplete=true", f.provisionBody(f.smallID, params), nil), 409, "different plan")
	f.expect(f.do("PUT", path+"/service_bindings/b1", map[string]any{"service_id": f.serviceID, "plan_id": f.haID}, nil), 422, "bind before ready")

	// Poll until the saga waits for replicas; the description says so.
	var lo reply
	err := wait.PollUntilContextTimeout(testContext(t), 20*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		lo = f.do("GET", path+"/last_operation?operation="+op, nil, nil)
		d, _ := lo.body["description"].(string)
		return strings.Contains(d, "waiting for 0/3 replicas ready"), nil
	})
	if err != nil || lo.code != 200 || lo.body["state"] != "in progress" || lo.header.Get("Retry-After") == "" {
		t.Fatalf("last_operation while provisioning: %d %v %v (%v)", lo.code, lo.body, lo.header, err)
	}
	if d := lo.body["description"].(string); d != "step 5 of 5 (WaitingForReplicas): waiting for 0/3 replicas ready" {
		t.Errorf("description %q", d)
	}
	markReady(t, f.kube, f.ns, id, 3)
	err = wait.PollUntilContextTimeout(testContext(t), 20*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		lo = f.do("GET", path+"/last_operation", nil, nil)
		return lo.body["state"] == "succeeded", nil
	})
	if err != nil {
		t.Fatalf("never succeeded: %v", lo.body)
	}
	f.expect(f.do("PUT", path+"?accepts_incomplete=true", f.provisionBody(f.haID, params), nil), 200, "identical provision when done")
	f.expect(f.do("PATCH", path+"?accepts_incomplete=true", map[string]any{"service_id": f.serviceID, "plan_id": f.haID}, nil), 200, "update that changes nothing")
	f.expect(f.do("PATCH", path+"?accepts_incomplete=true", map[string]any{"service_id": f.serviceID, "plan_id": f.smallID}, nil), 422, "plan change")
	if in, err := shared.Client.BrokerV1alpha1().ServiceInstances(f.ns).Get(testContext(t), id, metav1.GetOptions{}); err != nil || in.Spec.Plan != "ha" {
		t.Errorf("a refused plan change changed the order: %v %v", err, in.Spec.Plan)
	}

	bindPath := path + "/service_bindings/b1"
	bindBody := map[string]any{"service_id": f.serviceID, "plan_id": f.haID}
	b := f.expect(f.do("PUT", bindPath, bindBody, nil), 201, "bind")
	w := workloadOf(t, f.ns, id)
	secret, _ := f.kube.CoreV1().Secrets(f.ns).Get(testContext(t), w+"-credentials", metav1.GetOptions{})
	cr, _ := b.body["credentials"].(map[string]any)
	if cr["password"] != secret.StringData["password"] || cr["database"] != "shop" || cr["port"] != "3306" || cr["host"] != w+"."+f.ns+".svc" {
		t.Errorf("credentials %v", cr)
	}
	f.expect(f.do("PUT", bindPath, bindBody, nil), 200, "identical bind")
	if sb := waitBinding(t, f.ns, "b1", "Bound"); sb.Status.SecretName != w+"-credentials" || sb.Status.Phase != v1.PhaseProvisioned {
		t.Errorf("ServiceBinding status %+v", sb.Status)
	}
	f.expect(f.do("DELETE", bindPath+"?service_id="+f.serviceID+"&plan_id="+f.haID, nil, nil), 200, "unbind")
	f.expect(f.do("DELETE", bindPath+"?service_id="+f.serviceID+"&plan_id="+f.haID, nil, nil), 410, "unbind of a gone binding")

	del := "?service_id=" + f.serviceID + "&plan_id=" + f.haID
	f.expect(f.do("DELETE", path+del, nil, nil), 422, "deprovision without accepts_incomplete")
	d := f.expect(f.do("DELETE", path+del+"&accepts_incomplete=true", nil, nil), 202, "deprovision")
	dop, _ := d.body["operation"].(string)
	err = wait.PollUntilContextTimeout(testContext(t), 20*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		lo = f.do("GET", path+"/last_operation?operation="+dop, nil, nil)
		return lo.code == 410, nil
	})
	if err != nil {
		t.Fatalf("deprovision never finished: %d %v", lo.code, lo.body)
	}
	workloadGone(t, f.kube, f.ns, id)
	f.expect(f.do("DELETE", path+del+"&accepts_incomplete=true", nil, nil), 410, "deprovision of a gone instance")
	f.expect(f.do("GET", "/v2/service_instances/unknown1/last_operation", nil, nil), 404, "last_operation of an unknown instance")
}

// TestOSBIndependentClient drives the facade with a platform-side client library.
func TestOSBIndependentClient(t *testing.T) {
	f := newOSB(t)
	cfg := osbclient.DefaultClientConfiguration()
	cfg.URL = f.url
	cfg.Insecure = true
	cfg.TLSConfig = &tls.Config{InsecureSkipVerify: true}
	cfg.AuthConfig = &osbclient.AuthConfig{BasicAuthConfig: &osbclient.BasicAuthConfig{Username: creds.Username, Password: creds.Password}}
	client, err := osbclient.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cat, err := client.GetCatalog()
	if err != nil || len(cat.Services) == 0 {
		t.Fatalf("catalog: %v", err)
	}
	id := "c0ffee" + strings.ToLower(utilrand.String(8))
	resp, err := client.ProvisionInstance(&osbclient.ProvisionRequest{
		InstanceID: id, AcceptsIncomplete: true, ServiceID: f.serviceID, PlanID: f.smallID,
		OrganizationGUID: "org", SpaceGUID: "space", Parameters: map[string]any{"database": "inventory"},
	})
	if err != nil || !resp.Async || resp.OperationKey == nil {
		t.Fatalf("provision: %+v %v", resp, err)
	}
	poll := func(op *osbclient.OperationKey, until osbclient.LastOperationState) {
		t.Helper()
		err := wait.PollUntilContextTimeout(testContext(t), 20*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
			lo, err := client.PollLastOperation(&osbclient.LastOperationRequest{InstanceID: id, OperationKey: op})
			if until == "gone" {
				return osbclient.IsGoneError(err), nil
			}
			if err != nil {
				return false, err
			}
			if lo.State == osbclient.StateInProgress && lo.Description != nil && strings.Contains(*lo.Description, "0/1 replicas") {
				markReady(t, f.kube, f.ns, id, 1)
			}
			return lo.State == until, nil
		})
		if err != nil {
			t.Fatalf("polling for %s: %v", until, err)
		}
	}
	poll(resp.OperationKey, osbclient.StateSucceeded)
	bind, err := client.Bind(&osbclient.BindRequest{InstanceID: id, BindingID: "app1", ServiceID: f.serviceID, PlanID: f.smallID, AppGUID: strPtr("app")})
	if err != nil || bind.Credentials["database"] != "inventory" {
		t.Fatalf("bind: %+v %v", bind, err)
	}
	if _, err := client.Unbind(&osbclient.UnbindRequest{InstanceID: id, BindingID: "app1", ServiceID: f.serviceID, PlanID: f.smallID}); err != nil {
		t.Fatalf("unbind: %v", err)
	}
	dresp, err := client.DeprovisionInstance(&osbclient.DeprovisionRequest{InstanceID: id, AcceptsIncomplete: true, ServiceID: f.serviceID, PlanID: f.smallID})
	if err != nil || !dresp.Async {
		t.Fatalf("deprovision: %+v %v", dresp, err)
	}
	poll(dresp.OperationKey, "gone")
	workloadGone(t, f.kube, f.ns, id)
}

func strPtr(s string) *string { return &s }

// TestOSBListenerOfTheServer runs mizar-apiserver with the OSB API on its own
// TLS listener and reads the (empty) catalog of its own etcd through it.
func TestOSBListenerOfTheServer(t *testing.T) {
	dir := t.TempDir()
	credFile := dir + "/osb-credentials"
	if err := os.WriteFile(credFile, []byte(creds.Username+":"+creds.Password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The workload kubeconfig is only needed for bind; the shared server's will do.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	apiservertest.Start(t, dir, "--broker-osb-address", addr, "--broker-osb-credentials-file", credFile,
		"--broker-workload-kubeconfig", shared.Kubeconfig)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	var last string
	err = wait.PollUntilContextTimeout(testContext(t), 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		req, _ := http.NewRequest("GET", "https://"+addr+"/v2/catalog", nil)
		req.SetBasicAuth(creds.Username, creds.Password)
		req.Header.Set("X-Broker-API-Version", "2.14")
		resp, err := client.Do(req)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		return resp.StatusCode == 200 && strings.Contains(string(b), `"services"`), nil
	})
	if err != nil {
		t.Fatalf("OSB catalog through the server's listener: %s", last)
	}

	short := dir + "/short"
	_ = os.WriteFile(short, []byte("platform:short"), 0o600)
	if _, err := apiservertest.New(t.TempDir(), "--broker-osb-address", "127.0.0.1:0", "--broker-osb-credentials-file", short,
		"--broker-workload-kubeconfig", shared.Kubeconfig); err == nil || !strings.Contains(err.Error(), "at least 16") {
		t.Errorf("a short password: %v", err)
	}
	if _, err := apiservertest.New(t.TempDir(), "--broker-osb-address", "127.0.0.1:0"); err == nil || !strings.Contains(err.Error(), "no default password") {
		t.Errorf("no credentials: %v", err)
	}
}

// TestOSBServedOrders places, repeats, refuses and deletes orders through
// the server's own OSB listener, whose facade reaches the server through its
// handler chain in process: the catalog watch, creates, reads and deletes
// all take that path.
func TestOSBServedOrders(t *testing.T) {
	ctx := testContext(t)
	c := createClassWithIDs(t)
	// Returns once the class created after the start is in the catalog: the watch works.
	url, hc, s := servedOSB(t, c)
	f := &osbFixture{t: t, url: url, http: hc, serviceID: c.Spec.ID, smallID: c.Spec.Plans[0].ID, haID: c.Spec.Plans[1].ID}
	orders := s.Client.BrokerV1alpha1().ServiceInstances("mizar-broker")
	id := "served-" + utilrand.String(6)
	path := "/v2/service_instances/" + id + "?accepts_incomplete=true"

	f.expect(f.do("PUT", path, f.provisionBody(f.haID, map[string]any{"maxConnections": 1}), nil), 400, "invalid parameters")
	if _, err := orders.Get(ctx, id, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a refused provision left an order: %v", err)
	}
	r := f.expect(f.do("PUT", path, f.provisionBody(f.smallID, nil), nil), 202, "provision")
	in, err := orders.Get(ctx, id, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the order behind the 202: %v", err)
	}
	if r.body["operation"] != in.Status.Operation || in.Labels[osb.LabelOSB] != "true" {
		t.Errorf("202 operation %v, stored order %q labels %v", r.body["operation"], in.Status.Operation, in.Labels)
	}
	if again := f.expect(f.do("PUT", path, f.provisionBody(f.smallID, nil), nil), 202, "the same provision"); again.body["operation"] != r.body["operation"] {
		t.Errorf("the same provision answered operation %v, first %v", again.body["operation"], r.body["operation"])
	}
	f.expect(f.do("PUT", path, f.provisionBody(f.haID, nil), nil), 409, "different plan")
	lo := f.expect(f.do("GET", "/v2/service_instances/"+id+"/last_operation", nil, nil), 200, "last_operation")
	if lo.body["state"] != "in progress" {
		t.Errorf("last_operation of a waiting order: %v", lo.body)
	}
	// A platform that speaks HTTP/2 gets it.
	h2 := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, ForceAttemptHTTP2: true}}
	req, _ := http.NewRequest("GET", url+"/v2/catalog", nil)
	req.SetBasicAuth(creds.Username, creds.Password)
	req.Header.Set("X-Broker-API-Version", "2.17")
	if resp, err := h2.Do(req); err != nil || resp.StatusCode != 200 || resp.ProtoMajor != 2 {
		t.Errorf("catalog over HTTP/2: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	f.expect(f.do("DELETE", path+"&service_id="+f.serviceID+"&plan_id="+f.smallID, nil, nil), 202, "deprovision")
	// No fulfillment operator runs here: the order waits for nothing but its deletion.
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := orders.Get(ctx, id, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("the deprovisioned order stays: %v", err)
	}
}

// startBroker returns a facade whose catalog watch runs until the test ends.
func startBroker(t testing.TB, kube *kubefake.Clientset, ns string) *osb.Broker {
	b := osb.New(shared.Client, kube, ns)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestOSBCatalogFollowsClasses changes a class's plan (its description and
// its parameter schema) and then deletes the class: the catalog, which the
// facade converts once per class version, and the server's parameter check,
// which keeps a validator per schema, both follow at once.
func TestOSBCatalogFollowsClasses(t *testing.T) {
	f := newOSB(t)
	ctx := testContext(t)
	small := func() map[string]any {
		cat := f.expect(f.do("GET", "/v2/catalog", nil, nil), 200, "catalog")
		for _, s := range cat.body["services"].([]any) {
			if s := s.(map[string]any); s["id"] == f.serviceID {
				return s["plans"].([]any)[0].(map[string]any)
			}
		}
		return nil
	}
	if small() == nil {
		t.Fatalf("the catalog lacks service %s", f.serviceID)
	}
	ok := map[string]any{"database": "app", "characterSet": "latin1"}
	f.expect(f.do("PUT", "/v2/service_instances/cat1?accepts_incomplete=true", f.provisionBody(f.smallID, ok), nil), 202, "provision with latin1")

	c, err := shared.Client.BrokerV1alpha1().ServiceClasses().Get(ctx, f.class.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Spec.Plans[0].Description = "changed " + utilrand.String(6)
	schema := strings.Replace(string(c.Spec.Plans[0].ParametersSchema.Raw), `"latin1"`, `"ascii"`, 1)
	if schema == string(c.Spec.Plans[0].ParametersSchema.Raw) {
		t.Fatalf("the small plan's schema has no latin1 to replace: %s", schema)
	}
	c.Spec.Plans[0].ParametersSchema.Raw = []byte(schema)
	if _, err := shared.Client.BrokerV1alpha1().ServiceClasses().Update(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		p := small()
		return p != nil && p["description"] == c.Spec.Plans[0].Description && strings.Contains(fmt.Sprint(p["schemas"]), "ascii"), nil
	})
	if err != nil {
		t.Fatalf("the catalog never showed the changed plan: %v", small())
	}
	// The server checks orders against the new schema at once.
	r := f.do("PUT", "/v2/service_instances/cat2?accepts_incomplete=true", f.provisionBody(f.smallID, ok), nil)
	f.expect(r, 400, "provision with latin1, no longer allowed")
	if !strings.Contains(fmt.Sprint(r.body), "characterSet") {
		t.Errorf("the refusal does not name characterSet: %v", r.body)
	}
	f.expect(f.do("PUT", "/v2/service_instances/cat3?accepts_incomplete=true",
		f.provisionBody(f.smallID, map[string]any{"characterSet": "ascii"}), nil), 202, "provision with ascii, now allowed")

	// A class goes once no order uses it.
	if err := shared.Client.BrokerV1alpha1().ServiceClasses().Delete(ctx, c.Name, metav1.DeleteOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("deleting a class orders use: %v, want 422", err)
	}
	for _, id := range []string{"cat1", "cat3"} {
		if err := shared.Client.BrokerV1alpha1().ServiceInstances(f.ns).Delete(ctx, id, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		waitOrder(t, f.ns, id, "deleted", func(in *v1.ServiceInstance) bool { return in == nil })
	}
	if err := shared.Client.BrokerV1alpha1().ServiceClasses().Delete(ctx, c.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return small() == nil, nil
	})
	if err != nil {
		t.Fatal("the catalog still offers a deleted class")
	}
}
