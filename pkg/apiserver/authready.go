package apiserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// authConfigMap is where kube-apiserver publishes the client CA and the front
// proxy's request-header settings that delegated authentication loads.
const authConfigMap = "extension-apiserver-authentication"

// authGate holds API requests back until delegated authentication has loaded
// what kube-apiserver publishes. k8s.io/apiserver fills its client-CA and
// request-header providers from informers that start with the server: for the
// first 0.1-0.2 s a front-proxied or client-certificate request authenticated
// as system:anonymous and was refused (403) while /readyz said 200. Until the
// providers hold what the ConfigMap holds, /readyz fails and a request that
// would pass as anonymous is answered 503 with Retry-After; one that
// authenticates otherwise (a token, the loopback client) is served.
type authGate struct {
	configMaps    func(ctx context.Context) (map[string]string, error)
	clientCA      dynamiccertificates.CAContentProvider
	requestHeader *authenticatorfactory.RequestHeaderConfig
	authn         authenticator.Request
	ready         atomic.Bool
}

func newAuthGate(client kubernetes.Interface, clientCA dynamiccertificates.CAContentProvider, rh *authenticatorfactory.RequestHeaderConfig, authn authenticator.Request) *authGate {
	return &authGate{
		configMaps: func(ctx context.Context) (map[string]string, error) {
			cm, err := client.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, authConfigMap, metav1.GetOptions{})
			if err != nil {
				return nil, err
			}
			return cm.Data, nil
		},
		clientCA: clientCA, requestHeader: rh, authn: authn,
	}
}

// missing names what published configuration the providers do not hold yet.
func (g *authGate) missing(data map[string]string) []string {
	var out []string
	loaded := func(p dynamiccertificates.CAContentProvider) bool {
		return p != nil && len(p.CurrentCABundleContent()) > 0
	}
	if data["client-ca-file"] != "" && !loaded(g.clientCA) {
		out = append(out, "client-ca-file")
	}
	rh := g.requestHeader
	if data["requestheader-client-ca-file"] != "" && (rh == nil || !loaded(rh.CAContentProvider)) {
		out = append(out, "requestheader-client-ca-file")
	}
	for key, value := range map[string]func() []string{
		"requestheader-username-headers": func() []string { return rh.UsernameHeaders.Value() },
		"requestheader-allowed-names":    func() []string { return rh.AllowedClientNames.Value() },
	} {
		var want []string
		if err := json.Unmarshal([]byte(data[key]), &want); err != nil || len(want) == 0 {
			continue
		}
		if rh == nil || len(value()) == 0 {
			out = append(out, key)
		}
	}
	return out
}

// run polls until the providers hold the published configuration, then opens
// the gate. The ConfigMap is read again every second in case it changed.
func (g *authGate) run(ctx context.Context) error {
	start := time.Now()
	var data map[string]string
	var read time.Time
	var last []string
	for {
		if data == nil || time.Since(read) > time.Second {
			d, err := g.configMaps(ctx)
			if err != nil {
				klog.ErrorS(err, "Reading the delegated authentication configuration; API requests wait", "configMap", metav1.NamespaceSystem+"/"+authConfigMap)
			} else {
				data, read = d, time.Now()
			}
		}
		if data != nil {
			if last = g.missing(data); len(last) == 0 {
				g.ready.Store(true)
				klog.InfoS("Delegated authentication configuration loaded; serving API requests", "after", time.Since(start).Round(time.Millisecond))
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("delegated authentication never loaded %s: %w", strings.Join(last, ", "), ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Name and Check make the gate a /readyz check.
func (g *authGate) Name() string { return "mizar-authentication-loaded" }

func (g *authGate) Check(*http.Request) error {
	if !g.ready.Load() {
		return fmt.Errorf("delegated authentication has not loaded kube-system/%s yet", authConfigMap)
	}
	return nil
}

// wrap answers 503 to requests that would pass as anonymous while the gate is
// closed; health checks always pass through.
func (g *authGate) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if g.ready.Load() || isHealthPath(req.URL.Path) {
			h.ServeHTTP(w, req)
			return
		}
		if resp, ok, err := g.authn.AuthenticateRequest(req); err == nil && ok && resp.User.GetName() != user.Anonymous {
			h.ServeHTTP(w, req)
			return
		}
		w.Header().Set("Retry-After", "1")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(metav1.Status{
			TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
			Status:   metav1.StatusFailure, Code: http.StatusServiceUnavailable, Reason: metav1.StatusReasonServiceUnavailable,
			Message: "mizar-apiserver is starting: delegated authentication has not loaded its configuration yet; retry",
		})
	})
}

func isHealthPath(p string) bool {
	for _, h := range []string{"/healthz", "/livez", "/readyz"} {
		if p == h || strings.HasPrefix(p, h+"/") {
			return true
		}
	}
	return false
}
