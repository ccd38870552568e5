package meshsdk

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Handler is a typed tool: In is decoded (and checked against the schema inferred from it)
// from the call's arguments; Out becomes structuredContent and the output schema; text is what
// a model reads (empty: the go-sdk sends Out's JSON as the text). A non-nil err becomes a
// result with isError set and err's message as its text, as MCP wants for tool failures.
// ctx carries the call: CallerFrom(ctx) is who called, Progress(ctx, ...) reports progress,
// and ctx.Done() closes when the caller cancels.
type Handler[In, Out any] func(ctx context.Context, in In) (text string, out Out, err error)

// AddTool registers a typed tool on server; its input schema comes from In's struct fields
// (`json` tags name them, `jsonschema` tags describe them, omitempty makes one optional).
// It panics on a name the mesh cannot serve, like regexp.MustCompile: that is a bug in the
// bundle, seen on its first start. Tools that need the raw request use mcp.AddTool directly.
func AddTool[In, Out any](server *mcp.Server, name, description string, h Handler[In, Out]) {
	if err := CheckToolName(name); err != nil {
		panic("meshsdk.AddTool: " + err.Error())
	}
	tool := &mcp.Tool{Name: name, Description: description}
	mcp.AddTool(server, tool, func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		text, out, err := h(WithCall(ctx, req), in)
		if err != nil {
			return nil, out, err
		}
		result := &mcp.CallToolResult{}
		if text != "" {
			result.Content = []mcp.Content{&mcp.TextContent{Text: text}}
		}
		return result, out, nil
	})
}

var (
	// A seat is named like a module; see manifests/model.py SEAT_NAME_RE.
	seatRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,62}$`)
	// A verb or a plain tool name: MCP's tool-name characters without the dot, because the
	// dot separates NATS subject tokens (mesh.tool.<module>.<tool>, mesh.seat.<seat>.<verb>).
	plainRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)
)

// SeatVerb returns the tool name "<seat>.<verb>" that implements a seat's verb. It panics on
// a seat or verb the runtime could not serve, because a misspelt seat tool would otherwise
// only show up as a seat with a missing verb on the live mesh.
func SeatVerb(seat, verb string) string {
	if err := checkSeatVerb(seat, verb); err != nil {
		panic(fmt.Sprintf("meshsdk.SeatVerb(%q, %q): %v", seat, verb, err))
	}
	return seat + "." + verb
}

// CheckToolName says why the runtime could not serve a tool of this name, or returns nil: a
// module's own tool has no dot, a seat's verb has exactly one.
func CheckToolName(name string) error {
	seat, verb, isSeat := strings.Cut(name, ".")
	if !isSeat {
		if !plainRE.MatchString(name) {
			return fmt.Errorf("tool name %q: use 1 to 128 of A-Z a-z 0-9 _ - (or <seat>.<verb> for a seat's verb)", name)
		}
		return nil
	}
	if err := checkSeatVerb(seat, verb); err != nil {
		return fmt.Errorf("tool name %q: %w", name, err)
	}
	return nil
}

func checkSeatVerb(seat, verb string) error {
	if !seatRE.MatchString(seat) {
		return fmt.Errorf("seat %q must match [a-z][a-z0-9-]{0,62}, as seats are named in module.toml", seat)
	}
	if !plainRE.MatchString(verb) {
		return fmt.Errorf("verb %q must be 1 to 128 of A-Z a-z 0-9 _ - (no dot)", verb)
	}
	if len(seat)+1+len(verb) > 128 {
		return fmt.Errorf("%q.%q is longer than MCP's 128 characters for a tool name", seat, verb)
	}
	return nil
}
