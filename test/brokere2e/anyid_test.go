package brokere2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	v1 "mizar.dev/pkg/apis/broker/v1alpha1"
	"mizar.dev/pkg/broker/osb"
)

// guid is a random version 4 GUID whose first character is first.
func guid(first byte) string {
	return fmt.Sprintf("%c%07x-%04x-4%03x-%x%03x-%012x", first, rand.Uint32()>>4, rand.Uint32()>>16, rand.Uint32()>>20,
		8+rand.IntN(4), rand.Uint32()>>20, rand.Uint64()>>16)
}

// TestAnyIDEndToEnd provisions through the served OSB API with random GUIDs
// of every leading character (and upper-case ones), and with kubectl under
// GUID names, against the real workload cluster, whose kube-apiserver checks
// every name the saga makes (a Service name may not begin with a digit):
// every order is Provisioned, binds, and leaves nothing once deprovisioned.
func TestAnyIDEndToEnd(t *testing.T) {
	dir := t.TempDir()
	credFile := filepath.Join(dir, "osb-credentials")
	const user, pass = "platform", "a-long-enough-password"
	if err := os.WriteFile(credFile, []byte(user+":"+pass), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	m := startMizar(t, filepath.Join(dir, "data"), "--broker-osb-address", addr, "--broker-osb-credentials-file", credFile)
	applyClass(t, m)
	class, err := m.Client.BrokerV1alpha1().ServiceClasses().Get(context.Background(), "mysql", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	small := class.Spec.Plans[0].ID
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	do := func(method, path string, body any) (int, map[string]any) {
		var b []byte
		if body != nil {
			b, _ = json.Marshal(body)
		}
		req, _ := http.NewRequest(method, "https://"+addr+path, bytes.NewReader(b))
		req.SetBasicAuth(user, pass)
		req.Header.Set("X-Broker-API-Version", "2.17")
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return 0, map[string]any{"error": err.Error()}
		}
		defer resp.Body.Close()
		out := map[string]any{}
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	const osbNS = "mizar-broker"
	var ids []string
	for _, c := range []byte("0123456789abcdef") {
		ids = append(ids, guid(c))
	}
	ids = append(ids, strings.ToUpper(guid('D')))
	createVolumes(t, "anyid-"+strings.ToLower(guid('a')[:6]), len(ids), "5Gi")
	provision := map[string]any{"service_id": class.Spec.ID, "plan_id": small, "organization_guid": "org", "space_guid": "space"}
	waitFor(t, 30*time.Second, "the OSB listener", func(context.Context) (bool, error) {
		code, _ := do("GET", "/v2/catalog", nil)
		return code == 200, nil
	})
	for _, id := range ids {
		if code, body := do("PUT", "/v2/service_instances/"+url.PathEscape(id)+"?accepts_incomplete=true", provision); code != 202 {
			t.Fatalf("provision %s: %d %v", id, code, body)
		}
	}
	for _, id := range ids {
		waitFor(t, 2*time.Minute, "instance "+id+" provisioned", func(context.Context) (bool, error) {
			code, body := do("GET", "/v2/service_instances/"+url.PathEscape(id)+"/last_operation", nil)
			if code == 200 && body["state"] == "failed" {
				return false, fmt.Errorf("provisioning %s failed: %v", id, body["description"])
			}
			return code == 200 && body["state"] == "succeeded", nil
		})
		in, err := m.Client.BrokerV1alpha1().ServiceInstances(osbNS).Get(context.Background(), osb.ObjectName(id), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if msgs := validation.IsDNS1035Label(in.Status.WorkloadName); len(msgs) > 0 {
			t.Errorf("instance %s: workload name %q: %v", id, in.Status.WorkloadName, msgs)
		}
		if err := objectsOf(t, osbNS, string(in.UID)).exactlyOne(); err != nil {
			t.Errorf("instance %s: %v", id, err)
		}
		bind := "/v2/service_instances/" + url.PathEscape(id) + "/service_bindings/" + url.PathEscape(strings.ToUpper(guid('7')))
		code, body := do("PUT", bind, map[string]any{"service_id": class.Spec.ID, "plan_id": small})
		if cr, _ := body["credentials"].(map[string]any); code != 201 || cr["host"] != in.Status.WorkloadName+"."+osbNS+".svc" {
			t.Errorf("bind %s: %d %v", id, code, body)
		}
	}
	// A platform polls a deprovision with the operation its 202 named; only
	// then is a vanished instance 410 Gone (success) rather than 404.
	operations := map[string]string{}
	for _, id := range ids {
		// The binding goes with the instance.
		code, body := do("DELETE", "/v2/service_instances/"+url.PathEscape(id)+"?accepts_incomplete=true&service_id="+class.Spec.ID+"&plan_id="+small, nil)
		if code != 202 {
			t.Errorf("deprovision %s: %d %v", id, code, body)
		}
		operations[id], _ = body["operation"].(string)
	}
	for _, id := range ids {
		waitFor(t, 2*time.Minute, "instance "+id+" deprovisioned", func(context.Context) (bool, error) {
			code, _ := do("GET", "/v2/service_instances/"+url.PathEscape(id)+"/last_operation?operation="+url.QueryEscape(operations[id]), nil)
			return code == 410, nil
		})
		waitGoneNamed(t, osbNS, osb.ObjectName(id), false)
	}
	waitFor(t, 30*time.Second, "the bindings removed", func(ctx context.Context) (bool, error) {
		l, err := m.Client.BrokerV1alpha1().ServiceBindings(osbNS).List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0, nil
	})

	// kubectl: orders named like GUIDs, every leading digit.
	ns := servedNamespace(t, 10, "5Gi")
	kubeconfig := filepath.Join(dir, "data", "kubeconfig")
	var names []string
	for _, c := range []byte("0123456789") {
		name := guid(c)
		names = append(names, name)
		manifest := fmt.Sprintf("apiVersion: broker.mizar.dev/v1alpha1\nkind: ServiceInstance\nmetadata:\n  name: %s\n  namespace: %s\nspec:\n  class: mysql\n  plan: small\n", name, ns)
		cmd := exec.Command(kubectlBin, "--kubeconfig", kubeconfig, "create", "-f", "-")
		cmd.Stdin = strings.NewReader(manifest)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("kubectl create %s: %v\n%s", name, err, out)
		}
	}
	for _, name := range names {
		waitFor(t, 2*time.Minute, "order "+name+" Provisioned", func(ctx context.Context) (bool, error) {
			in, err := m.Client.BrokerV1alpha1().ServiceInstances(ns).Get(ctx, name, metav1.GetOptions{})
			if err == nil && in.Status.Phase == v1.PhaseFailed {
				return false, fmt.Errorf("order %s failed: %v", name, in.Status.Conditions)
			}
			return err == nil && in.Status.Phase == v1.PhaseProvisioned, nil
		})
		out, err := exec.Command(kubectlBin, "--kubeconfig", kubeconfig, "delete", "msi", "-n", ns, name).CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl delete %s: %v\n%s", name, err, out)
		}
	}
	for _, name := range names {
		waitGoneNamed(t, ns, name, false)
	}
}
