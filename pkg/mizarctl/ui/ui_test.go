package ui_test

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	brokerv1alpha1 "mizar.dev/pkg/apis/broker/v1alpha1"
	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/apiserver"
	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/pkg/generated/clientset/versioned"
	"mizar.dev/pkg/mizarctl/ui"
	"mizar.dev/pkg/pki"
)

// chromium finds the headless browser (Debian's chromium, from
// hack/install-deps.sh): without it the page tests skip, or fail under CI.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium not found on PATH: hack/install-deps.sh installs it")
	}
	t.Skip("chromium not found on PATH (hack/install-deps.sh installs it); under CI=true this test fails")
	return ""
}

// browser starts a headless chromium with a profile of the test's; it is
// killed (and the profile removed) when the test ends.
func browser(t *testing.T) context.Context {
	t.Helper()
	exe := chromium(t)
	// The profile and chromium's own temporary files (its singleton socket)
	// go in directories removed after the cleanup below kills chromium.
	profile, tmp := t.TempDir(), t.TempDir()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.Env("TMPDIR="+tmp),
		chromedp.UserDataDir(profile), chromedp.WindowSize(1280, 900))
	actx, stopAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, stopBrowser := chromedp.NewContext(actx)
	t.Cleanup(func() {
		stopBrowser()
		stopAlloc() // waits for chromium to exit
	})
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	return ctx
}

// serve runs mizarctl ui's server on a free loopback port against the
// mizar-apiserver of cfg.
func serve(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	urls := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- ui.Serve(ctx, cfg, "127.0.0.1:0", func(u string) { urls <- u }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ui.Serve: %v", err)
		}
	})
	select {
	case u := <-urls:
		return u
	case err := <-done:
		t.Fatalf("ui.Serve: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("ui.Serve did not start")
	}
	return ""
}

// snapshot reads the page's JSON, once the server has synced.
func snapshot(t *testing.T, url string) ui.Snapshot {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url + "api/snapshot")
		if err != nil {
			t.Fatal(err)
		}
		var snap ui.Snapshot
		if resp.StatusCode == http.StatusOK {
			err = json.NewDecoder(resp.Body).Decode(&snap)
		}
		resp.Body.Close()
		switch {
		case err != nil:
			t.Fatal(err)
		case resp.StatusCode == http.StatusOK:
			return snap
		case resp.StatusCode != http.StatusServiceUnavailable || time.Now().After(deadline):
			t.Fatalf("GET api/snapshot: %s", resp.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func suffix() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// screenshot keeps what the page looked like: in $MIZAR_SCREENSHOTS when
// set (a directory), else in the test's temporary directory.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	dir := os.Getenv("MIZAR_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	p := filepath.Join(dir, t.Name()+"-"+name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s (%d bytes)", p, len(png))
}

// eval runs a JavaScript expression in the page.
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// waitFor polls a JavaScript condition until it holds; it returns how long
// that took.
func waitFor(t *testing.T, ctx context.Context, what, cond string, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](cond))
		if err != nil {
			t.Fatalf("%s: evaluating %s: %v", what, cond, err)
		}
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
			t.Fatalf("%s: not shown within %v; the page reads:\n%s", what, limit, text)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func sel(kind, key string) string {
	return fmt.Sprintf(`document.querySelector('[data-kind=%q][data-key=%q]')`, kind, key)
}

// makeOrder stores a ServiceInstance of the shipped mysql class, its saga
// half way (the operators are off: the test writes its status).
func makeOrder(t *testing.T, ctx context.Context, c versioned.Interface, sfx string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "artifacts", "broker", "mysql-class.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	class := &brokerv1alpha1.ServiceClass{}
	if err := yaml.UnmarshalStrict(data, class); err != nil {
		t.Fatal(err)
	}
	class.Name = "mysql-" + sfx
	api := c.BrokerV1alpha1()
	if _, err := api.ServiceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	in, err := api.ServiceInstances("default").Create(ctx, &brokerv1alpha1.ServiceInstance{ObjectMeta: metav1.ObjectMeta{Name: "db-" + sfx},
		Spec: brokerv1alpha1.ServiceInstanceSpec{Class: class.Name, Plan: "small"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	in.Status.Phase = brokerv1alpha1.PhaseProvisioning
	in.Status.Steps = []brokerv1alpha1.Step{{Name: "CreatingSecret", State: "Done"},
		{Name: "CreatingStatefulSet", State: "Running", Attempts: 1, Message: "waiting for pods"}}
	if _, err := api.ServiceInstances("default").UpdateStatus(ctx, in, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return in.Name
}

func network(t *testing.T, ctx context.Context, c versioned.Interface, sfx, octet string) (vpc, subnet string) {
	t.Helper()
	api := c.NetworkingV1alpha1()
	vpc, subnet = "vpc-"+sfx, "sn-"+sfx
	if _, err := api.Vpcs().Create(ctx, &v1alpha1.Vpc{ObjectMeta: metav1.ObjectMeta{Name: vpc}, Spec: v1alpha1.VpcSpec{CIDR: "10." + octet + ".0.0/16"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Subnets().Create(ctx, &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: subnet}, Spec: v1alpha1.SubnetSpec{VPC: vpc, CIDR: "10." + octet + ".1.0/24"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return vpc, subnet
}

// The page draws the VPC, subnet, endpoint and droplet made before it was
// opened, then follows the API without a reload: a new subnet and endpoint
// appear, an endpoint turning Provisioned changes its phase and the counts,
// deleted objects disappear (one held by a finalizer shows as being deleted
// first).
func TestPageFollowsTheNetwork(t *testing.T) {
	s := apiservertest.Start(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sfx := suffix()
	api := s.Client.NetworkingV1alpha1()
	vpc, subnet := network(t, ctx, s.Client, sfx, "91")
	droplet := "drop-" + sfx
	if _, err := api.Droplets().Create(ctx, &v1alpha1.Droplet{ObjectMeta: metav1.ObjectMeta{Name: droplet},
		Spec: v1alpha1.DropletSpec{Node: droplet, IP: "198.18.40.1", MAC: "02:00:00:40:00:01", Interface: "eth0"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ep1, err := api.Endpoints("default").Create(ctx, &v1alpha1.Endpoint{ObjectMeta: metav1.ObjectMeta{Name: "ep1-" + sfx},
		Spec: v1alpha1.EndpointSpec{Subnet: subnet, Droplet: droplet, MAC: "02:00:00:40:01:01"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ep1.Spec.IP == "" {
		t.Fatal("endpoint got no IP")
	}

	order := makeOrder(t, ctx, s.Client, sfx)

	url := serve(t, s.Config)
	b := browser(t)
	if err := chromedp.Do(b, chromedp.Navigate(url)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, b, "the subnet made before", sel("Subnet", subnet)+` !== null`, 10*time.Second)
	if !eval[bool](t, b, sel("Vpc", vpc)+`.contains(`+sel("Subnet", subnet)+`)`) {
		t.Error("the subnet is not drawn inside its VPC")
	}
	row := eval[string](t, b, sel("Endpoint", "default/ep1-"+sfx)+`?.innerText ?? ""`)
	for _, want := range []string{ep1.Spec.IP, "02:00:00:40:01:01", droplet, "Init"} {
		if !strings.Contains(row, want) {
			t.Errorf("endpoint row %q lacks %q", row, want)
		}
	}
	if !eval[bool](t, b, sel("Subnet", subnet)+`.contains(`+sel("Endpoint", "default/ep1-"+sfx)+`)`) {
		t.Error("the endpoint is not drawn inside its subnet")
	}
	if drow := eval[string](t, b, sel("Droplet", droplet)+`?.innerText ?? ""`); !strings.Contains(drow, "198.18.40.1") || !strings.Contains(drow, "Init") {
		t.Errorf("droplet row %q: want its IP and phase Init", drow)
	}
	if n := eval[string](t, b, `document.querySelector('[data-count=Endpoint]').dataset.notProvisioned`); n != "1" {
		t.Errorf("Endpoints not Provisioned: page says %s, want 1", n)
	}
	if !eval[bool](t, b, `document.getElementById('conn').textContent === 'live'`) {
		t.Error("the page does not say it is live")
	}
	orow := eval[string](t, b, sel("ServiceInstance", "default/"+order)+`?.innerText ?? ""`)
	for _, want := range []string{"Provisioning", "1/2", "CreatingStatefulSet: Running (1 failed runs) - waiting for pods"} {
		if !strings.Contains(orow, want) {
			t.Errorf("order row %q lacks %q", orow, want)
		}
	}
	screenshot(t, b, "before")
	// A mark in the window: gone if the page reloads.
	eval[bool](t, b, `window.__mark = true`)

	// A new subnet with an endpoint, through the API.
	subnet2, ep2 := "sn2-"+sfx, "ep2-"+sfx
	start := time.Now()
	if _, err := api.Subnets().Create(ctx, &v1alpha1.Subnet{ObjectMeta: metav1.ObjectMeta{Name: subnet2, Finalizers: []string{"test.mizar.dev/hold"}}, Spec: v1alpha1.SubnetSpec{VPC: vpc, CIDR: "10.91.2.0/24"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Endpoints("default").Create(ctx, &v1alpha1.Endpoint{ObjectMeta: metav1.ObjectMeta{Name: ep2},
		Spec: v1alpha1.EndpointSpec{Subnet: subnet2, Droplet: droplet, MAC: "02:00:00:40:01:02"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, b, "the new endpoint", sel("Subnet", subnet2)+`?.contains(`+sel("Endpoint", "default/"+ep2)+`) === true`, 3*time.Second)
	t.Logf("a new subnet and endpoint shown %v after the first create", time.Since(start).Round(time.Millisecond))

	// The first endpoint becomes Provisioned.
	ep1.Status.Phase = v1alpha1.PhaseProvisioned
	start = time.Now()
	if _, err := api.Endpoints("default").UpdateStatus(ctx, ep1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, b, "the endpoint's new phase", sel("Endpoint", "default/ep1-"+sfx)+`.innerText.includes('Provisioned')`, 3*time.Second)
	t.Logf("a phase change shown %v after the update", took.Round(time.Millisecond))
	if took > time.Second {
		t.Errorf("a phase change took %v to show, want within a second", took)
	}
	if n := eval[string](t, b, `document.querySelector('[data-count=Endpoint]').dataset.notProvisioned`); n != "1" {
		t.Errorf("Endpoints not Provisioned after one became Provisioned and one was added: page says %s, want 1", n)
	}
	if eval[bool](t, b, sel("Endpoint", "default/ep1-"+sfx)+`.classList.contains('notprov')`) {
		t.Error("a Provisioned endpoint is still highlighted")
	}

	// Deleted: the endpoint goes at once; the subnet, held by a finalizer
	// of the test's, shows as being deleted, then goes when released.
	if err := api.Endpoints("default").Delete(ctx, ep2, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, b, "the deleted endpoint gone", sel("Endpoint", "default/"+ep2)+` === null`, 3*time.Second)
	if err := api.Subnets().Delete(ctx, subnet2, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, b, "the deleted subnet as being deleted", sel("Subnet", subnet2)+`?.innerText.includes('being deleted') === true`, 3*time.Second)
	if n := eval[string](t, b, `document.querySelector('[data-count=Subnet]').dataset.notProvisioned`); n != "2" {
		t.Errorf("Subnets not Provisioned: page says %s, want 2", n)
	}
	if _, err := api.Subnets().Patch(ctx, subnet2, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, b, "the deleted subnet gone", sel("Subnet", subnet2)+` === null`, 3*time.Second)
	if !eval[bool](t, b, `window.__mark === true`) {
		t.Error("the page reloaded; it should follow the stream")
	}
	if u := eval[string](t, b, `document.body.dataset.updates`); u == "" || u == "0" || u == "1" {
		t.Errorf("the page drew %s snapshots, want several", u)
	}
	screenshot(t, b, "after")

	// The JSON snapshot says the same; a request naming another host (DNS
	// rebinding) is refused; the page carries its CSP.
	snap := snapshot(t, url)
	var subnets []string
	for _, v := range snap.VPCs {
		if v.Name == vpc {
			for _, sn := range v.Subnets {
				subnets = append(subnets, fmt.Sprintf("%s:%d", sn.Name, len(sn.Endpoints)))
			}
		}
	}
	if got, want := strings.Join(subnets, ","), subnet+":1"; got != want {
		t.Errorf("snapshot: VPC %s has subnets %s, want %s", vpc, got, want)
	}
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Host = "attacker.example:80"
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Error(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("a foreign Host: %s, want 421", resp.Status)
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if c := resp.Header.Get("Content-Security-Policy"); !strings.Contains(c, "script-src 'sha256-") || !strings.Contains(c, "default-src 'none'") {
		t.Errorf("Content-Security-Policy %q", c)
	}
}

// Text from the API (here a condition message an agent could write) is
// drawn as text: markup in it creates no element and runs no script.
func TestPageEscapesData(t *testing.T) {
	s := apiservertest.Start(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sfx := suffix()
	_, subnet := network(t, ctx, s.Client, sfx, "92")
	const hostile = `<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script><b id=injected>bold</b>`
	api := s.Client.NetworkingV1alpha1()
	sn, err := api.Subnets().Get(ctx, subnet, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sn.Status.Conditions = []metav1.Condition{{Type: "BouncersReady", Status: metav1.ConditionFalse, Reason: "Hostile",
		Message: hostile, LastTransitionTime: metav1.Now()}}
	if _, err := api.Subnets().UpdateStatus(ctx, sn, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	url := serve(t, s.Config)
	b := browser(t)
	if err := chromedp.Do(b, chromedp.Navigate(url)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, b, "the subnet's why", sel("Subnet", subnet)+`?.querySelector('.why') != null`, 10*time.Second)
	screenshot(t, b, "escaped")
	if got := eval[string](t, b, sel("Subnet", subnet)+`.querySelector('.why').textContent`); !strings.Contains(got, hostile) {
		t.Errorf("the message is not shown as text: %q", got)
	}
	if n := eval[int](t, b, `document.querySelectorAll('#app img, #app script, #injected').length`); n != 0 {
		t.Errorf("%d elements injected from the message", n)
	}
	time.Sleep(200 * time.Millisecond) // an onerror would have fired by now
	if eval[bool](t, b, `window.__pwned !== undefined`) {
		t.Error("script from the message ran")
	}
}

// The page shows what its user may read: a droplet's identity reads VPCs and
// subnets but neither every endpoint (an agent lists only its slice) nor the
// broker's orders, and those are named as not readable; a user with no
// rights sees nothing and is told why, in the browser too.
func TestPageShowsOnlyWhatTheUserMayRead(t *testing.T) {
	s := apiservertest.Start(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sfx := suffix()
	vpc, _ := network(t, ctx, s.Client, sfx, "93")
	dir := t.TempDir()

	kc := filepath.Join(dir, "droplet.kubeconfig")
	if err := apiserver.IssueDropletKubeconfig(s.DataDir, "d-"+sfx, kc); err != nil {
		t.Fatal(err)
	}
	droplet, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	snap := snapshot(t, serve(t, droplet))
	if len(snap.VPCs) != 1 || snap.VPCs[0].Name != vpc || len(snap.VPCs[0].Subnets) != 1 {
		t.Errorf("a droplet sees VPCs %+v, want %s with its subnet", snap.VPCs, vpc)
	}
	if snap.Orders != nil || strings.Join(snap.Unreadable, ",") != "Endpoint,ServiceInstance" {
		t.Errorf("a droplet: orders %#v, unreadable %v; want no orders, Endpoint and ServiceInstance unreadable", snap.Orders, snap.Unreadable)
	}

	// A user the server knows (a certificate of its CA) with no rights.
	ca, err := pki.LoadOrCreateCA(filepath.Join(s.DataDir, "pki", "ca.crt"), filepath.Join(s.DataDir, "pki", "ca.key"), "mizar-apiserver-ca")
	if err != nil {
		t.Fatal(err)
	}
	nobody := rest.AnonymousClientConfig(s.Config)
	nobody.CertFile, nobody.KeyFile = filepath.Join(dir, "nobody.crt"), filepath.Join(dir, "nobody.key")
	if err := ca.EnsureCert(nobody.CertFile, nobody.KeyFile, x509.Certificate{Subject: pkix.Name{CommonName: "nobody-" + sfx},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatal(err)
	}
	url := serve(t, nobody)
	snap = snapshot(t, url)
	all := "Vpc,Subnet,Endpoint,Droplet,Divider,Bouncer,ServiceInstance"
	if len(snap.VPCs) != 0 || len(snap.Droplets) != 0 || snap.Orders != nil || strings.Join(snap.Unreadable, ",") != all {
		t.Errorf("a user without rights sees %+v, want nothing and %s unreadable", snap, all)
	}
	b := browser(t)
	if err := chromedp.Do(b, chromedp.Navigate(url)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, b, "the unreadable kinds", `document.querySelector('.note')?.textContent === 'Not readable with these credentials: `+strings.ReplaceAll(all, ",", ", ")+`'`, 10*time.Second)
	if n := eval[int](t, b, `document.querySelectorAll('[data-kind]').length`); n != 0 {
		t.Errorf("a user without rights sees %d objects", n)
	}
	screenshot(t, b, "nobody")
}
