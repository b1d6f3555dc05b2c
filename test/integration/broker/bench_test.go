package broker

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	v1 "mizar.dev/pkg/apis/broker/v1alpha1"
	"mizar.dev/pkg/apiserver/apiservertest"
	"mizar.dev/pkg/broker/fulfillment"
)

// BenchmarkProvision measures, in one run on the in-process server:
//
//   - the OSB provision answer (202 with the operation: the order is stored)
//     under 50 concurrent platforms, beside a plain create of the same
//     ServiceInstance through the Kubernetes API path;
//
//   - how long an order takes to become a StatefulSet in the workload cluster.
//
//     go test ./test/integration/broker -run '^$' -bench Provision -benchtime 1x
func BenchmarkProvision(b *testing.B) {
	const concurrent, perWorker = 50, 10
	// servedRounds is how many turns the served OSB API and the plain create
	// on its server take each (perWorker/servedRounds requests per worker).
	const servedRounds = 5
	ctx := context.Background()
	c := createClassWithIDs(b)
	kube, _ := workload()
	ns := "bench-" + utilrand.String(6)
	srv := httptest.NewTLSServer(startBroker(b, kube, ns).Handler(creds, slog.New(slog.NewTextHandler(io.Discard, nil))))
	defer srv.Close()
	// A platform keeps its connections: one per concurrent request, not a TLS
	// handshake per provision.
	hc := srv.Client()
	hc.Transport.(*http.Transport).MaxIdleConnsPerHost = concurrent
	f := &osbFixture{t: b, url: srv.URL, http: hc, ns: ns, serviceID: c.Spec.ID, smallID: c.Spec.Plans[0].ID}

	// cpuTime is this process's CPU time so far: the server, its etcd, the
	// facade and the clients all run in it, so its growth per request is what
	// a request costs, steadier than latency on a busy machine.
	cpuTime := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	var lastCPU time.Duration // CPU time per request of the last run
	// runN has each of the concurrent workers do per requests; op gets the
	// request's number, first + 0 .. concurrent*per-1.
	runN := func(name string, first, per int, op func(i int) error) []time.Duration {
		var (
			mu  sync.Mutex
			lat []time.Duration
			wg  sync.WaitGroup
		)
		cpu0 := cpuTime()
		defer func() { lastCPU = (cpuTime() - cpu0) / time.Duration(concurrent*per) }()
		for w := 0; w < concurrent; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for j := 0; j < per; j++ {
					start := time.Now()
					if err := op(first + w*per + j); err != nil {
						b.Errorf("%s: %v", name, err)
						return
					}
					d := time.Since(start)
					mu.Lock()
					lat = append(lat, d)
					mu.Unlock()
				}
			}(w)
		}
		wg.Wait()
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		return lat
	}
	run := func(name string, op func(i int) error) []time.Duration { return runN(name, 0, perWorker, op) }
	pct := func(l []time.Duration, p float64) time.Duration { return l[int(float64(len(l)-1)*p)] }
	// warm opens each platform's connection (TLS handshake included) before
	// the timed run, as a platform that keeps its connections has them: the
	// plain-create path's client is warm too. Without it the 50 handshakes
	// are 10% of the 500 timed requests and are the p99.
	warm := func(g *osbFixture) {
		run("warm-up", func(int) error {
			if r := g.do("GET", "/v2/catalog", nil, nil); r.code != 200 {
				return fmt.Errorf("catalog: HTTP %d %v", r.code, r.body)
			}
			return nil
		})
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

	// Order -> StatefulSet, first and on its own: one order at a time, timed
	// from its create to the StatefulSet's ADDED event in the workload cluster.
	w, err := kube.AppsV1().StatefulSets(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	stop := startOperator(b, kube)
	const orders = 20
	var toSts []time.Duration
	for i := 0; i < orders; i++ {
		name := fmt.Sprintf("s%s-%d", utilrand.String(5), i)
		t0 := time.Now()
		if _, err := shared.Client.BrokerV1alpha1().ServiceInstances(ns).Create(ctx, order(ns, name, c.Name, "small", ""), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		for seen := false; !seen; {
			select {
			case ev := <-w.ResultChan():
				// The StatefulSet is named from the order's uid; its label names the order.
				seen = ev.Type == watch.Added && ev.Object.(metav1.Object).GetLabels()[fulfillment.LabelInstance] == name
			case <-time.After(time.Minute):
				b.Fatalf("order %s never became a StatefulSet", name)
			}
		}
		toSts = append(toSts, time.Since(t0))
	}
	sort.Slice(toSts, func(i, j int) bool { return toSts[i] < toSts[j] })
	stop()

	// The answers, with the operator stopped so both paths see the same server.
	for i := 0; i < b.N; i++ {
		prefix := utilrand.String(5)
		plain := run("kube create", func(i int) error {
			_, err := shared.Client.BrokerV1alpha1().ServiceInstances(ns).Create(ctx, order(ns, fmt.Sprintf("k%s-%d", prefix, i), c.Name, "small", ""), metav1.CreateOptions{})
			return err
		})
		plainCPU := lastCPU
		warm(f)
		viaOSB := run("osb provision", func(i int) error {
			r := f.do("PUT", fmt.Sprintf("/v2/service_instances/o%s-%d?accepts_incomplete=true", prefix, i), f.provisionBody(f.smallID, nil), nil)
			if r.code != 202 {
				return fmt.Errorf("HTTP %d %v", r.code, r.body)
			}
			return nil
		})
		b.ReportMetric(ms(lastCPU), "osb-cpu-ms/op")
		b.ReportMetric(ms(plainCPU), "kube-cpu-ms/op")
		b.ReportMetric(ms(pct(viaOSB, 0.5)), "osb-p50-ms")
		b.ReportMetric(ms(pct(viaOSB, 0.99)), "osb-p99-ms")
		b.ReportMetric(ms(pct(plain, 0.5)), "kube-p50-ms")
		b.ReportMetric(ms(pct(plain, 0.99)), "kube-p99-ms")
		b.ReportMetric(float64(pct(viaOSB, 0.99))/float64(pct(plain, 0.99)), "osb/kube-p99")
		b.ReportMetric(ms(pct(toSts, 0.5)), "order-to-sts-p50-ms")

		// The OSB API as the binary serves it: its own TLS listener and the
		// server's loopback client, once with the loopback's old rate limit
		// (50 QPS, burst 100) and once with the broker's own.
		for _, v := range []struct {
			name  string
			flags []string
		}{{"old-limit", []string{"--broker-client-qps", "50", "--broker-client-burst", "100"}}, {"served", nil}} {
			url, client, server := servedOSB(b, c, v.flags...)
			g := &osbFixture{t: b, url: url, http: client, serviceID: c.Spec.ID, smallID: c.Spec.Plans[0].ID}
			warm(g)
			provision := func(i int) error {
				r := g.do("PUT", fmt.Sprintf("/v2/service_instances/%s%s-%d?accepts_incomplete=true", v.name[:1], prefix, i), g.provisionBody(g.smallID, nil), nil)
				if r.code != 202 {
					return fmt.Errorf("HTTP %d %v", r.code, r.body)
				}
				return nil
			}
			if v.name != "served" {
				lat := run(v.name+" osb provision", provision)
				b.ReportMetric(ms(lastCPU), v.name+"-osb-cpu-ms/op")
				b.ReportMetric(ms(pct(lat, 0.5)), v.name+"-osb-p50-ms")
				b.ReportMetric(ms(pct(lat, 0.99)), v.name+"-osb-p99-ms")
				b.ReportMetric(float64(pct(lat, 0.99))/float64(pct(plain, 0.99)), v.name+"-osb/kube-p99")
			} else {
				// The served OSB API against the plain create on the same server
				// (a fresh server with a small etcd answers faster than the
				// shared one): the baseline it is held to. They take turns, so
				// the machine's drift and the server's growing store fall on
				// both alike.
				ns := "mizar-broker"
				create := func(i int) error {
					_, err := server.Client.BrokerV1alpha1().ServiceInstances(ns).Create(ctx, order(ns, fmt.Sprintf("k%s-%d", prefix, i), c.Name, "small", ""), metav1.CreateOptions{})
					return err
				}
				var lat, same []time.Duration
				var osbCPU, sameCPU time.Duration
				for r := 0; r < servedRounds; r++ {
					per, first := perWorker/servedRounds, r*concurrent*perWorker/servedRounds
					turns := []func(){
						func() { lat = append(lat, runN("served osb provision", first, per, provision)...); osbCPU += lastCPU },
						func() { same = append(same, runN("served kube create", first, per, create)...); sameCPU += lastCPU },
					}
					if r%2 == 1 {
						turns[0], turns[1] = turns[1], turns[0]
					}
					for _, t := range turns {
						t()
					}
				}
				slices.Sort(lat)
				slices.Sort(same)
				b.ReportMetric(ms(osbCPU/servedRounds), "served-osb-cpu-ms/op")
				b.ReportMetric(ms(pct(lat, 0.5)), "served-osb-p50-ms")
				b.ReportMetric(ms(pct(lat, 0.99)), "served-osb-p99-ms")
				b.ReportMetric(float64(pct(lat, 0.99))/float64(pct(plain, 0.99)), "served-osb/kube-p99")
				b.ReportMetric(ms(sameCPU/servedRounds), "served-kube-cpu-ms/op")
				b.ReportMetric(ms(pct(same, 0.5)), "served-kube-p50-ms")
				b.ReportMetric(ms(pct(same, 0.99)), "served-kube-p99-ms")
				b.ReportMetric(float64(pct(lat, 0.99))/float64(pct(same, 0.99)), "served-osb/served-kube-p99")
			}
			// Stopped before the next variant: servers left running in this
			// process add their heaps to every garbage collection after them.
			if err := server.Stop(); err != nil {
				b.Fatal(err)
			}
		}
	}

}

// servedOSB starts another mizar-apiserver with the OSB API on its own
// listener (extra flags added) and the class c, and returns the API's URL, a
// client that keeps one connection per concurrent platform, and the server.
func servedOSB(b testing.TB, c *v1.ServiceClass, flags ...string) (string, *http.Client, *apiservertest.Server) {
	dir := b.TempDir()
	credFile := dir + "/osb-credentials"
	if err := os.WriteFile(credFile, []byte(creds.Username+":"+creds.Password+"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	// The workload kubeconfig is only read by bind; the shared server's will do.
	s := apiservertest.Start(b, dir, append([]string{"--broker-osb-address", addr, "--broker-osb-credentials-file", credFile,
		"--broker-workload-kubeconfig", shared.Kubeconfig}, flags...)...)
	class := c.DeepCopy()
	class.ResourceVersion, class.UID = "", ""
	if _, err := s.Client.BrokerV1alpha1().ServiceClasses().Create(context.Background(), class, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, MaxIdleConnsPerHost: 50}}
	// The facade loads the catalog by watch: wait until it offers the class.
	err = wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		req, _ := http.NewRequest("GET", "https://"+addr+"/v2/catalog", nil)
		req.SetBasicAuth(creds.Username, creds.Password)
		req.Header.Set("X-Broker-API-Version", "2.17")
		resp, err := hc.Do(req)
		if err != nil {
			return false, nil
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == 200 && strings.Contains(string(body), c.Spec.ID), nil
	})
	if err != nil {
		b.Fatalf("the served OSB API never offered the class: %v", err)
	}
	return "https://" + addr, hc, s
}
