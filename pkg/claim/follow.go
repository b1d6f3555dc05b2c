package claim

import (
	"context"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/klog/v2"
)

// Follow keeps the in-memory indexes of Next in step with claims written and
// released by anyone (another replica, Repair), until ctx ends. Without it an
// index knew only this server's own claims: a replica idle while another
// allocated N values tried each of them (one refused etcd transaction per
// value, ~4 ms each) before it found a free one. Start it before the server
// serves, so no index is loaded before the watch begins.
func (s *Store) Follow(ctx context.Context) {
	rev := int64(0)
	for ctx.Err() == nil {
		opts := []clientv3.OpOption{clientv3.WithPrefix()}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev+1))
		}
		for resp := range s.client.Watch(clientv3.WithRequireLeader(ctx), s.prefix, opts...) {
			if err := resp.Err(); err != nil {
				if resp.CompactRevision > 0 {
					// Events were lost: every index is read again when next used.
					klog.InfoS("Claims watch compacted; reloading allocation indexes", "revision", resp.CompactRevision)
					s.pools.unload()
					rev = 0
				}
				break
			}
			for _, ev := range resp.Events {
				key := string(ev.Kv.Key[len(s.prefix):])
				if ev.Type == mvccpb.DELETE {
					s.pools.released(key)
				} else {
					s.pools.taken(key)
				}
			}
			rev = resp.Header.Revision
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second): // etcd unreachable or leaderless: try again
		}
	}
}

// taken marks the value of key used in its range's index, if it is indexed here.
func (ps *pools) taken(key string) {
	p, v, ok := ps.lookup(key)
	if !ok {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.loaded {
		p.mark(v)
	}
}

// unload makes every index read its range again when next used.
func (ps *pools) unload() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, p := range ps.m {
		p.mu.Lock()
		p.loaded = false
		p.mu.Unlock()
	}
}
