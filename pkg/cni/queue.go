package cni

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// DefaultDeleteQueue is where the plugin leaves DELs while the agent is down.
const DefaultDeleteQueue = "/var/run/mizar/delete-queue"

// maxQueued bounds the queue: a node whose agent stays down must not fill
// its disk with deletes (Cilium caps its queue the same way).
const maxQueued = 256

const queueSuffix = ".delete"

// Enqueue stores a DEL for the agent to carry out when it starts. One file per
// (container, interface): a repeated DEL replaces the earlier one.
func Enqueue(dir string, req *Request) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create the delete queue %s: %w", dir, err)
	}
	sum := sha256.Sum256([]byte(req.ContainerID + "/" + req.IfName))
	name := filepath.Join(dir, hex.EncodeToString(sum[:])+queueSuffix)
	if _, err := os.Stat(name); errors.Is(err, os.ErrNotExist) {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("read the delete queue %s: %w", dir, err)
		}
		if len(entries) >= maxQueued {
			return fmt.Errorf("the delete queue %s is full (%d entries): start mizar-nodeagent to drain it", dir, maxQueued)
		}
	}
	data, err := json.Marshal(req)
	if err != nil {
		return err
	}
	// Written whole then renamed: the agent never reads half a request.
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("queue a delete: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("queue a delete: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("queue a delete: %w", err)
	}
	if err := os.Rename(tmp.Name(), name); err != nil {
		return fmt.Errorf("queue a delete: %w", err)
	}
	return nil
}

// Drain hands every queued DEL to del, removing those it carried out. It
// returns the errors of the others, which stay queued for the next start.
func Drain(dir string, del func(*Request) error) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the delete queue %s: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), queueSuffix) {
			continue
		}
		name := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(name)
		if err != nil {
			errs = append(errs, fmt.Errorf("read queued delete %s: %w", name, err))
			continue
		}
		var req Request
		if err := json.Unmarshal(data, &req); err != nil {
			// Undecodable: nothing can ever carry it out.
			errs = append(errs, fmt.Errorf("queued delete %s is corrupt, dropped: %w", name, err))
			os.Remove(name)
			continue
		}
		req.Command = CmdDel
		if err := del(&req); err != nil {
			errs = append(errs, fmt.Errorf("queued delete of %s/%s: %w", req.ContainerID, req.IfName, err))
			continue
		}
		if err := os.Remove(name); err != nil {
			errs = append(errs, fmt.Errorf("remove queued delete %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
