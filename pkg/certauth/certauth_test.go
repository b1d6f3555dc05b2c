package certauth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authentication/request/headerrequest"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
)

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

var serial int64

// sign makes a certificate from tmpl with a new key, signed by parent, or by
// itself when parent is nil.
func sign(t testing.TB, tmpl *x509.Certificate, parent *testCA) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl.SerialNumber = big.NewInt(serial)
	issuer := &testCA{cert: tmpl, key: key}
	if parent != nil {
		issuer = parent
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer.cert, &key.PublicKey, issuer.key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key}
}

func newCA(t testing.TB, name string) *testCA {
	t.Helper()
	return sign(t, &x509.Certificate{
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}, nil)
}

// issue signs a client certificate for cn valid in [notBefore, notAfter].
func (ca *testCA) issue(t testing.TB, cn string, notBefore, notAfter time.Time) *x509.Certificate {
	t.Helper()
	return sign(t, &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn, Organization: []string{"team"}},
		NotBefore:   notBefore,
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca).cert
}

func (ca *testCA) client(t testing.TB, cn string) *x509.Certificate {
	return ca.issue(t, cn, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
}

// caFile is a real file-backed CA provider (the one --client-ca-file makes)
// whose bundle the test rewrites.
type caFile struct {
	path string
	p    *dynamiccertificates.DynamicFileCAContent
}

func newCAFile(t *testing.T, name string, cas ...*testCA) *caFile {
	t.Helper()
	f := &caFile{path: filepath.Join(t.TempDir(), name+".crt")}
	f.write(t, cas...)
	p, err := dynamiccertificates.NewDynamicCAContentFromFile(name, f.path)
	if err != nil {
		t.Fatal(err)
	}
	f.p = p
	return f
}

// write replaces the bundle and makes the provider load it, as its file
// watcher does on a change.
func (f *caFile) write(t *testing.T, cas ...*testCA) {
	t.Helper()
	var b []byte
	for _, ca := range cas {
		b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})...)
	}
	if err := os.WriteFile(f.path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if f.p != nil {
		if err := f.p.RunOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCacheVerifiesOncePerCertificateAndBundle(t *testing.T) {
	ca := newCA(t, "client-ca")
	f := newCAFile(t, "client-ca", ca)
	c := NewCache(0)
	alice, bob := ca.client(t, "alice"), ca.client(t, "bob")
	for range 3 {
		for _, cert := range []*x509.Certificate{alice, bob} {
			chains, ok, err := c.Verify([]*x509.Certificate{cert}, f.p)
			if !ok || err != nil || len(chains) != 1 || chains[0][0] != cert {
				t.Fatalf("Verify(%s) = %v, %v, %v; want one chain from the leaf", cert.Subject.CommonName, chains, ok, err)
			}
		}
	}
	if n := c.verifications.Load(); n != 2 {
		t.Errorf("%d verifications for two certificates presented three times each; want 2", n)
	}
	// A bundle with one more CA is another bundle: verified again, once.
	f.write(t, ca, newCA(t, "other"))
	for range 2 {
		if _, ok, err := c.Verify([]*x509.Certificate{alice}, f.p); !ok || err != nil {
			t.Fatalf("after adding a CA: %v, %v", ok, err)
		}
	}
	if n := c.verifications.Load(); n != 3 {
		t.Errorf("%d verifications after the bundle changed; want 3", n)
	}
}

func TestCacheRefusesCertificateOfRemovedCA(t *testing.T) {
	old, next := newCA(t, "old"), newCA(t, "next")
	f := newCAFile(t, "client-ca", old, next)
	c := NewCache(0)
	cert := old.client(t, "alice")
	if _, ok, err := c.Verify([]*x509.Certificate{cert}, f.p); !ok || err != nil {
		t.Fatalf("before the removal: %v, %v", ok, err)
	}
	f.write(t, next)
	if _, _, err := c.Verify([]*x509.Certificate{cert}, f.p); err == nil {
		t.Fatal("a certificate of a CA removed from the bundle still verifies")
	}
	if c.Len() != 0 {
		t.Errorf("%d entries left after the removal; want the stale one dropped", c.Len())
	}
	// Putting the CA back trusts it again.
	f.write(t, old, next)
	if _, ok, err := c.Verify([]*x509.Certificate{cert}, f.p); !ok || err != nil {
		t.Fatalf("after restoring the CA: %v, %v", ok, err)
	}
}

func TestCacheRefusesExpiredCertificate(t *testing.T) {
	ca := newCA(t, "client-ca")
	f := newCAFile(t, "client-ca", ca)
	c := NewCache(0)
	expired := ca.issue(t, "late", time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour))
	for range 2 {
		if _, _, err := c.Verify([]*x509.Certificate{expired}, f.p); err == nil {
			t.Fatal("an expired certificate verifies")
		}
	}
	// A cached certificate stops verifying the moment it expires.
	now := time.Now()
	c.now = func() time.Time { return now }
	short := ca.issue(t, "short", now.Add(-time.Minute), now.Add(time.Minute))
	if _, ok, err := c.Verify([]*x509.Certificate{short}, f.p); !ok || err != nil {
		t.Fatalf("a valid certificate: %v, %v", ok, err)
	}
	now = now.Add(2 * time.Minute)
	if _, _, err := c.Verify([]*x509.Certificate{short}, f.p); err == nil {
		t.Fatal("a cached certificate still verifies after its NotAfter")
	}
	// Not yet valid: refused too.
	future := ca.issue(t, "future", now.Add(time.Hour), now.Add(2*time.Hour))
	if _, _, err := c.Verify([]*x509.Certificate{future}, f.p); err == nil {
		t.Fatal("a certificate before its NotBefore verifies")
	}
}

func TestCacheKeepsProvidersApart(t *testing.T) {
	clientCA, proxyCA := newCA(t, "client-ca"), newCA(t, "front-proxy-ca")
	clients, proxies := newCAFile(t, "client-ca", clientCA), newCAFile(t, "front-proxy-ca", proxyCA)
	c := NewCache(0)
	cert := proxyCA.client(t, "front-proxy-client")
	if _, ok, err := c.Verify([]*x509.Certificate{cert}, proxies.p); !ok || err != nil {
		t.Fatalf("against its own CA: %v, %v", ok, err)
	}
	if _, _, err := c.Verify([]*x509.Certificate{cert}, clients.p); err == nil {
		t.Fatal("a front-proxy certificate verified against the client CA (from the other provider's entry)")
	}
}

func TestCacheIsBounded(t *testing.T) {
	ca := newCA(t, "client-ca")
	f := newCAFile(t, "client-ca", ca)
	c := NewCache(2)
	certs := []*x509.Certificate{ca.client(t, "a"), ca.client(t, "b"), ca.client(t, "c")}
	for _, cert := range certs {
		if _, ok, err := c.Verify([]*x509.Certificate{cert}, f.p); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if c.Len() != 2 {
		t.Fatalf("%d entries in a cache of 2", c.Len())
	}
	// The least recently used ("a") went: it is verified again.
	before := c.verifications.Load()
	_, _, _ = c.Verify(certs[2:], f.p)
	_, _, _ = c.Verify(certs[:1], f.p)
	if got := c.verifications.Load() - before; got != 1 {
		t.Errorf("%d verifications for the newest and the evicted certificate; want 1", got)
	}
}

// TestAuthenticatorMatchesLibrary runs each request through the library's own
// delegating authenticator and through the cache in front of it, twice (miss,
// then hit), and wants the same answer every time.
func TestAuthenticatorMatchesLibrary(t *testing.T) {
	clientCA, proxyCA, stranger := newCA(t, "client-ca"), newCA(t, "front-proxy-ca"), newCA(t, "stranger")
	clients, proxies := newCAFile(t, "client-ca", clientCA), newCAFile(t, "front-proxy-ca", proxyCA)
	rh := &authenticatorfactory.RequestHeaderConfig{
		UsernameHeaders:     headerrequest.StaticStringSlice{"X-Remote-User"},
		UIDHeaders:          headerrequest.StaticStringSlice{"X-Remote-Uid"},
		GroupHeaders:        headerrequest.StaticStringSlice{"X-Remote-Group"},
		ExtraHeaderPrefixes: headerrequest.StaticStringSlice{"X-Remote-Extra-"},
		CAContentProvider:   proxies.p,
		AllowedClientNames:  headerrequest.StaticStringSlice{"front-proxy-client"},
	}
	library, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		Anonymous:                          &apiserver.AnonymousAuthConfig{Enabled: true},
		ClientCertificateCAContentProvider: clients.p,
		RequestHeaderConfig:                rh,
	}.New()
	if err != nil {
		t.Fatal(err)
	}
	cached := New(NewCache(0), clients.p, rh, library)

	alice := clientCA.client(t, "alice")
	proxy := proxyCA.client(t, "front-proxy-client")
	otherProxy := proxyCA.client(t, "someone-else")
	strangerCert := stranger.client(t, "alice")
	expired := clientCA.issue(t, "alice", time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour))
	asBob := http.Header{"X-Remote-User": {"bob"}, "X-Remote-Group": {"devs"}, "X-Remote-Extra-Scopes": {"x"}}
	cases := []struct {
		name    string
		cert    *x509.Certificate
		headers http.Header
		want    string // the user name, "" when not authenticated as a named user
	}{
		{"no certificate", nil, nil, "system:anonymous"},
		{"client certificate", alice, nil, "alice"},
		{"client certificate cannot assert headers", alice, asBob, "alice"},
		{"front proxy with a user", proxy, asBob, "bob"},
		{"front proxy without a user", proxy, nil, ""},
		{"front proxy with a name not allowed", otherProxy, asBob, ""},
		{"certificate of an unknown CA", strangerCert, nil, ""},
		{"expired certificate", expired, nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for round := range 2 {
				want, wantOK, wantErr := library.AuthenticateRequest(request(tc.cert, tc.headers))
				got, gotOK, gotErr := cached.AuthenticateRequest(request(tc.cert, tc.headers))
				if gotOK != wantOK || (gotErr == nil) != (wantErr == nil) || !sameUser(got, want) {
					t.Fatalf("round %d: got %v, %v, %v; the library says %v, %v, %v", round, user(got), gotOK, gotErr, user(want), wantOK, wantErr)
				}
				if name := user(got); name != tc.want && (tc.want != "" || gotOK) {
					t.Fatalf("round %d: authenticated as %q, want %q", round, name, tc.want)
				}
			}
		})
	}

	// Known certificates are answered from the cache: the front proxy's without
	// any verification; alice's with only the failing front-proxy check
	// (failures are not cached, and one against a CA of another name stops
	// before any signature check).
	for _, c := range []struct {
		cert    *x509.Certificate
		headers http.Header
		want    int64
	}{{proxy, asBob, 0}, {alice, nil, 1}} {
		before := cached.cache.verifications.Load()
		if _, ok, err := cached.AuthenticateRequest(request(c.cert, c.headers)); !ok || err != nil {
			t.Fatalf("%s: %v, %v", c.cert.Subject.CommonName, ok, err)
		}
		if got := cached.cache.verifications.Load() - before; got != c.want {
			t.Errorf("%s: %d verifications of a known certificate, want %d", c.cert.Subject.CommonName, got, c.want)
		}
	}

	// The client CA is removed: alice, verified and cached before, is refused at once.
	clients.write(t, stranger)
	if resp, ok, _ := cached.AuthenticateRequest(request(alice, nil)); ok && user(resp) == "alice" {
		t.Fatal("alice still authenticates after her CA was removed from the client CA bundle")
	}
	// The front proxy's CA is removed: the proxy cannot assert users any more.
	proxies.write(t, stranger)
	if resp, ok, _ := cached.AuthenticateRequest(request(proxy, asBob)); ok && user(resp) == "bob" {
		t.Fatal("the front proxy still asserts users after its CA was removed")
	}
}

func request(cert *x509.Certificate, h http.Header) *http.Request {
	req := &http.Request{Header: http.Header{}}
	for k, v := range h {
		req.Header[k] = append([]string(nil), v...)
	}
	if cert != nil {
		req.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}
	}
	return req
}

func user(r *authenticator.Response) string {
	if r == nil || r.User == nil {
		return ""
	}
	return r.User.GetName()
}

func sameUser(a, b *authenticator.Response) bool {
	if (a == nil) != (b == nil) {
		return false
	}
	if a == nil {
		return true
	}
	return a.User.GetName() == b.User.GetName() && a.User.GetUID() == b.User.GetUID() &&
		reflect.DeepEqual(a.User.GetGroups(), b.User.GetGroups()) && reflect.DeepEqual(a.User.GetExtra(), b.User.GetExtra())
}

// A provider that cannot be a map key (the library's union of bundles is a
// slice) is verified every time instead of panicking.
func TestCacheVerifiesUncacheableProviders(t *testing.T) {
	a, b := newCA(t, "a"), newCA(t, "b")
	union := dynamiccertificates.NewUnionCAContentProvider(newCAFile(t, "a", a).p, newCAFile(t, "b", b).p)
	c := NewCache(0)
	for range 2 {
		if _, ok, err := c.Verify([]*x509.Certificate{b.client(t, "bob")}, union); !ok || err != nil {
			t.Fatalf("a certificate of the union's second CA: %v, %v", ok, err)
		}
	}
	if c.Len() != 0 {
		t.Errorf("%d entries for an uncacheable provider", c.Len())
	}
}

// BenchmarkAuthenticate compares the library's delegating authenticator with
// the cache in front of it, for a client certificate and for the front proxy.
func BenchmarkAuthenticate(b *testing.B) {
	clientCA, proxyCA := newCA(b, "client-ca"), newCA(b, "front-proxy-ca")
	dir := b.TempDir()
	file := func(name string, ca *testCA) *dynamiccertificates.DynamicFileCAContent {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw}), 0o600); err != nil {
			b.Fatal(err)
		}
		p, err := dynamiccertificates.NewDynamicCAContentFromFile(name, path)
		if err != nil {
			b.Fatal(err)
		}
		return p
	}
	clients, proxies := file("client-ca", clientCA), file("front-proxy-ca", proxyCA)
	rh := &authenticatorfactory.RequestHeaderConfig{
		UsernameHeaders:     headerrequest.StaticStringSlice{"X-Remote-User"},
		UIDHeaders:          headerrequest.StaticStringSlice{"X-Remote-Uid"},
		GroupHeaders:        headerrequest.StaticStringSlice{"X-Remote-Group"},
		ExtraHeaderPrefixes: headerrequest.StaticStringSlice{"X-Remote-Extra-"},
		CAContentProvider:   proxies,
		AllowedClientNames:  headerrequest.StaticStringSlice{"front-proxy-client"},
	}
	library, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		Anonymous:                          &apiserver.AnonymousAuthConfig{Enabled: true},
		ClientCertificateCAContentProvider: clients,
		RequestHeaderConfig:                rh,
	}.New()
	if err != nil {
		b.Fatal(err)
	}
	cached := New(NewCache(0), clients, rh, library)
	alice, proxy := clientCA.client(b, "alice"), proxyCA.client(b, "front-proxy-client")
	for _, r := range []struct {
		name    string
		cert    *x509.Certificate
		headers http.Header
	}{{"client", alice, nil}, {"front-proxy", proxy, http.Header{"X-Remote-User": {"bob"}, "X-Remote-Group": {"devs"}}}} {
		for _, a := range []struct {
			name string
			a    authenticator.Request
		}{{"library", library}, {"cached", cached}} {
			b.Run(r.name+"/"+a.name, func(b *testing.B) {
				for b.Loop() {
					if _, ok, err := a.a.AuthenticateRequest(request(r.cert, r.headers)); !ok || err != nil {
						b.Fatal(ok, err)
					}
				}
			})
		}
	}
}
