package nodeagent

import (
	"context"
	"maps"
	"sync"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
)

// Recorder is an in-memory Dataplane that records what it was asked to program:
// the agent's tests and benchmarks run the real agent over it.
type Recorder struct {
	mu       sync.Mutex
	attached bool
	host     map[string]string            // endpoint key -> ip
	bouncers map[string]map[string]string // bouncer -> endpoint key -> ip
	dividers map[string]map[string]string // divider -> subnet -> cidr
	divEps   map[string]map[string]string // divider -> endpoint key -> ip
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder {
	return &Recorder{host: map[string]string{}, bouncers: map[string]map[string]string{}, dividers: map[string]map[string]string{}, divEps: map[string]map[string]string{}}
}

func (r *Recorder) do(f func()) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	f()
	return nil
}

// Attach implements Dataplane.
func (r *Recorder) Attach(context.Context) error { return r.do(func() { r.attached = true }) }

// SetHostEndpoint implements Dataplane.
func (r *Recorder) SetHostEndpoint(ep *v1alpha1.Endpoint) error {
	return r.do(func() { r.host[ep.Namespace+"/"+ep.Name] = ep.Spec.IP })
}

// DeleteHostEndpoint implements Dataplane.
func (r *Recorder) DeleteHostEndpoint(key string) error { return r.do(func() { delete(r.host, key) }) }

// SetBouncer implements Dataplane.
func (r *Recorder) SetBouncer(b *v1alpha1.Bouncer) error {
	return r.do(func() {
		if r.bouncers[b.Name] == nil {
			r.bouncers[b.Name] = map[string]string{}
		}
	})
}

// DeleteBouncer implements Dataplane.
func (r *Recorder) DeleteBouncer(name string) error { return r.do(func() { delete(r.bouncers, name) }) }

// SetBouncerEndpoint implements Dataplane.
func (r *Recorder) SetBouncerEndpoint(bouncer string, ep *v1alpha1.Endpoint) error {
	return r.do(func() {
		if m := r.bouncers[bouncer]; m != nil {
			m[ep.Namespace+"/"+ep.Name] = ep.Spec.IP
		}
	})
}

// DeleteBouncerEndpoint implements Dataplane.
func (r *Recorder) DeleteBouncerEndpoint(bouncer, key string) error {
	return r.do(func() { delete(r.bouncers[bouncer], key) })
}

// SetDivider implements Dataplane.
func (r *Recorder) SetDivider(d *v1alpha1.Divider) error {
	return r.do(func() {
		if r.dividers[d.Name] == nil {
			r.dividers[d.Name] = map[string]string{}
			r.divEps[d.Name] = map[string]string{}
		}
	})
}

// DeleteDivider implements Dataplane.
func (r *Recorder) DeleteDivider(name string) error {
	return r.do(func() { delete(r.dividers, name); delete(r.divEps, name) })
}

// SetDividerEndpoint implements Dataplane.
func (r *Recorder) SetDividerEndpoint(divider string, ep *v1alpha1.Endpoint) error {
	return r.do(func() {
		if m := r.divEps[divider]; m != nil {
			m[ep.Namespace+"/"+ep.Name] = ep.Spec.IP
		}
	})
}

// DeleteDividerEndpoint implements Dataplane.
func (r *Recorder) DeleteDividerEndpoint(divider, key string) error {
	return r.do(func() { delete(r.divEps[divider], key) })
}

// SetDividerSubnet implements Dataplane.
func (r *Recorder) SetDividerSubnet(divider string, s *v1alpha1.Subnet) error {
	return r.do(func() {
		if m := r.dividers[divider]; m != nil {
			m[s.Name] = s.Spec.CIDR
		}
	})
}

// DeleteDividerSubnet implements Dataplane.
func (r *Recorder) DeleteDividerSubnet(divider, subnet string) error {
	return r.do(func() { delete(r.dividers[divider], subnet) })
}

// Attached reports whether Attach was called.
func (r *Recorder) Attached() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attached
}

// HostEndpoints returns the hosted endpoints: key -> ip.
func (r *Recorder) HostEndpoints() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.host)
}

// Bouncers returns the bouncers served here and their endpoints: key -> ip.
func (r *Recorder) Bouncers() map[string]map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]map[string]string{}
	for k, v := range r.bouncers {
		out[k] = maps.Clone(v)
	}
	return out
}

// Dividers returns the dividers served here and their subnets: name -> cidr.
func (r *Recorder) Dividers() map[string]map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]map[string]string{}
	for k, v := range r.dividers {
		out[k] = maps.Clone(v)
	}
	return out
}

// DividerEndpoints returns the dividers served here and their endpoints: key -> ip.
func (r *Recorder) DividerEndpoints() map[string]map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]map[string]string{}
	for k, v := range r.divEps {
		out[k] = maps.Clone(v)
	}
	return out
}
