package meshsdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
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

func TestParseCaller(t *testing.T) {
	c, err := ParseCaller(map[string]any{CallerMetaKey: map[string]any{"account": "ALICE", "user": "alice", "name": "a-client", "via": "bus"}})
	if err != nil || *c != (Caller{"ALICE", "alice", "a-client", "bus", nil}) || c.ID() != "ALICE/alice" {
		t.Fatalf("ParseCaller = %+v, %v", c, err)
	}
	c, err = ParseCaller(map[string]any{CallerMetaKey: map[string]any{"account": "BOB", "user": nil, "name": nil, "via": "local"}})
	if err != nil || c.ID() != "local:BOB" {
		t.Fatalf("ParseCaller without user = %+v, %v", c, err)
	}
	if wire, _ := json.Marshal(c); string(wire) != `{"account":"BOB","user":null,"name":null,"via":"local"}` {
		t.Fatalf("wire form %s", wire)
	}
	for _, absent := range []map[string]any{nil, {}, {"progressToken": 1}} {
		if c, err := ParseCaller(absent); c != nil || err != nil {
			t.Errorf("ParseCaller(%v) = %+v, %v; want nil, nil", absent, c, err)
		}
	}
	longest := strings.Repeat("x", MaxCallerFieldBytes)
	if c, err := ParseCaller(map[string]any{CallerMetaKey: map[string]any{"account": longest, "user": longest, "name": longest, "via": "mcp"}}); err != nil || c.ID() != longest+"/"+longest {
		t.Fatalf("the longest caller: %+v, %v", c, err)
	}
	if c, err := ParseCaller(map[string]any{CallerMetaKey: map[string]any{"account": "BOB", "via": "bus"}}); err != nil || c.ID() != "BOB" {
		t.Fatalf("a caller without user and name keys: %+v, %v", c, err)
	}
	// One id per caller: names escaped, the local caller and a person apart from every bus caller.
	person := &Person{"https://idp.example/", "alice", "Alice"}
	for _, tc := range []struct {
		c    Caller
		want string
	}{
		{Caller{Account: "a", User: "b/c", Via: "bus"}, "a/b%2Fc"},
		{Caller{Account: "a/b", User: "c", Via: "bus"}, "a%2Fb/c"},
		{Caller{Account: "local:ops", Via: "bus"}, "local%3Aops"},
		{Caller{Account: "ops", Via: "local"}, "local:ops"},
		{Caller{Account: "faces", User: "mesh-mcp", Via: "mcp", Person: person}, "person:https%3A%2F%2Fidp.example%2F/alice"},
	} {
		if got := tc.c.ID(); got != tc.want {
			t.Errorf("%+v.ID() = %q, want %q", tc.c, got, tc.want)
		}
	}
	withPerson := map[string]any{"account": "faces", "user": "f", "name": nil, "via": "console", "person": map[string]any{"iss": "i", "sub": "s", "name": "n"}}
	if c, err := ParseCaller(map[string]any{CallerMetaKey: withPerson}); err != nil || c.Person == nil || *c.Person != (Person{"i", "s", "n"}) || c.ID() != "person:i/s" {
		t.Fatalf("a delegate's caller with a person: %+v, %v", c, err)
	}
	malformed := []any{
		nil, "ALICE", 7, []any{"ALICE"}, map[string]any{},
		map[string]any{"user": "alice", "via": "bus"},
		map[string]any{"account": "", "via": "bus"},
		map[string]any{"account": 3, "via": "bus"},
		map[string]any{"account": "A", "via": "bus", "person": map[string]any{"iss": "i", "sub": "s", "name": "n"}},
		map[string]any{"account": "A", "via": "mcp", "person": map[string]any{"iss": "i", "sub": "s"}},
		map[string]any{"account": "A", "via": "mcp", "person": "alice"},
		map[string]any{"account": "A", "user": 5, "via": "bus"},
		map[string]any{"account": "A", "user": "", "via": "bus"},
		map[string]any{"account": "A", "user": longest + "x", "via": "bus"},
		map[string]any{"account": "A", "name": "line\nbreak", "via": "bus"},
		map[string]any{"account": "A", "name": map[string]any{}, "via": "bus"},
		map[string]any{"account": "A", "via": "carrier-pigeon"},
		map[string]any{"account": "A"},
	}
	for _, bad := range malformed {
		c, err := ParseCaller(map[string]any{CallerMetaKey: bad})
		if c != nil || err == nil || !strings.Contains(err.Error(), "mesh/caller is malformed") {
			t.Errorf("ParseCaller(%#v) = %+v, %v; want nil and an error saying what is wrong", bad, c, err)
		}
	}
}

// servePipes runs server (through the SDK's cancel-aware transport, as Serve does) on a pair of
// pipes until the test or benchmark ends: it returns the end requests are written to and the
// end answers are read from.
func servePipes(tb testing.TB, server *mcp.Server) (io.WriteCloser, io.Reader) {
	tb.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = server.Run(ctx, cancelAware{&mcp.IOTransport{Reader: inR, Writer: outW}})
	}()
	tb.Cleanup(func() { inW.Close(); cancel(); <-done })
	return inW, outR
}

// rawSession serves server (through the SDK's cancel-aware transport, as Serve does) on a
// pipe and returns a writer of raw JSON-RPC lines and a reader that fails after a timeout.
func rawSession(t *testing.T, server *mcp.Server) (send func(string), next func(time.Duration) map[string]any) {
	t.Helper()
	inW, outR := servePipes(t, server)
	lines := make(chan map[string]any, 64)
	go func() {
		dec := json.NewDecoder(outR)
		for {
			var m map[string]any
			if dec.Decode(&m) != nil {
				close(lines)
				return
			}
			lines <- m
		}
	}()
	send = func(line string) {
		if _, err := io.WriteString(inW, line+"\n"); err != nil {
			t.Fatalf("write %s: %v", line, err)
		}
	}
	next = func(wait time.Duration) map[string]any {
		select {
		case m, ok := <-lines:
			if !ok {
				t.Fatal("server closed its output")
			}
			return m
		case <-time.After(wait):
			return nil
		}
	}
	send(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}`)
	if m := next(5 * time.Second); m == nil || m["id"] != float64(0) {
		t.Fatalf("initialize reply %v", m)
	}
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return send, next
}

func TestCallerAndProgressReachTheHandler(t *testing.T) {
	server := NewServer("t", "0")
	// The arguments may name anyone; only _meta says who called.
	type claimIn struct {
		User string `json:"user,omitempty"`
	}
	AddTool(server, "whoami", "", func(ctx context.Context, _ claimIn) (string, any, error) {
		for i := 1; i <= 3; i++ {
			if err := Progress(ctx, float64(i), 3, fmt.Sprintf("step %d", i)); err != nil {
				return "", nil, err
			}
		}
		if c := CallerFrom(ctx); c != nil {
			return c.ID(), c, nil
		}
		return "nobody", nil, nil
	})
	send, next := rawSession(t, server)

	send(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami","arguments":{"user":"mallory"},` +
		`"_meta":{"progressToken":"tok","mesh/caller":{"account":"ALICE","user":"alice","name":null,"via":"bus"}}}}`)
	for i := 1; i <= 3; i++ {
		m := next(5 * time.Second)
		params, _ := m["params"].(map[string]any)
		if m["method"] != "notifications/progress" || params["progressToken"] != "tok" || params["progress"] != float64(i) ||
			params["total"] != float64(3) || params["message"] != fmt.Sprintf("step %d", i) {
			t.Fatalf("progress %d: %v", i, m)
		}
	}
	m := next(5 * time.Second)
	want := map[string]any{"account": "ALICE", "user": "alice", "name": nil, "via": "bus"}
	if m["id"] != float64(1) || !reflect.DeepEqual(m["result"].(map[string]any)["structuredContent"], want) {
		t.Fatalf("whoami reply %v", m)
	}

	// No caller and no token: CallerFrom is nil and Progress sends nothing.
	send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`)
	if m := next(5 * time.Second); m["id"] != float64(2) || m["result"].(map[string]any)["content"].([]any)[0].(map[string]any)["text"] != "nobody" {
		t.Fatalf("whoami without a caller: %v", m)
	}
	// A malformed caller is treated as absent, never a crash.
	send(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"whoami","arguments":{},"_meta":{"mesh/caller":["ALICE"]}}}`)
	if m := next(5 * time.Second); m["id"] != float64(3) || m["result"].(map[string]any)["content"].([]any)[0].(map[string]any)["text"] != "nobody" {
		t.Fatalf("whoami with a malformed caller: %v", m)
	}
}

func TestCancelledCallGetsNoReply(t *testing.T) {
	server := NewServer("t", "0")
	sawCancel := make(chan struct{})
	AddTool(server, "wait", "", func(ctx context.Context, _ struct{}) (string, any, error) {
		select {
		case <-ctx.Done():
			close(sawCancel)
			return "", nil, ctx.Err()
		case <-time.After(10 * time.Second):
			return "not cancelled", nil, nil
		}
	})
	AddTool(server, "fast", "", func(context.Context, struct{}) (string, any, error) { return "fast", nil, nil })
	send, next := rawSession(t, server)

	send(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"wait","arguments":{}}}`)
	time.Sleep(50 * time.Millisecond) // the call is in its handler
	send(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"user aborted"}}`)
	select {
	case <-sawCancel:
	case <-time.After(5 * time.Second):
		t.Fatal("the handler's ctx was not cancelled")
	}
	time.Sleep(50 * time.Millisecond) // give a (wrong) reply for id 7 time to be written first
	send(`{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"fast","arguments":{}}}`)
	if m := next(5 * time.Second); m == nil || m["id"] != float64(8) {
		t.Fatalf("after the cancel the next line is %v; want the reply to id 8 and nothing for id 7", m)
	}
	if m := next(200 * time.Millisecond); m != nil {
		t.Fatalf("unexpected line %v", m)
	}
	// A cancel for a call already answered changes nothing.
	send(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":8}}`)
	send(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"fast","arguments":{}}}`)
	if m := next(5 * time.Second); m == nil || m["id"] != float64(9) {
		t.Fatalf("call after a stale cancel: %v", m)
	}
}

func TestElicitCarriesTheCallRefAndReturnsTheAnswer(t *testing.T) {
	server := NewServer("t", "0")
	type askIn struct {
		Question string `json:"question"`
	}
	schema := map[string]any{"type": "object", "properties": map[string]any{"ok": map[string]any{"type": "boolean"}}, "required": []string{"ok"}}
	AddTool(server, "confirm", "", func(ctx context.Context, in askIn) (string, any, error) {
		r, err := Elicit(ctx, in.Question, schema)
		if err != nil {
			return "", nil, err
		}
		return fmt.Sprintf("%s %v", r.Action, r.Content["ok"]), nil, nil
	})
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := server.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	var seen []any // each elicitation's _meta["mesh/call"]
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "0"}, &mcp.ClientOptions{
		ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			seen = append(seen, req.Params.Meta[CallRefMetaKey])
			if req.Params.Message == "no" {
				return nil, errors.New("the caller of this call cannot answer it")
			}
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"ok": true}}, nil
		},
	})
	// The node's protocol revision: on 2026-07-28 the go-sdk refuses a request from a server
	// mid-call (that revision wants multi round-trip results instead).
	cs, err := client.Connect(ctx, ct, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })

	for _, c := range []struct {
		question string
		meta     mcp.Meta
		text     string
		isError  bool
	}{
		{"Ship it?", mcp.Meta{CallRefMetaKey: 7}, "accept true", false},
		{"Ship it?", nil, "accept true", false},                           // no ref: none is sent
		{"Ship it?", mcp.Meta{CallRefMetaKey: 1.5}, "accept true", false}, // not an integer: none is sent
		{"no", mcp.Meta{CallRefMetaKey: 8}, "cannot answer it", true},     // an error answer is an error result
	} {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Meta: c.meta, Name: "confirm", Arguments: map[string]any{"question": c.question}})
		if err != nil {
			t.Fatal(err)
		}
		text := res.Content[0].(*mcp.TextContent).Text
		if res.IsError != c.isError || !strings.Contains(text, c.text) {
			t.Fatalf("%v: got %q (isError %v)", c.meta, text, res.IsError)
		}
	}
	// JSON numbers come back as float64 on the client's side.
	if want := []any{float64(7), nil, nil, float64(8)}; !reflect.DeepEqual(seen, want) {
		t.Fatalf("mesh/call seen %v, want %v", seen, want)
	}

	// Outside a tool call there is no caller to ask.
	if _, err := Elicit(ctx, "?", schema); err == nil {
		t.Fatal("Elicit without a call did not fail")
	}
}
