package mizarctl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Agents says where each droplet's node agent serves its health address
// (--health-addr: /metrics, /drops, /trace) and how mizarctl authenticates
// there. mizarctl asks agents for what only they know (drop events, traces
// through their programs); the API answers the rest. The addresses are
// given (--agent droplet=URL: ParseAgents) or found (ForwardAgents: a
// port-forward through the API to each agent pod).
type Agents struct {
	urls map[string]string
	// why says, for a droplet whose agent was found but cannot be reached,
	// why not; via, how each address was found (for error messages).
	why, via map[string]string
	// hint is what to do about a droplet with no address at all.
	hint  string
	token TokenSource
	stops []func()

	mu      sync.Mutex
	bearer  string
	fetched bool
	fetch   error
}

// TokenSource gives the bearer token an agent that authenticates its
// callers (mizar-nodeagent --debug-auth) accepts.
type TokenSource func(context.Context) (string, error)

// ParseAgents reads "droplet=URL" pairs (a URL without a scheme is http).
func ParseAgents(pairs []string) (*Agents, error) {
	a := newAgents("pass --agent <droplet>=<its --health-addr>")
	for _, p := range pairs {
		name, url, ok := strings.Cut(p, "=")
		if !ok || name == "" || url == "" {
			return nil, fmt.Errorf("--agent %q: want droplet=URL", p)
		}
		if !strings.Contains(url, "://") {
			url = "http://" + url
		}
		a.urls[name] = strings.TrimSuffix(url, "/")
		a.via[name] = "--agent"
	}
	return a, nil
}

func newAgents(hint string) *Agents {
	return &Agents{urls: map[string]string{}, why: map[string]string{}, via: map[string]string{}, hint: hint}
}

// WithToken makes calls answered 401 (an agent with --debug-auth) retry
// once with the token src gives; src is asked at most once.
func (a *Agents) WithToken(src TokenSource) *Agents {
	a.token = src
	return a
}

// Names are the droplets with an agent, reachable or not, sorted.
func (a *Agents) Names() []string {
	names := make([]string, 0, len(a.urls)+len(a.why))
	for n := range a.urls {
		names = append(names, n)
	}
	for n := range a.why {
		if _, ok := a.urls[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

// Close stops the port-forwards ForwardAgents started.
func (a *Agents) Close() {
	for _, stop := range a.stops {
		stop()
	}
	a.stops = nil
}

var agentClient = &http.Client{Timeout: 30 * time.Second}

// call asks droplet's agent (GET without a body, else POST) and decodes
// the JSON answer into out. An answer 401 is retried once with the token.
func (a *Agents) call(ctx context.Context, droplet, path string, body []byte, out any) error {
	base, ok := a.urls[droplet]
	if !ok {
		if why, ok := a.why[droplet]; ok {
			return fmt.Errorf("agent of %s: %s", droplet, why)
		}
		return fmt.Errorf("no address for the agent of droplet %s: %s", droplet, a.hint)
	}
	who := "agent of " + droplet
	if v := a.via[droplet]; v != "" {
		who += " (" + v + ")"
	}
	token, _ := a.cachedToken()
	for retried := false; ; retried = true {
		code, status, b, err := a.do(ctx, base+path, body, token)
		if err != nil {
			return fmt.Errorf("%s: %w", who, err)
		}
		if code == http.StatusUnauthorized && !retried && a.token != nil {
			t, terr := a.fetchToken(ctx)
			if terr != nil {
				return fmt.Errorf("%s: %s: %s (mizarctl has no token to send: %v)", who, status, strings.TrimSpace(string(b)), terr)
			}
			if t != token {
				token = t
				continue
			}
		}
		if code != http.StatusOK {
			return fmt.Errorf("%s: %s: %s", who, status, strings.TrimSpace(string(b)))
		}
		if out == nil {
			return nil
		}
		if w, ok := out.(*[]byte); ok {
			*w = b
			return nil
		}
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s: %s: %w", who, path, err)
		}
		return nil
	}
}

func (a *Agents) do(ctx context.Context, url string, body []byte, token string) (int, string, []byte, error) {
	method, rd := http.MethodGet, io.Reader(nil)
	if body != nil {
		method, rd = http.MethodPost, bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, "", nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := agentClient.Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return 0, "", nil, err
	}
	return resp.StatusCode, resp.Status, b, nil
}

func (a *Agents) cachedToken() (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.bearer, a.fetched
}

// fetchToken asks the token source once; later calls get its answer.
func (a *Agents) fetchToken(ctx context.Context) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.fetched {
		a.bearer, a.fetch = a.token(ctx)
		a.fetched = true
	}
	return a.bearer, a.fetch
}
