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
// cannot take the write slots of the others: bodies are read before a request
// takes a slot. Each case sends slow bodies from one droplet, one byte then
// nothing, while other droplets create: none of those gets a 429, and each is
// answered before the slow bodies' timeout (it waited for no slot to free).
// The issue's scale is 250 slow bodies against the default 200 mutating
// slots; before, they held every slot until the 60 s request timeout and every
// other droplet's create got 429.
func TestSlowBodiesHoldNoSlot(t *testing.T) {
	for _, tc := range []struct {
		name    string
		slow    int
		timeout time.Duration
		flags   []string
	}{
		// Max-in-flight, not priority and fairness: its one pool of mutating
		// slots is what slow bodies used to fill.
		{"max-in-flight, 25 bodies over 10 slots", 25, 2 * time.Second,
			[]string{"--max-mutating-requests-inflight=10", "--enable-priority-and-fairness=false"}},
		{"max-in-flight, 250 bodies over 200 slots", 250, 5 * time.Second,
			[]string{"--max-mutating-requests-inflight=200", "--enable-priority-and-fairness=false"}},
		// The defaults: priority and fairness (115 seats for node writes), 10 s.
		{"defaults, 250 bodies", 250, DefaultRequestBodyTimeout, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flags := tc.flags
			if tc.timeout != DefaultRequestBodyTimeout {
				flags = append(flags, fmt.Sprintf("--request-body-timeout=%v", tc.timeout))
			}
			slowBodies(t, tc.slow, tc.timeout, flags...)
		})
	}
}

// DefaultRequestBodyTimeout is the server's, as the test sees it.
const DefaultRequestBodyTimeout = apiserver.DefaultRequestBodyTimeout

func slowBodies(t *testing.T, slow int, timeout time.Duration, flags ...string) {
	const fast = 8
	s := apiservertest.Start(t, t.TempDir(), flags...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute+3*timeout)
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
	t.Logf("creates of other droplets while %d bodies trickled: %v", slow, took)
	for i, d := range took {
		if d >= timeout {
			t.Errorf("droplet busy-%d's create took %v, not under the slow bodies' timeout %v: it waited for a slot", i, d, timeout)
		}
	}

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
