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
	Account string  // the caller's NATS account; never empty
	User    string  // the user in that account; "" when the node sent null
	Name    string  // the client's connection name; "" when the node sent null
	Via     string  // "bus", "local", "mcp" or "console"
	Person  *Person // the person behind a delegate's call (via "mcp" or "console"); nil otherwise
}

// Person is the human behind a delegate's call (an MCP face, a console), as the delegate named them.
type Person struct {
	Iss  string `json:"iss"`  // who vouched for them: an OAuth issuer, or "unix:<host>" for an OS user
	Sub  string `json:"sub"`  // their subject at that issuer
	Name string `json:"name"` // shown to people
}

// escape writes a name as it stands in an id: "%", "/" and ":" percent-encoded (every SDK's rule).
var escaper = strings.NewReplacer("%", "%25", "/", "%2F", ":", "%3A")

// ID is the stable key of whoever acts on the call (author, owner): the person's when a delegate
// named one ("person:<iss>/<sub>"), else "<account>/<user>" ("<account>" without a user), with
// "local:" before it for the node's own caller. Names are escaped, so no two callers share an id.
func (c *Caller) ID() string {
	if c.Person != nil {
		return "person:" + escaper.Replace(c.Person.Iss) + "/" + escaper.Replace(c.Person.Sub)
	}
	id := escaper.Replace(c.Account)
	if c.User != "" {
		id += "/" + escaper.Replace(c.User)
	}
	if c.Via == "local" {
		return "local:" + id
	}
	return id
}

// MarshalJSON writes the wire form, with null for an absent user or name, so a caller echoed
// back reads exactly as the node sent it.
func (c Caller) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Account string  `json:"account"`
		User    *string `json:"user"`
		Name    *string `json:"name"`
		Via     string  `json:"via"`
		Person  *Person `json:"person,omitempty"`
	}{c.Account, nullable(c.User), nullable(c.Name), c.Via, c.Person})
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// MaxCallerFieldBytes is the longest account, user, name or person field accepted, in UTF-8 bytes.
const MaxCallerFieldBytes = 256

// ParseCaller reads a caller from a call's _meta. It returns (nil, nil) when there is none (a
// bundle run by hand, or a node that does not send one) and an error saying what is wrong when
// the value is malformed; it never panics, whatever the value holds. The rules are every SDK's:
// account a non-empty string, user and name non-empty strings or null, each at most 256 bytes
// without control characters, via one of "bus", "local", "mcp", "console"; a person (only with
// via "mcp" or "console") an object of iss, sub and name, each such a string.
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
	via, _ := obj["via"].(string)
	if via != "bus" && via != "local" && via != "mcp" && via != "console" {
		return nil, fmt.Errorf("%s is malformed: via is %#v, not one of \"bus\", \"local\", \"mcp\", \"console\"", CallerMetaKey, obj["via"])
	}
	c.Via = via
	if raw, present := obj["person"]; present && raw != nil {
		person, err := parsePerson(raw, via)
		if err != nil {
			return nil, fmt.Errorf("%s is malformed: %w", CallerMetaKey, err)
		}
		c.Person = person
	}
	return c, nil
}

func parsePerson(raw any, via string) (*Person, error) {
	if via != "mcp" && via != "console" {
		return nil, fmt.Errorf("a person comes only with via \"mcp\" or \"console\", not %q", via)
	}
	obj, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("person is a %T, not an object {iss, sub, name}", raw)
	}
	p := &Person{}
	for _, f := range []struct {
		key string
		to  *string
	}{{"iss", &p.Iss}, {"sub", &p.Sub}, {"name", &p.Name}} {
		value, present := obj[f.key]
		if problem := fieldProblem(value, present); problem != "" {
			return nil, fmt.Errorf("person.%s %s", f.key, problem)
		}
		*f.to = value.(string)
	}
	return p, nil
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
	ref     any // the call's _meta["mesh/call"] (an int64), copied onto an elicitation; nil if none
}

type callKey struct{}

// WithCall returns ctx carrying req's caller, progress token and call reference, for CallerFrom,
// Progress and Elicit.
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
			c.ref = callRef(meta)
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
