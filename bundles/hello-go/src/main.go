// hello-go is the mesh's Go tools bundle skeleton: a module tool and a seat verb over stdio.
package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	meshsdk "mesh.local/sdk/go"
)

type greetIn struct {
	Name string `json:"name" jsonschema:"who to greet"`
}

type greetOut struct {
	Greeting string `json:"greeting" jsonschema:"the greeting"`
}

type nowOut struct {
	Now string `json:"now" jsonschema:"the current UTC time, RFC 3339"`
}

func greet(_ context.Context, in greetIn) (string, greetOut, error) {
	text := "Hello, " + in.Name + "! (go)"
	return text, greetOut{Greeting: text}, nil
}

func now(context.Context, struct{}) (string, nowOut, error) {
	t := time.Now().UTC().Format(time.RFC3339)
	return t, nowOut{Now: t}, nil
}

func main() {
	server := meshsdk.NewServer("hello-go", "0.1.0")
	// The facts are not needed by these tools; reading them shows the runtime's wiring in the log
	// and creates the module's data folder.
	if env, err := meshsdk.Facts(); err != nil {
		slog.Warn("running without the node's runtime", "error", err)
	} else {
		slog.Info("hello-go starting", "node", env.Node, "module", env.Module, "bundle", env.Bundle, "data", env.DataDir)
	}
	meshsdk.AddTool(server, "greet", "Greets someone by name.", greet)
	meshsdk.AddTool(server, meshsdk.SeatVerb("clock", "now"), "The current UTC time (RFC 3339).", now)

	// SIGTERM from the runtime's stop ends the session the same way as closing stdin.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := meshsdk.Serve(ctx, server); err != nil && ctx.Err() == nil {
		slog.Error("stdio session failed", "error", err)
		os.Exit(1)
	}
}
