package certauth

import (
	"crypto/x509"
	"net/http"
	"slices"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authentication/group"
	"k8s.io/apiserver/pkg/authentication/request/headerrequest"
	x509request "k8s.io/apiserver/pkg/authentication/request/x509"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
)

// Authenticator puts a cached client-certificate check in front of the
// authenticator k8s.io/apiserver's DelegatingAuthenticatorConfig builds. It
// tries, in that chain's order, the front proxy (a certificate from the
// request-header CA with an allowed name, and a user in the headers) and then
// the client CA (the user is the certificate's common name); it answers only
// when one of them authenticates the request, and hands every other request
// (no certificate, a certificate neither CA verifies, tokens, anonymous) to the
// library's authenticator unchanged, which then decides exactly as before.
type Authenticator struct {
	cache    *Cache
	clientCA dynamiccertificates.CAContentProvider
	proxy    *authenticatorfactory.RequestHeaderConfig
	headers  authenticator.Request
	cached   authenticator.Request
	delegate authenticator.Request
}

// New returns delegate behind the cache. clientCA and requestHeader must be the
// very providers delegate verifies with (nil when it has none), so the cache
// sees every CA change delegate sees.
func New(cache *Cache, clientCA dynamiccertificates.CAContentProvider, requestHeader *authenticatorfactory.RequestHeaderConfig, delegate authenticator.Request) *Authenticator {
	a := &Authenticator{cache: cache, clientCA: clientCA, proxy: requestHeader, delegate: delegate}
	if requestHeader != nil {
		a.headers = headerrequest.NewDynamic(requestHeader.UsernameHeaders, requestHeader.UIDHeaders, requestHeader.GroupHeaders, requestHeader.ExtraHeaderPrefixes)
	}
	// The library's chain adds system:authenticated to whoever it authenticates.
	a.cached = group.NewAuthenticatedGroupAdder(authenticator.RequestFunc(a.fromCertificate))
	return a
}

// AuthenticateRequest implements authenticator.Request.
func (a *Authenticator) AuthenticateRequest(req *http.Request) (*authenticator.Response, bool, error) {
	if resp, ok, err := a.cached.AuthenticateRequest(req); ok && err == nil {
		return resp, true, nil
	}
	return a.delegate.AuthenticateRequest(req)
}

// fromCertificate authenticates by the client certificate alone, or says
// nothing (false, no error: the delegate gives the precise answer).
func (a *Authenticator) fromCertificate(req *http.Request) (*authenticator.Response, bool, error) {
	if req.TLS == nil || len(req.TLS.PeerCertificates) == 0 {
		return nil, false, nil
	}
	peers := req.TLS.PeerCertificates
	if a.proxy != nil {
		if _, ok, err := a.cache.Verify(peers, a.proxy.CAContentProvider); ok && err == nil && a.allowedProxy(peers[0]) {
			if resp, ok, err := a.headers.AuthenticateRequest(req); ok && err == nil {
				return resp, true, nil
			}
		}
	}
	if a.clientCA != nil {
		chains, ok, err := a.cache.Verify(peers, a.clientCA)
		if !ok || err != nil {
			return nil, false, nil
		}
		for _, chain := range chains {
			if resp, ok, err := x509request.CommonNameUserConversion.User(chain); ok && err == nil {
				return resp, true, nil
			}
		}
	}
	return nil, false, nil
}

// allowedProxy applies --requestheader-allowed-names (empty allows any name).
func (a *Authenticator) allowedProxy(leaf *x509.Certificate) bool {
	if a.proxy.AllowedClientNames == nil {
		return true
	}
	names := a.proxy.AllowedClientNames.Value()
	return len(names) == 0 || slices.Contains(names, leaf.Subject.CommonName)
}
