package e2ecluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"

	brokerv1 "mizar.dev/pkg/apis/broker/v1alpha1"
	"mizar.dev/pkg/broker/fulfillment"
	"mizar.dev/pkg/broker/osb"
	"mizar.dev/pkg/generated/clientset/versioned"
)

// The broker in the real cluster (hack/kind/mariadb-image.sh builds the
// database image; the chart serves the OSB API with broker.osb.enabled).
const (
	mariadbImage  = "mizar.dev/mariadb:10.11"
	osbNamespace  = "mizar-broker" // the chart's broker.osb.namespace
	osbSecret     = "mizar-osb"    // <fullname>-osb: "username:password"
	servingSecret = "mizar-serving"
	servingName   = "mizar-apiserver.mizar-system.svc" // the serving certificate's name
	osbPort       = 8444
	brokerTimeout = 10 * time.Minute
)

// osbPlatform is an OSB platform talking to the served API over TLS,
// verified against the chart's CA.
type osbPlatform struct {
	url        string
	http       *http.Client
	user, pass string
}

type osbReply struct {
	code int
	body map[string]any
	raw  string
}

func (p *osbPlatform) do(ctx context.Context, method, path string, body any) (osbReply, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return osbReply{}, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, p.url+path, rd)
	if err != nil {
		return osbReply{}, err
	}
	req.SetBasicAuth(p.user, p.pass)
	req.Header.Set("X-Broker-API-Version", "2.17")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := p.http.Do(req)
	if err != nil {
		return osbReply{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := osbReply{code: resp.StatusCode, body: map[string]any{}, raw: string(b)}
	_ = json.Unmarshal(b, &r.body)
	return r, nil
}

// expect fails the test unless the request answers code.
func (p *osbPlatform) expect(ctx context.Context, t *testing.T, what string, code int, method, path string, body any) osbReply {
	t.Helper()
	r, err := p.do(ctx, method, path, body)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if r.code != code {
		t.Fatalf("%s: %s %s answered %d %s, want %d", what, method, path, r.code, strings.TrimSpace(r.raw), code)
	}
	return r
}

// newGUID is a random version 4 GUID; its first character is a digit, as
// 10 GUIDs in 16 are (the ones whose Service names once failed).
func newGUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	s := fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
	return strconv.Itoa(int(b[0])%10) + s[1:]
}

// enableBroker turns the broker on in the installed release (helm upgrade
// --reuse-values: the fulfillment operator and the OSB API) and returns a
// platform for its OSB API. It stays on for the steps after this one.
func (e *env) enableBroker(ctx context.Context, t *testing.T) *osbPlatform {
	chart := filepath.Join(e.root, "artifacts/charts/mizar")
	if _, err := e.run(ctx, e.helm, "upgrade", "mizar", chart, "-n", "mizar-system", "--reuse-values",
		"--set", "broker.enabled=true", "--set", "broker.fulfillment=true", "--set", "broker.osb.enabled=true",
		"--set", "broker.osb.namespace="+osbNamespace, "--set", "broker.osb.port="+strconv.Itoa(osbPort),
		"--wait", "--timeout", "180s"); err != nil {
		t.Fatalf("helm upgrade turning the broker on: %v", err)
	}
	if _, err := e.kubectlRun(ctx, "wait", "--for=condition=Available", "apiservice/v1alpha1.broker.mizar.dev", "--timeout=120s"); err != nil {
		t.Fatalf("the broker API group is not served: %v", err)
	}
	creds, err := e.cs.CoreV1().Secrets("mizar-system").Get(ctx, osbSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	user, pass, _ := strings.Cut(string(creds.Data["credentials"]), ":")
	serving, err := e.cs.CoreV1().Secrets("mizar-system").Get(ctx, servingSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(serving.Data["ca.crt"]) {
		t.Fatalf("secret %s holds no CA", servingSecret)
	}
	// The apiserver runs on the host network: its pod address is a node's.
	pods, err := e.cs.CoreV1().Pods("mizar-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=mizar-apiserver"})
	if err != nil || len(pods.Items) == 0 {
		out, _ := e.kubectlRun(ctx, "get", "pods", "-n", "mizar-system", "--show-labels")
		t.Fatalf("no apiserver pod (%v):\n%s", err, out)
	}
	var ip string
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && podCondition(&p, corev1.PodReady) != nil && podCondition(&p, corev1.PodReady).Status == corev1.ConditionTrue {
			ip = p.Status.PodIP
		}
	}
	if ip == "" {
		t.Fatalf("no Ready apiserver pod")
	}
	return &osbPlatform{
		url:  "https://" + net.JoinHostPort(ip, strconv.Itoa(osbPort)),
		user: user, pass: pass,
		http: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: servingName, MinVersion: tls.VersionTLS12},
		}},
	}
}

// loadMariaDB builds the database image (cached) and loads it into the nodes.
func (e *env) loadMariaDB(t *testing.T) {
	tarball, err := output(exec.Command(filepath.Join(e.root, "hack/kind/mariadb-image.sh")))
	if err != nil {
		t.Fatalf("building the MariaDB image: %v", err)
	}
	load := exec.Command(e.kind, "load", "image-archive", "--name", "mizar", tarball)
	load.Env = e.podmanEnv()
	if out, err := load.CombinedOutput(); err != nil {
		t.Fatalf("kind load image-archive %s: %v\n%s", tarball, err, out)
	}
}

// checkBroker walks the broker as an OSB platform and an application would:
// provision a MariaDB under a random GUID, bind, connect with the binding's
// credentials from a pod on another node, write and read a row, change the
// plan (the pod is replaced; the row survives on its volume), read it again,
// unbind, deprovision, and find nothing of the instance left.
func (w *workload) checkBroker(ctx context.Context, t *testing.T) {
	e := w.e
	e.loadMariaDB(t)
	p := e.enableBroker(ctx, t)
	cfg, err := clientcmd.BuildConfigFromFlags("", e.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	mizar, err := versioned.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	// A class of the test's own: MariaDB with resources a kind node has, two
	// plans of the same storage (so the plan can change).
	suffix := utilrand.String(6)
	serviceID, smallID, largerID := newGUID(), newGUID(), newGUID()
	class := &brokerv1.ServiceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "mariadb-" + suffix},
		Spec: brokerv1.ServiceClassSpec{
			ID: serviceID, Description: "MariaDB from Debian's mariadb-server (e2e)", Bindable: true, Image: mariadbImage,
			Plans: []brokerv1.ServicePlan{
				{Name: "small", ID: smallID, Description: "one replica, 100m CPU, 384 MiB", Replicas: 1,
					CPU: resource.MustParse("100m"), Memory: resource.MustParse("384Mi"), Storage: resource.MustParse("1Gi"),
					MaxProvisioningDuration: &metav1.Duration{Duration: brokerTimeout}},
				{Name: "larger", ID: largerID, Description: "one replica, 200m CPU, 512 MiB", Replicas: 1,
					CPU: resource.MustParse("200m"), Memory: resource.MustParse("512Mi"), Storage: resource.MustParse("1Gi"),
					MaxProvisioningDuration: &metav1.Duration{Duration: brokerTimeout}},
			},
		},
	}
	// Right after the upgrade the aggregator may still proxy to the
	// replaced apiserver pod, though the APIService reads Available: 503
	// until its endpoints catch up.
	if err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := mizar.BrokerV1alpha1().ServiceClasses().Create(ctx, class, metav1.CreateOptions{})
		if apierrors.IsServiceUnavailable(err) {
			t.Logf("creating the ServiceClass: %v (retrying)", err)
			return false, nil
		}
		return true, err
	}); err != nil {
		t.Fatalf("creating the ServiceClass: %v", err)
	}
	id, bindingID := newGUID(), newGUID()
	instancePath := "/v2/service_instances/" + id
	t.Logf("instance %s, binding %s, class %s", id, bindingID, class.Name)
	var pvName, pvNode, pvDir string
	t.Cleanup(func() {
		// Whatever the test left on failure; the class last (orders use it).
		ctx := context.Background()
		_ = e.cs.CoreV1().Pods(w.ns).Delete(ctx, "mysql-client", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
		_ = mizar.BrokerV1alpha1().ServiceBindings(osbNamespace).Delete(ctx, osb.ObjectName(bindingID), metav1.DeleteOptions{})
		_ = mizar.BrokerV1alpha1().ServiceInstances(osbNamespace).Delete(ctx, osb.ObjectName(id), metav1.DeleteOptions{})
		_ = wait.PollUntilContextTimeout(ctx, 2*time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := mizar.BrokerV1alpha1().ServiceInstances(osbNamespace).Get(ctx, osb.ObjectName(id), metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		if pvName != "" {
			_ = e.cs.CoreV1().PersistentVolumes().Delete(ctx, pvName, metav1.DeleteOptions{})
			_, _ = e.node(ctx, pvNode, "rm", "-rf", pvDir)
		}
		_ = mizar.BrokerV1alpha1().ServiceClasses().Delete(ctx, class.Name, metav1.DeleteOptions{})
	})

	// The catalog offers the class (it follows the classes' watch).
	var cat osbReply
	err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		cat, err = p.do(ctx, "GET", "/v2/catalog", nil)
		return err == nil && cat.code == 200 && strings.Contains(cat.raw, serviceID) && strings.Contains(cat.raw, largerID), nil
	})
	if err != nil {
		t.Fatalf("the catalog never offered service %s: %v %d %s", serviceID, err, cat.code, cat.raw)
	}

	// Provision: 202 with an operation at once.
	start := time.Now()
	prov := p.expect(ctx, t, "provision", 202, "PUT", instancePath+"?accepts_incomplete=true", map[string]any{
		"service_id": serviceID, "plan_id": smallID, "organization_guid": newGUID(), "space_guid": newGUID(),
		"context": map[string]any{"platform": "kubernetes", "namespace": w.ns},
	})
	if op, _ := prov.body["operation"].(string); op == "" {
		t.Errorf("provision answered no operation: %s", prov.raw)
	}
	t.Logf("provision answered 202 in %s", time.Since(start).Round(time.Millisecond))

	// The volume: a PersistentVolume made for the order's claim, pinned to
	// one node (a cluster without a provisioner; one with a default
	// StorageClass provisions it itself).
	var order *brokerv1.ServiceInstance
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		order, err = mizar.BrokerV1alpha1().ServiceInstances(osbNamespace).Get(ctx, osb.ObjectName(id), metav1.GetOptions{})
		return err == nil && order.Status.WorkloadName != "", nil
	})
	if err != nil {
		t.Fatalf("the order never named its workload: %v %+v", err, order)
	}
	wname := order.Status.WorkloadName
	claim := "data-" + wname + "-0"
	var pvc *corev1.PersistentVolumeClaim
	err = wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pvc, err = e.cs.CoreV1().PersistentVolumeClaims(osbNamespace).Get(ctx, claim, metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("the StatefulSet's claim %s never appeared: %s", claim, e.describeOrder(ctx, mizar, id))
	}
	storageClass := ""
	if pvc.Spec.StorageClassName != nil {
		storageClass = *pvc.Spec.StorageClassName
	}
	if storageClass == "" {
		nodes, err := e.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil || len(nodes.Items) < 2 {
			t.Fatalf("want 2 nodes or more: %v", err)
		}
		// The last node (a worker): the client goes to another one.
		pvNode = nodes.Items[len(nodes.Items)-1].Name
		pvName, pvDir = "e2e-broker-"+suffix, "/var/lib/mizar-e2e-broker/"+suffix
		hostPathType := corev1.HostPathDirectoryOrCreate
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: pvName},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: pvDir, Type: &hostPathType}},
				ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: osbNamespace, Name: claim},
				NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{pvNode}}},
				}}}},
			},
		}
		if _, err := e.cs.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Logf("no StorageClass: PersistentVolume %s on node %s for claim %s", pvName, pvNode, claim)
	} else {
		t.Logf("claim %s provisioned by StorageClass %s", claim, storageClass)
	}

	// last_operation until succeeded: the order is Provisioned only once
	// MariaDB answers its readiness probe (a query as root).
	lastOp := func(what string) {
		t.Helper()
		var r osbReply
		// Faster than the Retry-After a platform would honour: the time to
		// Provisioned is measured here.
		err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, brokerTimeout, true, func(ctx context.Context) (bool, error) {
			r, err = p.do(ctx, "GET", instancePath+"/last_operation", nil)
			if err != nil {
				return false, nil
			}
			if r.code != 200 || r.body["state"] == "failed" {
				return false, fmt.Errorf("last_operation: %d %s", r.code, r.raw)
			}
			return r.body["state"] == "succeeded", nil
		})
		if err != nil {
			t.Fatalf("%s: %v (last answer %s)\n%s", what, err, r.raw, e.describeOrder(ctx, mizar, id))
		}
	}
	lastOp("provisioning")
	t.Logf("provisioned (last_operation succeeded) %s after the request", time.Since(start).Round(time.Second))
	provisioned := time.Since(start)
	server := e.mariadbPod(ctx, t, wname)
	t.Logf("MariaDB pod %s on node %s at %s", server.Name, server.Spec.NodeName, server.Status.PodIP)
	// What mizar adds: the order's time to Provisioned against the
	// StatefulSet's own time from creation to a Ready pod (API timestamps,
	// whole seconds; the platform's polling interval is in the first).
	if sts, err := e.cs.AppsV1().StatefulSets(osbNamespace).Get(ctx, wname, metav1.GetOptions{}); err == nil {
		if c := podCondition(server, corev1.PodReady); c != nil {
			own := c.LastTransitionTime.Sub(sts.CreationTimestamp.Time)
			t.Logf("order to connectable (last_operation succeeded): %s; StatefulSet created to pod Ready: %s; mizar adds %s",
				provisioned.Round(100*time.Millisecond), own, (provisioned - own).Round(100*time.Millisecond))
		}
	}

	// Bind: 201 with credentials.
	bindPath := instancePath + "/service_bindings/" + bindingID
	bind := p.expect(ctx, t, "bind", 201, "PUT", bindPath, map[string]any{"service_id": serviceID, "plan_id": smallID})
	creds, _ := bind.body["credentials"].(map[string]any)
	str := func(k string) string { s, _ := creds[k].(string); return s }
	host, port, user, pass, db := str("host"), str("port"), str("username"), str("password"), str("database")
	if host == "" || port == "" || user == "" || pass == "" || db == "" || !strings.HasPrefix(str("uri"), "mysql://") {
		t.Fatalf("bind credentials %v", creds)
	}

	// A client pod on another node than the database, with the image's own
	// mariadb client.
	client := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "mysql-client"},
		Spec: corev1.PodSpec{
			Tolerations:                   []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}},
			TerminationGracePeriodSeconds: ptr(int64(0)),
			Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
					{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpNotIn, Values: []string{server.Spec.NodeName}},
				}}},
			}}},
			Containers: []corev1.Container{{
				Name: "client", Image: mariadbImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sleep", "infinity"},
			}},
		},
	}
	// The test namespace exists unless this step runs alone (-run
	// TestCluster/BrokerMariaDBThroughOSB); TestCluster's cleanup deletes it.
	if _, err := e.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := e.cs.CoreV1().Pods(w.ns).Create(ctx, client, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		client, err = e.cs.CoreV1().Pods(w.ns).Get(ctx, "mysql-client", metav1.GetOptions{})
		return err == nil && client.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		t.Fatalf("the client pod is not Running: %v %+v", err, client.Status)
	}
	t.Logf("client pod on node %s at %s", client.Spec.NodeName, client.Status.PodIP)
	sql := func(what, query string) string {
		t.Helper()
		var out string
		// The name resolves once CoreDNS has the headless Service's endpoints.
		err := wait.PollUntilContextTimeout(ctx, 2*time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
			out, err = e.exec(ctx, w.ns, "mysql-client", "mariadb", "--connect-timeout=5", "-h", host, "-P", port,
				"-u", user, "--password="+pass, "-N", "-B", db, "-e", query)
			return err == nil, nil
		})
		if err != nil {
			t.Fatalf("%s from %s: %v", what, client.Spec.NodeName, out)
		}
		return strings.TrimSpace(out)
	}
	value := "row-" + utilrand.String(12)
	sql("create a table", "CREATE TABLE e2e (id INT PRIMARY KEY, v VARCHAR(64)); INSERT INTO e2e VALUES (1, '"+value+"')")
	if got := sql("read the row", "SELECT v FROM e2e WHERE id = 1"); got != value {
		t.Fatalf("read %q, want %q", got, value)
	}

	// Update the plan: the StatefulSet rolls its pod; the row survives.
	upd := p.expect(ctx, t, "update", 202, "PATCH", instancePath+"?accepts_incomplete=true", map[string]any{
		"service_id": serviceID, "plan_id": largerID, "previous_values": map[string]any{"plan_id": smallID, "service_id": serviceID},
	})
	if op, _ := upd.body["operation"].(string); !strings.HasPrefix(op, "update-") {
		t.Errorf("update operation %q", op)
	}
	lastOp("updating the plan")
	after := e.mariadbPod(ctx, t, wname)
	if after.UID == server.UID {
		t.Errorf("pod %s was not replaced by the plan change", after.Name)
	}
	if mem := after.Spec.Containers[0].Resources.Limits.Memory(); mem.Cmp(resource.MustParse("512Mi")) != 0 {
		t.Errorf("after the update the pod's memory limit is %s, want 512Mi", mem)
	}
	if got := sql("read the row after the update", "SELECT v FROM e2e WHERE id = 1"); got != value {
		t.Fatalf("after the plan change read %q, want %q", got, value)
	}

	// Unbind, deprovision: 410 once it is gone.
	p.expect(ctx, t, "unbind", 200, "DELETE", bindPath+"?service_id="+serviceID+"&plan_id="+largerID, nil)
	dep := p.expect(ctx, t, "deprovision", 202, "DELETE", instancePath+"?accepts_incomplete=true&service_id="+serviceID+"&plan_id="+largerID, nil)
	op, _ := dep.body["operation"].(string)
	var r osbReply
	err = wait.PollUntilContextTimeout(ctx, 2*time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		r, err = p.do(ctx, "GET", instancePath+"/last_operation?operation="+op, nil)
		return err == nil && (r.code == 410 || r.body["state"] == "succeeded"), nil
	})
	if err != nil {
		t.Fatalf("deprovision never finished: %s\n%s", r.raw, e.describeOrder(ctx, mizar, id))
	}
	p.expect(ctx, t, "deprovision again", 410, "DELETE", instancePath+"?accepts_incomplete=true&service_id="+serviceID+"&plan_id="+largerID, nil)

	// Nothing of the instance is left: no Secret, Service, StatefulSet, PVC,
	// pod, order or binding.
	sel := metav1.ListOptions{LabelSelector: fulfillment.LabelInstanceUID + "=" + string(order.UID)}
	var left []string
	err = wait.PollUntilContextTimeout(ctx, 2*time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		left = nil
		if l, err := e.cs.CoreV1().Secrets(osbNamespace).List(ctx, sel); err == nil {
			for _, o := range l.Items {
				left = append(left, "Secret/"+o.Name)
			}
		}
		if l, err := e.cs.CoreV1().Services(osbNamespace).List(ctx, sel); err == nil {
			for _, o := range l.Items {
				left = append(left, "Service/"+o.Name)
			}
		}
		if l, err := e.cs.AppsV1().StatefulSets(osbNamespace).List(ctx, sel); err == nil {
			for _, o := range l.Items {
				left = append(left, "StatefulSet/"+o.Name)
			}
		}
		if l, err := e.cs.CoreV1().PersistentVolumeClaims(osbNamespace).List(ctx, sel); err == nil {
			for _, o := range l.Items {
				left = append(left, "PersistentVolumeClaim/"+o.Name)
			}
		}
		if l, err := e.cs.CoreV1().Pods(osbNamespace).List(ctx, sel); err == nil {
			for _, o := range l.Items {
				left = append(left, "Pod/"+o.Name)
			}
		}
		if _, err := mizar.BrokerV1alpha1().ServiceInstances(osbNamespace).Get(ctx, osb.ObjectName(id), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			left = append(left, "ServiceInstance/"+osb.ObjectName(id))
		}
		if _, err := mizar.BrokerV1alpha1().ServiceBindings(osbNamespace).Get(ctx, osb.ObjectName(bindingID), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			left = append(left, "ServiceBinding/"+osb.ObjectName(bindingID))
		}
		return len(left) == 0, nil
	})
	if err != nil {
		t.Errorf("left after deprovision: %s", strings.Join(left, ", "))
	}
	t.Logf("provision, bind, connect from node %s to node %s, update, unbind, deprovision: %s in all", client.Spec.NodeName, server.Spec.NodeName, time.Since(start).Round(time.Second))
}

// mariadbPod is the StatefulSet's pod once it is Ready.
func (e *env) mariadbPod(ctx context.Context, t *testing.T, workload string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := e.cs.CoreV1().Pods(osbNamespace).Get(ctx, workload+"-0", metav1.GetOptions{})
		if err != nil || p.DeletionTimestamp != nil {
			return false, nil
		}
		pod = p
		c := podCondition(p, corev1.PodReady)
		return c != nil && c.Status == corev1.ConditionTrue, nil
	})
	if err != nil {
		out, _ := e.kubectlRun(ctx, "logs", "-n", osbNamespace, workload+"-0", "--tail=30")
		t.Fatalf("pod %s-0 is not Ready: %+v\n%s", workload, pod, out)
	}
	return pod
}

// describeOrder is what a person would look at when an order is stuck: the
// order, its workload's pods and claims, and their events.
func (e *env) describeOrder(ctx context.Context, mizar versioned.Interface, id string) string {
	var b strings.Builder
	if in, err := mizar.BrokerV1alpha1().ServiceInstances(osbNamespace).Get(ctx, osb.ObjectName(id), metav1.GetOptions{}); err == nil {
		st, _ := json.Marshal(in.Status)
		fmt.Fprintf(&b, "order status: %s\n", st)
	}
	for _, args := range [][]string{
		{"get", "statefulsets,pods,pvc,services,secrets", "-n", osbNamespace, "-o", "wide"},
		{"get", "events", "-n", osbNamespace, "--sort-by=.lastTimestamp"},
	} {
		out, _ := e.kubectlRun(ctx, args...)
		b.WriteString(lastLines(out, 25) + "\n")
	}
	return b.String()
}
