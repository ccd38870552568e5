package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	meshsdk "mesh.local/sdk/go"
)

// Who is a caller as the desk knows it: the one id that becomes an entry's opener, owner or
// decider, and what HANDOFF_HUMANS is matched against.
type Who struct {
	ID      string // "" when the call came with no caller
	Account string
	Local   bool // the node's local identity: a call from inside the mesh account, or its person through a console
}

// localPerson is the node's own OS user as a person id (MESH_LOCAL_PERSON, given to every child):
// the person a console on this machine passes for the operator who started it.
var localPerson = os.Getenv("MESH_LOCAL_PERSON")

// whoOf is the one place a caller becomes an identity. The node stamps a caller {account, user,
// name, via}; when it also carries a person (via "mcp" or "console", person {iss, sub, name}),
// that person becomes the id here, and everything downstream (opener, owner, decided_by, the
// humans list) follows without a change.
func whoOf(c *meshsdk.Caller) Who {
	if c == nil {
		return Who{}
	}
	return Who{ID: c.ID(), Account: c.Account, Local: isLocal(c, localPerson)}
}

// isLocal: the mesh account's own caller, or the node's person behind a console. A console
// delegate is listed by the node (on the default set-up only the node's user can read its
// credentials), so its local person is the operator at that machine. Not through an MCP face: there
// an agent acts for the person, and seed 002 has humans, not agents, decide.
func isLocal(c *meshsdk.Caller, localPerson string) bool {
	if c.Via == "local" {
		return true
	}
	return c.Via == "console" && c.Person != nil && localPerson != "" && c.ID() == localPerson
}

func callerOf(ctx context.Context) Who { return whoOf(meshsdk.CallerFrom(ctx)) }

// Humans is HANDOFF_HUMANS: who may decide an escalated entry. "@local" is the node's local
// identity, "ACCOUNT" any user of that account, "ACCOUNT/user" one user.
type Humans []string

// DefaultHumans: only calls from inside the mesh account (an operator's meshctl on the node).
const DefaultHumans = "@local"

// ParseHumans reads a comma-separated list; blanks around entries are dropped.
func ParseHumans(raw string) (Humans, error) {
	if strings.TrimSpace(raw) == "" {
		raw = DefaultHumans
	}
	var h Humans
	for _, entry := range strings.Split(raw, ",") {
		entry = strings.TrimSpace(entry)
		account, user, hasUser := strings.Cut(entry, "/")
		const right = "give @local, ACCOUNT or ACCOUNT/user, comma-separated, e.g. HANDOFF_HUMANS=@local,OPS/samuel"
		switch {
		case entry == "@local":
		case entry == "" || account == "" || (hasUser && (user == "" || strings.Contains(user, "/"))):
			return nil, fmt.Errorf("HANDOFF_HUMANS=%q: entry %q is not a caller id; %s", raw, entry, right)
		case strings.ContainsFunc(entry, func(r rune) bool { return r <= ' ' || r == 0x7f }) || len(entry) > CallerIDLimit.Bytes:
			return nil, fmt.Errorf("HANDOFF_HUMANS=%q: entry %q holds a space or control character, or is longer than %d bytes, which no caller id does; %s",
				raw, entry, CallerIDLimit.Bytes, right)
		}
		h = append(h, entry)
	}
	return h, nil
}

// Include says whether w may decide.
func (h Humans) Include(w Who) bool {
	if w.ID == "" {
		return false
	}
	for _, entry := range h {
		if (entry == "@local" && w.Local) || entry == w.ID || (!strings.Contains(entry, "/") && entry == w.Account) {
			return true
		}
	}
	return false
}

func (h Humans) String() string { return strings.Join(h, ",") }
