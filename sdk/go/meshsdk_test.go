package meshsdk

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func TestSeatVerb(t *testing.T) {
	if got := SeatVerb("clock", "now"); got != "clock.now" {
		t.Fatalf("SeatVerb = %q", got)
	}
	for _, bad := range [][2]string{{"Clock", "now"}, {"clock", "n.w"}, {"", "now"}, {"clock", ""}, {"9lives", "x"}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("SeatVerb(%q, %q) did not panic", bad[0], bad[1])
				}
			}()
			SeatVerb(bad[0], bad[1])
		}()
	}
}

func TestCheckToolName(t *testing.T) {
	for _, ok := range []string{"greet", "get_thing", "x-1", "memory.get", "clock.now_utc"} {
		if err := CheckToolName(ok); err != nil {
			t.Errorf("CheckToolName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a.b.c", "Memory.get", "has space", "memory.", strings.Repeat("x", 129)} {
		if CheckToolName(bad) == nil {
			t.Errorf("CheckToolName(%q) accepted it", bad)
		}
	}
}

func TestFacts(t *testing.T) {
	data := filepath.Join(t.TempDir(), "not", "yet")
	for k, v := range map[string]string{
		"MESH_NODE": "n1", "MESH_MODULE": "m", "MESH_BUNDLE": "tools", "MESH_BUNDLE_DIR": "/b", "MESH_DATA_DIR": data,
	} {
		t.Setenv(k, v)
	}
	env, err := Facts()
	if err != nil {
		t.Fatal(err)
	}
	if env != (Env{"n1", "m", "tools", "/b", data}) {
		t.Fatalf("Facts = %+v", env)
	}
	if st, err := os.Stat(data); err != nil || !st.IsDir() {
		t.Fatalf("data dir not created: %v", err)
	}

	t.Setenv("MESH_NODE", "")
	t.Setenv("MESH_DATA_DIR", "")
	_, err = Facts()
	if err == nil || !strings.Contains(err.Error(), "MESH_NODE, MESH_DATA_DIR not set") {
		t.Fatalf("Facts with missing variables: %v", err)
	}
}

type echoIn struct {
	Name string `json:"name" jsonschema:"who"`
}
type echoOut struct {
	Greeting string `json:"greeting"`
}

// connect runs server in memory and returns a client session on it.
func connect(t *testing.T, server *mcp.Server) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := server.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "0"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func TestAddToolTextStructuredAndError(t *testing.T) {
	server := NewServer("t", "0")
	AddTool(server, "echo", "echoes", func(_ context.Context, in echoIn) (string, echoOut, error) {
		if in.Name == "boom" {
			return "", echoOut{}, errors.New("no booms")
		}
		return "hi " + in.Name, echoOut{Greeting: "hi " + in.Name}, nil
	})
	cs := connect(t, server)
	ctx := context.Background()

	tools, err := cs.ListTools(ctx, nil)
	if err != nil || len(tools.Tools) != 1 {
		t.Fatalf("ListTools = %v, %v", tools, err)
	}
	schema, _ := json.Marshal(tools.Tools[0].InputSchema)
	if !strings.Contains(string(schema), `"required":["name"]`) {
		t.Fatalf("input schema %s does not require name", schema)
	}

	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"name": "ann"}})
	if err != nil || res.IsError {
		t.Fatalf("CallTool = %+v, %v", res, err)
	}
	if text := res.Content[0].(*mcp.TextContent).Text; text != "hi ann" {
		t.Fatalf("text = %q", text)
	}
	structured, _ := json.Marshal(res.StructuredContent)
	if string(structured) != `{"greeting":"hi ann"}` {
		t.Fatalf("structuredContent = %s", structured)
	}

	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"name": "boom"}})
	if err != nil || !res.IsError || res.Content[0].(*mcp.TextContent).Text != "no booms" {
		t.Fatalf("failing tool gave %+v, %v", res, err)
	}

	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{}})
	if err != nil || !res.IsError {
		t.Fatalf("missing required argument gave %+v, %v", res, err)
	}
}

// A slow call must not hold up a fast one on the same session: the go-sdk runs each
// tools/call in its own goroutine, and this SDK must not undo that.
func TestSlowToolDoesNotBlockOthers(t *testing.T) {
	server := NewServer("t", "0")
	release := make(chan struct{})
	AddTool(server, "slow", "waits", func(ctx context.Context, _ struct{}) (string, any, error) {
		select {
		case <-release:
			return "slow done", nil, nil
		case <-ctx.Done():
			return "", nil, ctx.Err()
		}
	})
	AddTool(server, "fast", "answers", func(context.Context, struct{}) (string, any, error) {
		return "fast done", nil, nil
	})
	cs := connect(t, server)
	ctx := context.Background()

	slow := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{}})
		slow <- err
	}()
	deadline, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for range 5 {
		res, err := cs.CallTool(deadline, &mcp.CallToolParams{Name: "fast", Arguments: map[string]any{}})
		if err != nil || res.Content[0].(*mcp.TextContent).Text != "fast done" {
			t.Fatalf("fast call while slow in flight: %+v, %v", res, err)
		}
	}
	close(release)
	if err := <-slow; err != nil {
		t.Fatalf("slow call: %v", err)
	}
}

func TestAddToolRefusesBadName(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "a.b.c") {
			t.Fatalf("recover() = %v", r)
		}
	}()
	AddTool(NewServer("t", "0"), "a.b.c", "", func(context.Context, struct{}) (string, any, error) { return "", nil, nil })
}
