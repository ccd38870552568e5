package main

// handoff.wait, the opener's wait lease that makes an entry blocking, and the bell that wakes
// every wait, watch and the clock when this process or another changes the store.

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// Wait returns the entry when it changes, when it is settled, or after timeout; changed says
// which. While the opener waits, the entry's priority is blocking (stored, so every process
// and a listing see it). An escalated entry is not settled until a human decides it: the
// opener's wait on it returns with the decision. ctx ending (the caller cancelled) ends the
// wait with ctx's error.
func (d *Desk) Wait(ctx context.Context, who Who, id string, timeout time.Duration) (*Entry, bool, error) {
	num, err := parseID(id)
	if err != nil {
		return nil, false, err
	}
	e, err := d.load(num)
	if err != nil {
		return nil, false, err
	}
	start := e.Version
	d.listen(1)
	defer d.listen(-1)
	if who.ID != "" && who.ID == e.Opener && !e.settled() {
		d.beginWait(num, timeout)
		defer d.endWait(num)
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		bell := d.currentBell() // before the read: a change after it rings this bell
		e, err := d.store.loadBounded(num)
		switch {
		case err != nil:
			return nil, false, err
		case e == nil:
			return nil, false, fmt.Errorf("entry %s is gone from the store", id)
		case e.Version != start:
			v, err := d.view(e, true)
			return v, true, err
		case e.settled():
			v, err := d.view(e, true)
			return v, false, err
		}
		select {
		case <-bell:
		case <-timer.C:
			v, err := d.view(e, true)
			return v, false, err
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
}

func (d *Desk) beginWait(num int64, timeout time.Duration) {
	d.waitMu.Lock()
	defer d.waitMu.Unlock()
	lease := d.waits[num]
	if lease == nil {
		lease = &waitLease{}
		d.waits[num] = lease
	}
	lease.count++
	if until := d.now().Add(timeout); until.After(lease.until) {
		seq, err := d.store.SetBlocking(num, until, nil)
		if err != nil {
			slog.Warn("could not store the entry as blocking", "id", entryID(num), "error", err)
			return
		}
		lease.until = until
		d.wrote(seq)
	}
}

func (d *Desk) endWait(num int64) {
	d.waitMu.Lock()
	defer d.waitMu.Unlock()
	lease := d.waits[num]
	if lease.count--; lease.count > 0 {
		return
	}
	delete(d.waits, num)
	// Clear only our own lease: a wait in another process may have stored a later one.
	seq, err := d.store.SetBlocking(num, time.Time{}, &lease.until)
	if err != nil {
		slog.Warn("could not store the entry as background", "id", entryID(num), "error", err)
		return
	}
	d.wrote(seq)
}

// --- the bell: who is told of a change ----------------------------------------------------

func (d *Desk) currentBell() chan struct{} {
	d.sig.Lock()
	defer d.sig.Unlock()
	return d.bell
}

// wrote records a change this process made (its change number) and rings.
func (d *Desk) wrote(seq int64) {
	d.sig.Lock()
	defer d.sig.Unlock()
	d.seen = max(d.seen, seq)
	d.ringLocked()
}

// saw is the store poller's finding: rings when the store moved past what this process knows.
func (d *Desk) saw(seq int64) bool {
	d.sig.Lock()
	defer d.sig.Unlock()
	if seq <= d.seen { // a read from before this process's own last write is no news
		return false
	}
	d.seen = seq
	d.ringLocked()
	return true
}

func (d *Desk) ringLocked() {
	close(d.bell)
	d.bell = make(chan struct{})
}

func (d *Desk) listen(delta int) {
	d.sig.Lock()
	d.listeners += delta
	d.sig.Unlock()
	if delta > 0 {
		select {
		case d.nudge <- struct{}{}:
		default:
		}
	}
}

func (d *Desk) listening() bool {
	d.sig.Lock()
	defer d.sig.Unlock()
	return d.listeners > 0
}
