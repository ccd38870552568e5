// go-calls is the Go SDK's fixture bundle for tests/support/call_contract.py: what the SDK hands
// a tool handler about its call (the caller from _meta, a cancel, progress, an elicitation), one
// tool for each.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	meshsdk "mesh.local/sdk/go"
)

// whoamiIn lets a caller claim to be anyone; the tool must ignore it.
type whoamiIn struct {
	Caller  any    `json:"caller,omitempty" jsonschema:"ignored: a claim, not an identity"`
	Account string `json:"account,omitempty" jsonschema:"ignored: a claim, not an identity"`
	User    string `json:"user,omitempty" jsonschema:"ignored: a claim, not an identity"`
}

type whoamiOut struct {
	// any, not *meshsdk.Caller: user and name may be null, which a string field's inferred
	// schema would refuse when the go-sdk checks the output.
	Caller any `json:"caller" jsonschema:"the caller the node stamped (with its id), or null"`
}

func whoami(ctx context.Context, _ whoamiIn) (string, whoamiOut, error) {
	c := meshsdk.CallerFrom(ctx)
	if c == nil {
		return "no caller", whoamiOut{}, nil
	}
	var person any // null unless a delegate named one
	if c.Person != nil {
		person = map[string]any{"iss": c.Person.Iss, "sub": c.Person.Sub, "name": c.Person.Name}
	}
	seen := map[string]any{"account": c.Account, "user": nullable(c.User), "name": nullable(c.Name), "via": c.Via, "id": c.ID(), "person": person}
	return c.ID(), whoamiOut{Caller: seen}, nil
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

type waitIn struct {
	Marker string `json:"marker" jsonschema:"a file: \"started\" is written to it, then \"cancelled\" once the call is cancelled"`
}

// waitCancel blocks until its call is cancelled and says so in the marker file: the reply that
// follows must never be sent, so the file is how a test sees that the cancel arrived.
func waitCancel(ctx context.Context, in waitIn) (string, any, error) {
	if err := os.WriteFile(in.Marker, []byte("started\n"), 0o600); err != nil {
		return "", nil, err
	}
	select {
	case <-ctx.Done():
		f, err := os.OpenFile(in.Marker, os.O_APPEND|os.O_WRONLY, 0)
		if err == nil {
			_, err = f.WriteString("cancelled\n")
			f.Close()
		}
		if err != nil {
			slog.Error("cannot write the cancel marker", "error", err)
		}
		return "", nil, ctx.Err()
	case <-time.After(30 * time.Second):
		return "not cancelled", nil, nil
	}
}

type countIn struct {
	Steps int `json:"steps" jsonschema:"how many steps, each reported as progress"`
}

func count(ctx context.Context, in countIn) (string, any, error) {
	for i := 1; i <= in.Steps; i++ {
		if err := meshsdk.Progress(ctx, float64(i), float64(in.Steps), fmt.Sprintf("step %d", i)); err != nil {
			return "", nil, err
		}
	}
	return fmt.Sprintf("counted %d", in.Steps), nil, nil
}

type confirmIn struct {
	Question string `json:"question" jsonschema:"what to ask the caller"`
}

// confirmSchema is the form: one required boolean.
var confirmSchema = map[string]any{
	"type":       "object",
	"properties": map[string]any{"ok": map[string]any{"type": "boolean"}},
	"required":   []string{"ok"},
}

// confirm asks the caller (an elicitation across the mesh), then says what they answered.
func confirm(ctx context.Context, in confirmIn) (string, any, error) {
	answer, err := meshsdk.Elicit(ctx, in.Question, confirmSchema)
	if err != nil {
		return "", nil, fmt.Errorf("could not ask: %w", err) // an isError result naming the error
	}
	switch answer.Action {
	case "accept":
		return fmt.Sprintf("ok=%t", answer.Content["ok"] == true), nil, nil
	case "decline":
		return "declined", nil, nil
	}
	return "cancelled", nil, nil
}

func main() {
	server := meshsdk.NewServer("go-calls", "0.1.0")
	meshsdk.AddTool(server, "whoami", "Who called, as the node stamped it.", whoami)
	meshsdk.AddTool(server, "wait_cancel", "Waits until cancelled.", waitCancel)
	meshsdk.AddTool(server, "count", "Counts, reporting each step as progress.", count)
	meshsdk.AddTool(server, "confirm", "Asks the caller a yes/no question.", confirm)
	if err := meshsdk.Serve(context.Background(), server); err != nil {
		slog.Error("stdio session failed", "error", err)
		os.Exit(1)
	}
}
