package apiserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	v1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/apiserver"
	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/pkg/generated/clientset/versioned"
)

// TestSlowBodiesHoldNoSlot: one droplet identity trickling request bodies
// cannot take the write slots of the others. Scaled down from the issue's 250
// bodies against 200 slots to 25 against 10 (--max-mutating-requests-inflight),
// with a 2 s body timeout instead of 10 s: before, the slow bodies held every
// slot until the request timeout and every other droplet's create got 429.
func TestSlowBodiesHoldNoSlot(t *testing.T) {
	const slots, slow, fast = 10, 25, 8
	// Max-in-flight, not priority and fairness: its one pool of mutating slots
	// is what slow bodies used to fill (priority and fairness queues each
	// droplet apart, TestPriorityAndFairness).
	s := apiservertest.Start(t, t.TempDir(), fmt.Sprintf("--max-mutating-requests-inflight=%d", slots), "--request-body-timeout=2s",
		"--enable-priority-and-fairness=false")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	slowCfg := dropletConfig(t, s.DataDir, "slowpoke")
	transport, err := rest.TransportFor(slowCfg)
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(droplet("slowpoke", "192.168.80.1"))
	if err != nil {
		t.Fatal(err)
	}
	url := slowCfg.Host + "/apis/networking.mizar.dev/v1alpha1/droplets"
	var writers []*io.PipeWriter
	defer func() {
		for _, w := range writers {
			_ = w.Close()
		}
	}()
	type answer struct {
		code int
		took time.Duration
		err  error
	}
	answers := make(chan answer, slow)
	for range slow {
		r, w := io.Pipe()
		writers = append(writers, w)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, r)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = int64(len(body))
		req.Header.Set("Content-Type", "application/json")
		go func() {
			start := time.Now()
			resp, err := transport.RoundTrip(req)
			if err != nil {
				answers <- answer{err: err, took: time.Since(start)}
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			answers <- answer{code: resp.StatusCode, took: time.Since(start)}
		}()
		go func() { _, _ = w.Write(body[:1]) }() // one byte, then nothing
	}
	time.Sleep(500 * time.Millisecond) // the slow requests are all in

	// Other droplets write meanwhile: none may be turned away.
	var wg sync.WaitGroup
	errs := make([]error, fast)
	took := make([]time.Duration, fast)
	for i := range fast {
		name := fmt.Sprintf("busy-%d", i)
		c, err := versioned.NewForConfig(dropletConfig(t, s.DataDir, name))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			start := time.Now()
			_, errs[i] = c.NetworkingV1alpha1().Droplets().Create(ctx, droplet(name, fmt.Sprintf("192.168.81.%d", i+1)), metav1.CreateOptions{})
			took[i] = time.Since(start)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if apierrors.IsTooManyRequests(err) {
			t.Errorf("droplet busy-%d was turned away while another droplet trickled bodies: %v", i, err)
		} else if err != nil {
			t.Errorf("droplet busy-%d: %v", i, err)
		}
	}
	t.Logf("creates of other droplets while %d bodies trickled into %d slots: %v", slow, slots, took)

	// The slow requests end with 408 once their body is overdue.
	for range slow {
		select {
		case a := <-answers:
			if a.err != nil || a.code != http.StatusRequestTimeout {
				t.Errorf("slow body: got %d (%v) after %v, want 408", a.code, a.err, a.took)
			}
		case <-ctx.Done():
			t.Fatal("slow bodies were never answered")
		}
	}
}

func droplet(name, ip string) *v1.Droplet {
	return &v1.Droplet{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1.SchemeGroupVersion.String(), Kind: "Droplet"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1.DropletSpec{Node: name, IP: ip, MAC: "02:00:00:00:20:01", Interface: "eth0"},
	}
}

// dropletConfig is a client configuration authenticating as droplet name.
func dropletConfig(t *testing.T, dataDir, name string) *rest.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := apiserver.IssueDropletKubeconfig(dataDir, name, path); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 1e6, 1e6
	return cfg
}
