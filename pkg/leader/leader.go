// Package leader runs work in one replica at a time: replicas campaign in an
// election on mizar's own etcd (mizar-apiserver serves no Lease kind), and a
// replica that loses its etcd session stops acting before another takes over.
// The networking operators and the broker's fulfillment operator each elect
// their own leader under their own key.
package leader

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/klog/v2"
)

// Options configure one replica's campaign.
type Options struct {
	// Etcd is mizar's own etcd, where the election runs.
	Etcd *clientv3.Client
	// Key is the etcd prefix the replicas campaign under.
	Key string
	// Name says what is led, in logs (e.g. "Operators").
	Name string
	// Identity names this replica in the election; defaults to NewIdentity().
	Identity string
	// LeaseTTL is how long a silent leader keeps leadership, in seconds; default 5.
	LeaseTTL int
	// OnLeading, if set, is told when this replica starts and stops leading.
	OnLeading func(leading bool)
}

// NewIdentity is the host name and a random suffix.
func NewIdentity() string {
	host, _ := os.Hostname()
	return host + "-" + utilrand.String(6)
}

// Run campaigns until ctx ends and runs work while leading. work must return
// once its context ends; every request it makes should carry that context, so
// acting stops the moment leadership does.
func Run(ctx context.Context, o Options, work func(context.Context) error) error {
	if o.Etcd == nil || o.Key == "" {
		return errors.New("leader: an etcd client and an election key are required")
	}
	if o.Identity == "" {
		o.Identity = NewIdentity()
	}
	if o.LeaseTTL == 0 {
		o.LeaseTTL = 5
	}
	if o.Name == "" {
		o.Name = o.Key
	}
	for ctx.Err() == nil {
		if err := lead(ctx, o, work); err != nil && ctx.Err() == nil {
			klog.ErrorS(err, o.Name+": leadership ended; campaigning again", "identity", o.Identity)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	return nil
}

// lead waits to be elected, then runs work until leadership or ctx ends.
func lead(ctx context.Context, o Options, work func(context.Context) error) error {
	session, err := concurrency.NewSession(o.Etcd, concurrency.WithTTL(o.LeaseTTL), concurrency.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("etcd session: %w", err)
	}
	defer session.Close() // revokes the lease: a clean stop hands over at once
	election := concurrency.NewElection(session, o.Key)
	if err := election.Campaign(ctx, o.Identity); err != nil {
		return fmt.Errorf("campaigning: %w", err)
	}
	klog.InfoS(o.Name+": elected leader", "identity", o.Identity)
	leadCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-session.Done(): // lease lost: another replica may lead now
			klog.InfoS(o.Name+": etcd session lost; stopping", "identity", o.Identity)
			cancel()
		case <-leadCtx.Done():
		}
	}()
	if o.OnLeading != nil {
		o.OnLeading(true)
	}
	// Acting stops the moment leadCtx ends: every request work makes carries
	// it. Waiting for its goroutines to wind down comes after.
	stopped := make(chan struct{})
	go func() {
		<-leadCtx.Done()
		if o.OnLeading != nil {
			o.OnLeading(false)
		}
		close(stopped)
	}()
	err = work(leadCtx)
	cancel()
	<-stopped
	resignCtx, done := context.WithTimeout(context.Background(), 2*time.Second)
	defer done()
	_ = election.Resign(resignCtx)
	return err
}
