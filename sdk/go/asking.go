package meshsdk

import (
	"context"
	"errors"
	"math"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// CallRefMetaKey is where the node puts the call reference in a tools/call's params._meta. The
// node passes a child's elicitation/create on to the caller of the call it belongs to (docs/bus.md,
// "Asking"); with several calls in flight on one child, this reference, copied onto the request,
// is how it knows which (sdk/COMMON.md, "Asking").
const CallRefMetaKey = "mesh/call"

// Elicit asks the caller of the call whose handler got ctx to fill a form: an elicitation/create
// carrying the call's _meta["mesh/call"]. schema is a JSON schema object of primitive properties
// (a map, a *jsonschema.Schema from jsonschema.For, or json.RawMessage). The result's Action is
// "accept", "decline" or "cancel", and Content the answer when accepted (the go-sdk checks it
// against schema). A caller that cannot answer makes it fail at once with the node's error.
func Elicit(ctx context.Context, message string, schema any) (*mcp.ElicitResult, error) {
	return elicit(ctx, &mcp.ElicitParams{Mode: "form", Message: message, RequestedSchema: schema})
}

// ElicitURL sends the caller's user to url (URL mode: what happens there never passes the mesh);
// elicitationID names this elicitation for a later notifications/elicitation/complete.
func ElicitURL(ctx context.Context, message, url, elicitationID string) (*mcp.ElicitResult, error) {
	return elicit(ctx, &mcp.ElicitParams{Mode: "url", Message: message, URL: url, ElicitationID: elicitationID})
}

func elicit(ctx context.Context, params *mcp.ElicitParams) (*mcp.ElicitResult, error) {
	c, _ := ctx.Value(callKey{}).(call)
	if c.session == nil {
		return nil, errors.New("meshsdk: Elicit needs the ctx of a tool call (AddTool's, or WithCall's)")
	}
	if c.ref != nil {
		params.Meta = mcp.Meta{CallRefMetaKey: c.ref}
	}
	return c.session.Elicit(ctx, params)
}

// callRef reads the call reference from a call's _meta: an integer, or nil when there is none
// (a caller that cannot answer, or a bundle run by hand). JSON numbers arrive as float64, so an
// integral one within float64's exact range is taken, and sent back as an int64.
func callRef(meta map[string]any) any {
	f, ok := meta[CallRefMetaKey].(float64)
	if !ok || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return nil
	}
	return int64(f)
}
