package main

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// RunClock is the module keeping time itself: expiries happen when nobody calls. It sleeps
// until the next limit runs out (Store.NextDue) and looks again after every change it hears of
// (the bell), so while no limit is near it costs nothing. It returns when ctx ends, or when a
// newer process on the same store has taken the clocks (the old child of an upgrade).
func (d *Desk) RunClock(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		bell := d.currentBell() // before looking: a change after the look wakes the sleep below
		wait, ok := d.nextWait(ctx)
		if !ok {
			return
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-bell:
		case <-timer.C:
		}
		if !timer.Stop() {
			select { // drain a fire that raced the bell, so Reset starts clean
			case <-timer.C:
			default:
			}
		}
	}
}

// nextWait ticks when a limit has run out and says how long to sleep until the next one
// (an hour when none is pending: any change rings the bell first). ok is false when the clock
// must stop.
func (d *Desk) nextWait(ctx context.Context) (time.Duration, bool) {
	const idle, retry = time.Hour, time.Second
	for ctx.Err() == nil {
		due, err := d.store.NextDue(d.limits)
		if err != nil {
			slog.Error("the clock could not read the store; trying again in a second", "error", err)
			return retry, true
		}
		if due.IsZero() {
			return idle, true
		}
		if wait := due.Sub(d.now()); wait > 0 {
			return wait, true
		}
		n, err := d.Tick()
		switch {
		case errors.Is(err, errLostClock):
			slog.Info("a newer handoff process keeps the clocks of this store now; this one stops its clock", "epoch", d.epoch)
			return 0, false
		case err != nil:
			slog.Error("the clock could not update the store; trying again in a second", "error", err)
			return retry, true
		case n == 0:
			// Due but nothing changed here: another process changed those entries first. Their
			// change rings the bell once the poller sees it; until then look again shortly.
			return pollBusy, true
		}
	}
	return 0, false
}

// How often the store's change counter is read, to hear of another process's changes (the
// other child of an upgrade, a second process on the same file): pollIdle while nobody waits
// here (the clock's only need: an entry another process opened or claimed), pollBusy while a
// handoff.wait or handoff.watch is in flight. One indexed read of one row each time.
const (
	pollIdle = time.Second
	pollBusy = 50 * time.Millisecond
)

// PollStore reads the store's change counter and rings the bell when another process moved
// it, until ctx ends.
func (d *Desk) PollStore(ctx context.Context, idle time.Duration) {
	timer := time.NewTimer(idle)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-d.nudge:
			if !timer.Stop() {
				select { // a fire that raced the nudge
				case <-timer.C:
				default:
				}
			}
		}
		if seq, err := d.store.Seq(); err != nil {
			slog.Warn("could not read the store's change counter", "error", err)
		} else {
			d.saw(seq)
		}
		every := idle
		if d.listening() {
			every = min(idle, pollBusy)
		}
		timer.Reset(every)
	}
}

// pollEvery is the idle pace: a second, or a twentieth of the shorter limit when that is less
// (a test's limits of a second), and never below 20 ms.
func pollEvery(l Limits) time.Duration {
	return max(20*time.Millisecond, min(min(l.Unanswered, l.Claim)/20, pollIdle))
}
