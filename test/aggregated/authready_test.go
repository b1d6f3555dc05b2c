package aggregated

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"testing"
	"time"
)

// TestAuthenticatedFromFirstReady restarts mizar-apiserver and, from the first
// moment its /readyz answers 200, lists droplets as an admin both ways a
// delegating server is reached: with a client certificate of the cluster's
// client CA, and as the front proxy (the aggregator's identity) naming a user
// in X-Remote-* headers. Both CAs come from kube-system/
// extension-apiserver-authentication; a server that is ready before it loaded
// them answers these as system:anonymous (403).
func TestAuthenticatedFromFirstReady(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	url := cl.MizarURL
	admin := pkiClient(t, "admin")
	proxy := pkiClient(t, "front-proxy-client")

	if err := cl.StopMizar(); err != nil {
		t.Fatalf("stopping mizar-apiserver: %v", err)
	}
	// The restart and the wait for it outlive this function (they finish in
	// Cleanup), so they get a context of their own, not the test's, which the
	// deferred cancel ends before Cleanup runs.
	restartCtx, restartCancel := context.WithTimeout(context.Background(), 3*time.Minute)
	started := make(chan error, 1)
	go func() { started <- cl.StartMizar(restartCtx) }()
	t.Cleanup(func() {
		defer restartCancel()
		if err := <-started; err != nil {
			t.Errorf("restarting mizar-apiserver: %v", err)
		}
		if err := cl.WaitAPIService(restartCtx, true); err != nil {
			t.Errorf("APIService after the restart: %v", err)
		}
	})

	polls := 0
	for {
		polls++
		resp, err := admin.Get(url + "/readyz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("mizar-apiserver never became ready: %v", err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Logf("/readyz 200 after %d polls", polls)

	codes := map[string]map[int]int{"client-certificate": {}, "front-proxy": {}}
	end := time.Now().Add(2 * time.Second)
	for time.Now().Before(end) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/apis/networking.mizar.dev/v1alpha1/droplets?limit=1", nil)
		codes["client-certificate"][do(t, admin, req)]++
		req, _ = http.NewRequestWithContext(ctx, http.MethodGet, url+"/apis/networking.mizar.dev/v1alpha1/droplets?limit=1", nil)
		req.Header.Set("X-Remote-User", "e2e-admin")
		req.Header.Set("X-Remote-Group", "system:masters")
		codes["front-proxy"][do(t, proxy, req)]++
	}
	for way, byCode := range codes {
		t.Logf("%s: answers by status %v", way, byCode)
		for code, n := range byCode {
			if code != http.StatusOK {
				t.Errorf("%s: %d answers %d after /readyz said 200 (want only 200)", way, n, code)
			}
		}
	}
}

func do(t *testing.T, c *http.Client, req *http.Request) int {
	resp, err := c.Do(req)
	if err != nil {
		t.Logf("%s: %v", req.URL, err)
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// pkiClient talks to mizar-apiserver with the named client certificate.
func pkiClient(t *testing.T, name string) *http.Client {
	t.Helper()
	ca, err := os.ReadFile(cl.PKIFile("mizar-ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	cert, err := tls.LoadX509KeyPair(cl.PKIFile(name+".crt"), cl.PKIFile(name+".key"))
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}}
}
