// Package ui is mizarctl ui: a page that shows the network (VPCs, subnets,
// endpoints, droplets, the broker's orders) with their phases, live. It
// watches the API through informers with the user's own credentials and
// serves one embedded HTML page, a JSON snapshot (/api/snapshot) and a
// Server-Sent Events stream of snapshots (/api/events). Read-only.
package ui

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"mizar.dev/pkg/agentapi"
	brokerv1alpha1 "mizar.dev/pkg/apis/broker/v1alpha1"
	"mizar.dev/pkg/generated/clientset/versioned"
	"mizar.dev/pkg/generated/informers/externalversions"
)

//go:embed index.html
var page []byte

// Tick is how often the snapshot is rebuilt without a change (the agents'
// heartbeat ages move with time).
const Tick = 5 * time.Second

// Server watches mizar and serves the page. Create it with New, start its
// watches with Run, serve Handler.
type Server struct {
	factory externalversions.SharedInformerFactory
	kube    kubeinformers.SharedInformerFactory // nil: no heartbeat Leases
	fills   []func(*objects)                    // each copies one watched kind from its lister
	synced  []cache.InformerSynced
	// unreadable lists the kinds the user may not list (not watched).
	unreadable []string
	dirty      chan struct{}

	mu   sync.Mutex
	snap []byte // the latest snapshot, JSON; nil before the first sync
	subs map[chan []byte]struct{}
}

// New asks which kinds cfg's user may list and prepares a watch of those:
// a kind the user may not list is named on the page, not waited for.
func New(ctx context.Context, cfg *rest.Config) (*Server, error) {
	c, err := versioned.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	s := &Server{factory: externalversions.NewSharedInformerFactory(c, 0), dirty: make(chan struct{}, 1), subs: map[chan []byte]struct{}{}}
	nw, brk := s.factory.Networking().V1alpha1(), s.factory.Broker().V1alpha1()
	api, lo := c.NetworkingV1alpha1(), metav1.ListOptions{Limit: 1}
	discard := func(_ any, err error) error { return err }
	errs := []error{
		s.watch("Vpc", discard(api.Vpcs().List(ctx, lo)), nw.Vpcs().Informer, func(o *objects) {
			o.vpcs, _ = nw.Vpcs().Lister().List(labels.Everything())
		}),
		s.watch("Subnet", discard(api.Subnets().List(ctx, lo)), nw.Subnets().Informer, func(o *objects) {
			o.subnets, _ = nw.Subnets().Lister().List(labels.Everything())
		}),
		s.watch("Endpoint", discard(api.Endpoints("").List(ctx, lo)), nw.Endpoints().Informer, func(o *objects) {
			o.endpoints, _ = nw.Endpoints().Lister().List(labels.Everything())
		}),
		s.watch("Droplet", discard(api.Droplets().List(ctx, lo)), nw.Droplets().Informer, func(o *objects) {
			o.droplets, _ = nw.Droplets().Lister().List(labels.Everything())
		}),
		s.watch("Divider", discard(api.Dividers().List(ctx, lo)), nw.Dividers().Informer, func(o *objects) {
			o.dividers, _ = nw.Dividers().Lister().List(labels.Everything())
		}),
		s.watch("Bouncer", discard(api.Bouncers().List(ctx, lo)), nw.Bouncers().Informer, func(o *objects) {
			o.bouncers, _ = nw.Bouncers().Lister().List(labels.Everything())
		}),
		s.watch("ServiceInstance", discard(c.BrokerV1alpha1().ServiceInstances("").List(ctx, lo)), brk.ServiceInstances().Informer, func(o *objects) {
			o.orders, _ = brk.ServiceInstances().Lister().List(labels.Everything())
			if o.orders == nil { // watched, none: an empty list, not "not served"
				o.orders = []*brokerv1alpha1.ServiceInstance{}
			}
		}),
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := s.watchHeartbeats(ctx, cfg); err != nil {
		return nil, err
	}
	return s, nil
}

// watch adds an informer for kind when listing it (listErr) succeeded.
// informer is called only then: it registers the watch with its factory.
func (s *Server) watch(kind string, listErr error, informer func() cache.SharedIndexInformer, fill func(*objects)) error {
	switch {
	case apierrors.IsForbidden(listErr):
		s.unreadable = append(s.unreadable, kind)
		return nil
	case apierrors.IsNotFound(listErr): // not served (no broker)
		return nil
	case listErr != nil:
		return fmt.Errorf("listing %s: %w", kind, listErr)
	}
	inf := informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { s.changed() }, UpdateFunc: func(any, any) { s.changed() }, DeleteFunc: func(any) { s.changed() }}); err != nil {
		return err
	}
	s.synced = append(s.synced, inf.HasSynced)
	s.fills = append(s.fills, fill)
	return nil
}

// watchHeartbeats watches the agents' heartbeat Leases. They live in the
// workload cluster: watched when cfg is its kube-apiserver (mizar aggregated
// behind it) and Leases are readable, skipped otherwise.
func (s *Server) watchHeartbeats(ctx context.Context, cfg *rest.Config) error {
	kc, err := kubernetes.NewForConfig(cfg)
	if err == nil {
		_, err = kc.CoordinationV1().Leases("").List(ctx, metav1.ListOptions{LabelSelector: agentapi.HeartbeatLabel, Limit: 1})
	}
	if err != nil {
		return nil // no workload cluster behind cfg, or its Leases are not readable: no heartbeats
	}
	sel := func(o *metav1.ListOptions) { o.LabelSelector = agentapi.HeartbeatLabel }
	s.kube = kubeinformers.NewSharedInformerFactoryWithOptions(kc, 0, kubeinformers.WithTweakListOptions(sel))
	leases := s.kube.Coordination().V1().Leases()
	return s.watch("Lease", nil, leases.Informer, func(o *objects) {
		o.leases, _ = leases.Lister().List(labels.Everything())
	})
}

func (s *Server) list() objects {
	var o objects
	for _, f := range s.fills {
		f(&o)
	}
	return o
}

func (s *Server) changed() {
	select {
	case s.dirty <- struct{}{}:
	default:
	}
}

// Run watches until ctx ends, publishing a snapshot after each change
// (changes within 50ms are drawn together) and every Tick.
func (s *Server) Run(ctx context.Context) error {
	s.factory.Start(ctx.Done())
	defer s.factory.Shutdown()
	if s.kube != nil {
		s.kube.Start(ctx.Done())
		defer s.kube.Shutdown()
	}
	if !cache.WaitForCacheSync(ctx.Done(), s.synced...) {
		return nil // ctx ended first
	}
	tick := time.NewTicker(Tick)
	defer tick.Stop()
	for {
		if err := s.publish(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-s.dirty:
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func (s *Server) publish() error {
	snap := build(s.list(), time.Now())
	snap.Unreadable = s.unreadable
	b, err := json.Marshal(snap)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if bytes.Equal(b, s.snap) {
		return nil
	}
	s.snap = b
	for ch := range s.subs {
		// Each subscriber holds at most the latest snapshot: a slow page
		// skips states, it does not queue them.
		select {
		case ch <- b:
		default:
			select {
			case <-ch:
			default:
			}
			ch <- b
		}
	}
	return nil
}

func (s *Server) subscribe() (chan []byte, []byte) {
	ch := make(chan []byte, 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subs[ch] = struct{}{}
	return ch, s.snap
}

func (s *Server) unsubscribe(ch chan []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.subs, ch)
}

// Handler serves the page, the snapshot and the stream. Only GET and HEAD
// are answered, and only for a Host naming the loopback or the listener
// (a web page elsewhere cannot read it through DNS rebinding).
func (s *Server) Handler(listen string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", csp)
		_, _ = w.Write(page)
	})
	mux.HandleFunc("GET /api/snapshot", func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		b := s.snap
		s.mu.Unlock()
		if b == nil {
			http.Error(w, "not synced yet", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	})
	mux.HandleFunc("GET /api/events", s.events)
	return guard(listen, mux)
}

// events streams every snapshot as one SSE message (JSON holds no newline).
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	ch, first := s.subscribe()
	defer s.unsubscribe(ch)
	send := func(b []byte) bool {
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if _, err := io.WriteString(w, "retry: 1000\n\n"); err != nil || rc.Flush() != nil {
		return
	}
	if first != nil && !send(first) {
		return
	}
	keep := time.NewTicker(15 * time.Second)
	defer keep.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case b := <-ch:
			if !send(b) {
				return
			}
		case <-keep.C:
			if _, err := io.WriteString(w, ": keep-alive\n\n"); err != nil || rc.Flush() != nil {
				return
			}
		}
	}
}

// csp allows the page's own inline script and style (by hash) and requests
// to its own origin, nothing else: no images, frames, forms or plugins.
var csp = func() string {
	hashes := func(tag string) string {
		var out []string
		for _, m := range regexp.MustCompile(`(?s)<`+tag+`>(.*?)</`+tag+`>`).FindAllSubmatch(page, -1) {
			h := sha256.Sum256(m[1])
			out = append(out, "'sha256-"+base64.StdEncoding.EncodeToString(h[:])+"'")
		}
		return strings.Join(out, " ")
	}
	return "default-src 'none'; connect-src 'self'; script-src " + hashes("script") + "; style-src " + hashes("style") +
		"; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
}()

func guard(listen string, next http.Handler) http.Handler {
	host, port, _ := net.SplitHostPort(listen)
	ip := net.ParseIP(host)
	anyHost := host == "" || (ip != nil && ip.IsUnspecified())
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, p, err := net.SplitHostPort(r.Host)
		if err != nil {
			h, p = r.Host, "80"
		}
		ok := anyHost || (p == port && (h == host || h == "localhost" || net.ParseIP(h).IsLoopback()))
		if !ok {
			http.Error(w, "unexpected Host", http.StatusMisdirectedRequest)
			return
		}
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Referrer-Policy", "no-referrer")
		next.ServeHTTP(w, r)
	})
}

// Serve watches the mizar behind cfg and serves the page on listen until ctx
// ends; started (if not nil) gets the page's URL once it is served.
func Serve(ctx context.Context, cfg *rest.Config, listen string, started func(url string)) error {
	s, err := New(ctx, cfg)
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	addr := l.Addr().String()
	srv := &http.Server{Handler: s.Handler(addr), ReadHeaderTimeout: 10 * time.Second}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	runErr := make(chan error, 1)
	go func() {
		runErr <- s.Run(ctx)
		cancel()
	}()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if started != nil {
		started("http://" + addr + "/")
	}
	err = srv.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	cancel()
	return errors.Join(err, <-runErr)
}
