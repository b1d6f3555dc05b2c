// Package nettest holds helpers for tests that move traffic between network
// namespaces.
package nettest

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// HashSink accepts one TCP connection inside a network namespace and hashes
// what it reads until EOF, so a sender can prove its bytes arrived intact.
type HashSink struct {
	ln  net.Listener
	sum chan string
}

// ListenHash listens on addr (host:port) in the network namespace at
// netnsPath; the connection it accepts must finish within deadline.
func ListenHash(netnsPath, addr string, deadline time.Duration) (*HashSink, error) {
	var ln net.Listener
	if err := ns.WithNetNSPath(netnsPath, func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp4", addr)
		return err
	}); err != nil {
		return nil, err
	}
	s := &HashSink{ln: ln, sum: make(chan string, 1)}
	go func() {
		c, err := ln.Accept()
		if err != nil {
			s.sum <- err.Error()
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(deadline))
		h := sha256.New()
		if _, err := io.Copy(h, c); err != nil {
			s.sum <- err.Error()
			return
		}
		s.sum <- hex.EncodeToString(h.Sum(nil))
	}()
	return s, nil
}

// Sum waits for the connection to end and returns the hex SHA-256 of what it
// carried, or the error that ended it.
func (s *HashSink) Sum() string { return <-s.sum }

// Close stops listening.
func (s *HashSink) Close() error { return s.ln.Close() }
