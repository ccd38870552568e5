// handoff is the mesh's agent handoff seat (seed 002, issue 13): an agent that is stuck opens an
// entry, another finds it by polling handoff.list, claims it and answers. The module keeps the
// contract's counters and clocks itself; the owner and the opener are the caller the node
// stamped on the call, never an argument.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	meshsdk "mesh.local/sdk/go"
)

func main() {
	env, err := meshsdk.Facts()
	logger := meshsdk.Logger()
	if err != nil {
		logger.Error("handoff needs the node's MESH_* facts (its store lives in MESH_DATA_DIR)", "error", err)
		os.Exit(2)
	}
	limits, err := limitsFromEnv()
	if err != nil {
		logger.Error("bad limit", "error", err)
		os.Exit(2)
	}
	store, err := OpenStore(env.DataDir)
	if err != nil {
		logger.Error("cannot open the store", "error", err)
		os.Exit(1)
	}
	defer store.Close()
	desk := NewDesk(store, time.Now, limits)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go runClock(ctx, desk, tickEvery(limits))

	server := meshsdk.NewServer("handoff", "0.1.0")
	addVerbs(server, desk)
	slog.Info("handoff serving", "store", env.DataDir, "unanswered", limits.Unanswered, "claim", limits.Claim)
	if err := meshsdk.Serve(ctx, server); err != nil && ctx.Err() == nil {
		slog.Error("stdio session failed", "error", err)
		os.Exit(1)
	}
}

// limitsFromEnv reads HANDOFF_UNANSWERED_S and HANDOFF_CLAIM_S (seconds, fractions allowed so
// tests can use short clocks); unset means the contract's 30 and 10 minutes.
func limitsFromEnv() (Limits, error) {
	unanswered, err := seconds("HANDOFF_UNANSWERED_S", 1800)
	if err != nil {
		return Limits{}, err
	}
	claim, err := seconds("HANDOFF_CLAIM_S", 600)
	return Limits{Unanswered: unanswered, Claim: claim}, err
}

func seconds(name string, fallback float64) (time.Duration, error) {
	raw := os.Getenv(name)
	if raw == "" {
		return time.Duration(fallback * float64(time.Second)), nil
	}
	v, err := strconv.ParseFloat(raw, 64)
	if err != nil || v <= 0 || v > 365*24*3600 {
		return 0, fmt.Errorf("%s=%q: give a number of seconds above 0 and at most a year, e.g. %s=%g", name, raw, name, fallback)
	}
	return time.Duration(v * float64(time.Second)), nil
}

// tickEvery looks at the clocks often enough that an expiry is late by at most a twentieth of
// the shortest limit, and at most a second.
func tickEvery(l Limits) time.Duration {
	every := min(l.Unanswered, l.Claim) / 20
	return max(20*time.Millisecond, min(every, time.Second))
}

// runClock is the module keeping time itself: expiries happen when nobody calls.
func runClock(ctx context.Context, desk *Desk, every time.Duration) {
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			if _, err := desk.Tick(); err != nil {
				slog.Error("the clock could not update the store", "error", err)
			}
		}
	}
}
