package nodeagent

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// DebugPathPrefix is the prefix of the non-resource URL a caller of the
// agent's debug endpoints must be allowed: GET /drops is authorized as verb
// get on /mizar-agent/drops, POST /trace/underlay as post on
// /mizar-agent/trace/underlay. RBAC grants it with a ClusterRole's
// nonResourceURLs [/mizar-agent/*] (the chart's <release>-agent-debug,
// bound to the ServiceAccount mizarctl asks tokens for). A non-resource
// URL, not a subresource of droplets: the aggregated view role grants
// networking.mizar.dev resources "*", which would match any subresource.
const DebugPathPrefix = "/mizar-agent"

// How long the agent keeps the API's answers: a token's review and an
// allow or deny (a revoked grant takes effect within this).
const DebugAuthCacheTTL = 10 * time.Second

// DebugAuth guards the agent's debug endpoints (/drops, /trace/*, /state,
// /probe, /policy: what the node's maps hold, and packets sent from pods)
// as kubelet guards its own API: the caller's bearer token is reviewed by
// the Kubernetes API (TokenReview) and the request authorized there
// (SubjectAccessReview), both through k8s.io/apiserver's delegating
// authenticator and authorizer, with their answers cached for
// DebugAuthCacheTTL. /metrics and /healthz stay open (Prometheus and
// kubelet's probes read them; they show counts, not traffic). Every request
// is counted by outcome; refusals are logged with the user, at most
// debugAuthLogLines a second.
type DebugAuth struct {
	authn    authenticator.Request
	authz    authorizer.Authorizer
	requests *prometheus.CounterVec
	logs     *rate.Limiter
}

// Outcomes of a debug request (the result label of
// mizar_nodeagent_debug_requests_total).
const (
	DebugAllowed         = "allowed"
	DebugUnauthenticated = "unauthenticated"
	DebugForbidden       = "forbidden"
	DebugAuthError       = "error"
)

const debugAuthLogLines = 10

// NewDebugAuth authenticates and authorizes through kube (the cluster whose
// RBAC says who may debug the node; the agent's ServiceAccount needs
// tokenreviews and subjectaccessreviews create, as system:auth-delegator
// grants) and counts requests into reg.
func NewDebugAuth(kube kubernetes.Interface, reg prometheus.Registerer) (*DebugAuth, error) {
	backoff := wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 4}
	authn, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		TokenAccessReviewClient:  kube.AuthenticationV1(),
		TokenAccessReviewTimeout: 10 * time.Second,
		WebhookRetryBackoff:      &backoff,
		CacheTTL:                 DebugAuthCacheTTL,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("debug endpoints' authenticator: %w", err)
	}
	authz, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: kube.AuthorizationV1(),
		AllowCacheTTL:             DebugAuthCacheTTL,
		DenyCacheTTL:              DebugAuthCacheTTL,
		WebhookRetryBackoff:       &backoff,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("debug endpoints' authorizer: %w", err)
	}
	d := &DebugAuth{authn: authn, authz: authz, logs: rate.NewLimiter(debugAuthLogLines, debugAuthLogLines),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mizar_nodeagent_debug_requests_total",
			Help: "Requests to the agent's debug endpoints (/drops, /trace, /state, /probe, /policy) by path and result: allowed, " +
				"unauthenticated (401), forbidden (403) or error (the API could not be asked)."}, []string{"path", "result"})}
	if reg != nil {
		reg.MustRegister(d.requests)
	}
	return d, nil
}

// Wrap guards h, served at path (the metric's label: the registered path,
// never the request's URL, so a caller cannot grow the series). A nil
// DebugAuth (--debug-auth off) returns h as it is.
func (d *DebugAuth) Wrap(path string, h http.Handler) http.Handler {
	if d == nil {
		return h
	}
	for _, r := range []string{DebugAllowed, DebugUnauthenticated, DebugForbidden, DebugAuthError} {
		d.requests.WithLabelValues(path, r)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, ok, err := d.authn.AuthenticateRequest(r)
		if err != nil || !ok {
			why := "no bearer token"
			if err != nil {
				why = err.Error()
			}
			d.refuse(w, r, path, DebugUnauthenticated, http.StatusUnauthorized, "", "Unauthorized: the agent's debug endpoints need a Kubernetes bearer token "+
				"(mizarctl requests one for its ServiceAccount): "+why)
			return
		}
		u := res.User
		attrs := authorizer.AttributesRecord{User: u, Verb: strings.ToLower(r.Method), Path: DebugPathPrefix + r.URL.Path}
		decision, reason, err := d.authz.Authorize(r.Context(), attrs)
		switch {
		case err != nil && decision != authorizer.DecisionAllow:
			d.refuse(w, r, path, DebugAuthError, http.StatusInternalServerError, u.GetName(), "Authorization failed: the Kubernetes API could not be asked: "+err.Error())
			return
		case decision != authorizer.DecisionAllow:
			msg := fmt.Sprintf("Forbidden: user %q may not %s %s (RBAC: verb %s on nonResourceURLs [%s/*]; the chart's agent-debug ClusterRole grants it to the ServiceAccount mizarctl)",
				u.GetName(), attrs.Verb, attrs.Path, attrs.Verb, DebugPathPrefix)
			if reason != "" {
				msg += ": " + reason
			}
			d.refuse(w, r, path, DebugForbidden, http.StatusForbidden, u.GetName(), msg)
			return
		}
		d.requests.WithLabelValues(path, DebugAllowed).Inc()
		klog.V(2).InfoS("Debug request allowed", "user", u.GetName(), "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
		h.ServeHTTP(w, r.WithContext(genericapirequest.WithUser(r.Context(), u)))
	})
}

func (d *DebugAuth) refuse(w http.ResponseWriter, r *http.Request, path, result string, code int, userName, msg string) {
	d.requests.WithLabelValues(path, result).Inc()
	if d.logs.Allow() {
		klog.InfoS("Debug request refused", "result", result, "code", code, "user", userName, "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "why", msg)
	}
	http.Error(w, msg, code)
}

// DebugUser is the user a request DebugAuth allowed was authenticated as
// (nil when the endpoints are open).
func DebugUser(ctx context.Context) user.Info {
	u, _ := genericapirequest.UserFrom(ctx)
	return u
}
