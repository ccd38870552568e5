// handoff is the mesh's agent handoff seat (seed 002, issues 13 and 25): an agent that is stuck
// opens an entry, another finds it (polling handoff.list, or handoff.watch), claims it and
// answers. The module keeps the contract's counters and clocks itself; the owner and the opener
// are the caller the node stamped on the call, never an argument.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	meshsdk "mesh.local/sdk/go"
)

func main() {
	os.Exit(run())
}

func run() int {
	env, err := meshsdk.Facts()
	logger := meshsdk.Logger()
	if err != nil {
		logger.Error("handoff needs the node's MESH_* facts (its store lives in MESH_DATA_DIR)", "error", err)
		return 2
	}
	limits, err := limitsFromEnv()
	if err != nil {
		logger.Error("bad limit", "error", err)
		return 2
	}
	humans, err := ParseHumans(os.Getenv("HANDOFF_HUMANS"))
	if err != nil {
		logger.Error("bad HANDOFF_HUMANS", "error", err)
		return 2
	}
	store, err := OpenStore(env.DataDir)
	if err != nil {
		logger.Error("cannot open the store", "error", err)
		return 1
	}
	defer store.Close()
	desk, err := NewDesk(store, time.Now, limits, humans)
	if err == nil {
		// This process keeps the clocks from now on; an older one on the same store stops its own.
		err = desk.TakeClock()
	}
	if err != nil {
		logger.Error("cannot read the store", "error", err)
		return 1
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	server := meshsdk.NewServer("handoff", "0.2.0")
	addVerbs(server, desk)
	var background sync.WaitGroup
	background.Go(func() { desk.RunClock(ctx) })
	background.Go(func() { desk.PollStore(ctx, pollEvery(limits)) })
	slog.Info("handoff serving", "store", env.DataDir, "unanswered", limits.Unanswered, "claim", limits.Claim, "humans", humans.String())
	err = meshsdk.Serve(ctx, server)
	signalled := ctx.Err() != nil
	// stdin closed (the node stops this child) or SIGTERM: the clock stops before the store closes.
	stop()
	background.Wait()
	if err != nil && !signalled {
		slog.Error("stdio session failed", "error", err)
		return 1
	}
	return 0
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
