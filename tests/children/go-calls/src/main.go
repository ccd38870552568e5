// go-calls shows a test what the Go SDK hands a tool handler: who called, a cancel, progress.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	meshsdk "mesh.local/sdk/go"
)

// whoamiIn lets a caller claim to be anyone; the tool must ignore it.
type whoamiIn struct {
	Account string `json:"account,omitempty" jsonschema:"ignored: a claim, not an identity"`
	User    string `json:"user,omitempty" jsonschema:"ignored: a claim, not an identity"`
}

type whoamiOut struct {
	// any, not *meshsdk.Caller: its user and name may be null, which a string field's inferred
	// schema would refuse when the go-sdk checks the output.
	Caller any    `json:"caller" jsonschema:"the caller the node stamped, or null"`
	ID     string `json:"id" jsonschema:"the caller's stable key, or empty"`
}

func whoami(ctx context.Context, _ whoamiIn) (string, whoamiOut, error) {
	c := meshsdk.CallerFrom(ctx)
	if c == nil {
		return "no caller", whoamiOut{}, nil
	}
	return c.ID(), whoamiOut{Caller: c, ID: c.ID()}, nil
}

type waitIn struct {
	Tag string `json:"tag" jsonschema:"names the marker file written when the call is cancelled"`
}

// wait blocks until the call is cancelled, then leaves a marker in the data folder so the test
// can see that the cancel reached the handler even though no reply is sent.
func wait(dataDir string) meshsdk.Handler[waitIn, any] {
	return func(ctx context.Context, in waitIn) (string, any, error) {
		select {
		case <-ctx.Done():
			marker := filepath.Join(dataDir, "cancelled-"+filepath.Base(in.Tag))
			if err := os.WriteFile(marker, []byte(ctx.Err().Error()), 0o600); err != nil {
				slog.Error("cannot write the cancel marker", "error", err)
			}
			return "", nil, ctx.Err()
		case <-time.After(30 * time.Second):
			return "not cancelled", nil, nil
		}
	}
}

type countIn struct {
	N int `json:"n" jsonschema:"how many steps, each reported as progress"`
}

func count(ctx context.Context, in countIn) (string, any, error) {
	for i := 1; i <= in.N; i++ {
		if err := meshsdk.Progress(ctx, float64(i), float64(in.N), fmt.Sprintf("step %d of %d", i, in.N)); err != nil {
			return "", nil, err
		}
	}
	return fmt.Sprintf("counted to %d", in.N), nil, nil
}

func main() {
	server := meshsdk.NewServer("go-calls", "0.1.0")
	env, err := meshsdk.Facts()
	if err != nil {
		slog.Error("needs the MESH_* facts", "error", err)
		os.Exit(2)
	}
	meshsdk.AddTool(server, "whoami", "Who called, as the node stamped it.", whoami)
	meshsdk.AddTool(server, "wait", "Waits until cancelled.", wait(env.DataDir))
	meshsdk.AddTool(server, "count", "Counts, reporting each step as progress.", count)
	if err := meshsdk.Serve(context.Background(), server); err != nil {
		slog.Error("stdio session failed", "error", err)
		os.Exit(1)
	}
}
