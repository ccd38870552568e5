package meshsdk

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// CallerMetaKey is where the node puts the caller in a tools/call's params._meta.
const CallerMetaKey = "mesh/caller"

// Caller is who made a call, as the node stamped it (from the NATS server-set request info, or
// the node's local identity). A module takes an author or owner only from here, never from the
// call's arguments, which any caller can fill with any name.
type Caller struct {
	Account string // the caller's NATS account; never empty
	User    string // the user in that account; "" when the node sent null
	Name    string // the client's connection name; "" when the node sent null
	Via     string // "bus", "local" or "mcp"
}

// ID is the caller's stable key, "<account>/<user>", or "<account>" when there is no user.
// Modules use it as the owner or author of what a call creates.
func (c *Caller) ID() string {
	if c.User == "" {
		return c.Account
	}
	return c.Account + "/" + c.User
}

// MarshalJSON writes the wire form, with null for an absent user or name, so a caller echoed
// back reads exactly as the node sent it.
func (c Caller) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Account string  `json:"account"`
		User    *string `json:"user"`
		Name    *string `json:"name"`
		Via     string  `json:"via"`
	}{c.Account, nullable(c.User), nullable(c.Name), c.Via})
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// ParseCaller reads a caller from a call's _meta. It returns (nil, nil) when there is none (a
// bundle run by hand, or a node that does not send one) and an error naming the field when
// the value is malformed; it never panics, whatever the value holds.
func ParseCaller(meta map[string]any) (*Caller, error) {
	raw, ok := meta[CallerMetaKey]
	if !ok || raw == nil {
		return nil, nil
	}
	obj, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("_meta[%q] is a %T; the node sends an object {account, user, name, via}", CallerMetaKey, raw)
	}
	account, ok := obj["account"].(string)
	if !ok || account == "" {
		return nil, fmt.Errorf("_meta[%q].account is %#v; it must be a non-empty string", CallerMetaKey, obj["account"])
	}
	c := &Caller{Account: account}
	for _, f := range []struct {
		key string
		to  *string
	}{{"user", &c.User}, {"name", &c.Name}} {
		switch v := obj[f.key].(type) {
		case nil:
		case string:
			*f.to = v
		default:
			return nil, fmt.Errorf("_meta[%q].%s is a %T; it must be a string or null", CallerMetaKey, f.key, v)
		}
	}
	switch via := obj["via"].(type) {
	case string:
		if via != "bus" && via != "local" && via != "mcp" {
			return nil, fmt.Errorf("_meta[%q].via is %q; it must be \"bus\", \"local\" or \"mcp\"", CallerMetaKey, via)
		}
		c.Via = via
	default:
		return nil, fmt.Errorf("_meta[%q].via is %#v; it must be \"bus\", \"local\" or \"mcp\"", CallerMetaKey, via)
	}
	return c, nil
}

// call is what a handler's context carries about its tools/call.
type call struct {
	caller  *Caller
	session *mcp.ServerSession
	token   any // the caller's progressToken; nil when it asked for no progress
}

type callKey struct{}

// WithCall returns ctx carrying req's caller and progress token, for CallerFrom and Progress.
// AddTool does this for every call; a tool registered with mcp.AddTool directly calls it
// itself. A malformed caller is logged (it is a node bug, not the caller's) and treated as absent.
func WithCall(ctx context.Context, req *mcp.CallToolRequest) context.Context {
	c := call{}
	if req != nil {
		c.session = req.Session
		if req.Params != nil {
			meta := req.Params.GetMeta()
			caller, err := ParseCaller(meta)
			if err != nil {
				slog.Warn("call without a usable caller", "tool", req.Params.Name, "error", err)
			}
			c.caller = caller
			c.token = req.Params.GetProgressToken()
		}
	}
	return context.WithValue(ctx, callKey{}, c)
}

// CallerFrom returns the caller of the tools/call whose handler got ctx, or nil when the node
// sent none (or sent one this SDK cannot read; that is logged). Check for nil: a module that
// needs an owner refuses the call rather than inventing one.
func CallerFrom(ctx context.Context) *Caller {
	c, _ := ctx.Value(callKey{}).(call)
	return c.caller
}

// Progress tells the caller how far the call is (progress out of total; total 0 means unknown;
// message may be empty). It is a no-op returning nil when the caller asked for no progress.
// Notifications go out in the order of the calls, before the call's result.
func Progress(ctx context.Context, progress, total float64, message string) error {
	c, _ := ctx.Value(callKey{}).(call)
	if c.token == nil || c.session == nil {
		return nil
	}
	return c.session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
		ProgressToken: c.token, Progress: progress, Total: total, Message: message,
	})
}
