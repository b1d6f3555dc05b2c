package apiserver

import (
	"context"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authentication/request/headerrequest"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"

	"mizar.dev/pkg/pki"
)

// lateCA is a CA provider whose bundle arrives later, as the informer-fed
// providers of k8s.io/apiserver fill theirs after the server starts.
type lateCA struct {
	dynamiccertificates.CAContentProvider
	loaded atomic.Bool
}

func (c *lateCA) CurrentCABundleContent() []byte {
	if !c.loaded.Load() {
		return nil
	}
	return c.CAContentProvider.CurrentCABundleContent()
}

func TestAuthGate(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.LoadOrCreateCA(dir+"/ca.crt", dir+"/ca.key", "authgate-test")
	if err != nil {
		t.Fatal(err)
	}
	testCA := string(ca.PEM)
	static, err := dynamiccertificates.NewStaticCAContent("ca", ca.PEM)
	if err != nil {
		t.Fatal(err)
	}
	clientCA, proxyCA := &lateCA{CAContentProvider: static}, &lateCA{CAContentProvider: static}
	var names atomic.Pointer[[]string]
	names.Store(&[]string{})
	rh := &authenticatorfactory.RequestHeaderConfig{
		CAContentProvider:  proxyCA,
		UsernameHeaders:    headerrequest.StaticStringSlice{"X-Remote-User"},
		AllowedClientNames: headerrequest.StringSliceProviderFunc(func() []string { return *names.Load() }),
	}
	// Anonymous unless the request carries a token.
	authn := authenticator.RequestFunc(func(r *http.Request) (*authenticator.Response, bool, error) {
		name := user.Anonymous
		if r.Header.Get("Authorization") != "" {
			name = "loopback"
		}
		return &authenticator.Response{User: &user.DefaultInfo{Name: name}}, true, nil
	})
	published := map[string]string{
		"client-ca-file": testCA, "requestheader-client-ca-file": testCA,
		"requestheader-username-headers": `["X-Remote-User"]`, "requestheader-allowed-names": `["front-proxy-client"]`,
	}
	g := &authGate{
		configMaps: func(context.Context) (map[string]string, error) { return published, nil },
		clientCA:   clientCA, requestHeader: rh, authn: authn,
	}
	served := 0
	h := g.wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served++ }))
	get := func(path string, token bool) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		if token {
			r.Header.Set("Authorization", "Bearer x")
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}

	if got, want := g.missing(published), []string{"client-ca-file", "requestheader-client-ca-file", "requestheader-allowed-names"}; !reflect.DeepEqual(sorted(got), sorted(want)) {
		t.Errorf("missing %v, want %v", got, want)
	}
	if w := get("/apis/networking.mizar.dev/v1alpha1/vpcs", false); w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
		t.Errorf("an anonymous request before the CAs loaded: %d %v, want 503 with Retry-After", w.Code, w.Header())
	}
	if g.Check(nil) == nil {
		t.Error("readyz check passed before the CAs loaded")
	}
	get("/readyz", false)
	get("/apis", true)
	if served != 2 {
		t.Errorf("served %d requests before the CAs loaded, want /readyz and the token's", served)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- g.run(ctx) }()
	clientCA.loaded.Store(true)
	proxyCA.loaded.Store(true)
	time.Sleep(100 * time.Millisecond)
	if g.Check(nil) == nil {
		t.Error("readyz check passed before the allowed names loaded")
	}
	names.Store(&[]string{"front-proxy-client"})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := g.Check(nil); err != nil {
		t.Errorf("readyz check after loading: %v", err)
	}
	if w := get("/apis/networking.mizar.dev/v1alpha1/vpcs", false); w.Code != http.StatusOK || served != 3 {
		t.Errorf("after loading: %d, served %d, want the request served", w.Code, served)
	}
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}
