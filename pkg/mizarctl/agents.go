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
	"time"
)

// Agents says where each droplet's node agent serves its health address
// (--health-addr: /metrics, /drops, /trace): droplet name -> base URL.
// mizarctl asks agents there for what only they know (drop events,
// traces through their programs); the API answers the rest.
type Agents map[string]string

// ParseAgents reads "droplet=URL" pairs (a URL without a scheme is http).
func ParseAgents(pairs []string) (Agents, error) {
	a := Agents{}
	for _, p := range pairs {
		name, url, ok := strings.Cut(p, "=")
		if !ok || name == "" || url == "" {
			return nil, fmt.Errorf("--agent %q: want droplet=URL", p)
		}
		if !strings.Contains(url, "://") {
			url = "http://" + url
		}
		a[name] = strings.TrimSuffix(url, "/")
	}
	return a, nil
}

// Names are the droplets with an agent address, sorted.
func (a Agents) Names() []string {
	names := make([]string, 0, len(a))
	for n := range a {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

var agentClient = &http.Client{Timeout: 30 * time.Second}

// call asks droplet's agent (GET without a body, else POST) and decodes
// the JSON answer into out.
func (a Agents) call(ctx context.Context, droplet, path string, body []byte, out any) error {
	base, ok := a[droplet]
	if !ok {
		return fmt.Errorf("no address for the agent of droplet %s: pass --agent %s=<its --health-addr>", droplet, droplet)
	}
	method, rd := http.MethodGet, io.Reader(nil)
	if body != nil {
		method, rd = http.MethodPost, bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return err
	}
	resp, err := agentClient.Do(req)
	if err != nil {
		return fmt.Errorf("agent of %s: %w", droplet, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("agent of %s: %w", droplet, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("agent of %s: %s: %s", droplet, resp.Status, strings.TrimSpace(string(b)))
	}
	if out == nil {
		return nil
	}
	if w, ok := out.(*[]byte); ok {
		*w = b
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("agent of %s: %s: %w", droplet, path, err)
	}
	return nil
}
