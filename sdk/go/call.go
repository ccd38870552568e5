package meshsdk

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"

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

// MaxCallerFieldBytes is the longest account, user or name accepted, in UTF-8 bytes.
const MaxCallerFieldBytes = 256

// ParseCaller reads a caller from a call's _meta. It returns (nil, nil) when there is none (a
// bundle run by hand, or a node that does not send one) and an error saying what is wrong when
// the value is malformed; it never panics, whatever the value holds. The rules are every SDK's:
// account a non-empty string without "/", user and name non-empty strings or null, each at most
// 256 bytes without control characters, via one of "bus", "local", "mcp".
func ParseCaller(meta map[string]any) (*Caller, error) {
	raw, ok := meta[CallerMetaKey]
	if !ok {
		return nil, nil
	}
	obj, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s is malformed: a %T, not an object {account, user, name, via}", CallerMetaKey, raw)
	}
	c := &Caller{}
	for _, f := range []struct {
		key      string
		to       *string
		nullable bool
	}{{"account", &c.Account, false}, {"user", &c.User, true}, {"name", &c.Name, true}} {
		value, present := obj[f.key]
		if (value == nil) && f.nullable {
			continue
		}
		if problem := fieldProblem(value, present); problem != "" {
			return nil, fmt.Errorf("%s is malformed: %s %s", CallerMetaKey, f.key, problem)
		}
		*f.to = value.(string)
	}
	if strings.Contains(c.Account, "/") {
		return nil, fmt.Errorf("%s is malformed: account %q holds a /, which separates account and user in an id", CallerMetaKey, c.Account)
	}
	via, _ := obj["via"].(string)
	if via != "bus" && via != "local" && via != "mcp" {
		return nil, fmt.Errorf("%s is malformed: via is %#v, not one of \"bus\", \"local\", \"mcp\"", CallerMetaKey, obj["via"])
	}
	c.Via = via
	return c, nil
}

// fieldProblem says why value is not a caller field ("" when it is one).
func fieldProblem(value any, present bool) string {
	s, ok := value.(string)
	switch {
	case !present:
		return "is missing"
	case !ok:
		return fmt.Sprintf("is a %T, not a string", value)
	case s == "":
		return "is empty"
	case len(s) > MaxCallerFieldBytes:
		return fmt.Sprintf("is longer than %d bytes", MaxCallerFieldBytes)
	case strings.IndexFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0:
		return "holds control characters"
	}
	return ""
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
				slog.Warn(err.Error()+"; the handler gets no caller", "tool", req.Params.Name)
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
// message may be empty). It is a no-op returning nil when the caller asked for no progress, or
// when the call was cancelled (nobody waits for it any more).
// Notifications go out in the order of the calls, before the call's result.
func Progress(ctx context.Context, progress, total float64, message string) error {
	c, _ := ctx.Value(callKey{}).(call)
	if c.token == nil || c.session == nil || ctx.Err() != nil {
		return nil
	}
	return c.session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
		ProgressToken: c.token, Progress: progress, Total: total, Message: message,
	})
}
