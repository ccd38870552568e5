package main

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	meshsdk "mesh.local/sdk/go"
)

// MaxWait caps handoff.wait and handoff.watch below the bundle's timeout_ms (310 s in module.toml).
const MaxWait = 300 * time.Second

const (
	long   = " (at most 8000 characters and 16384 bytes after Unicode NFC; newlines and tabs, no other control characters)"
	paging = "at most 100 a page (default 50)"
)

type idIn struct {
	ID string `json:"id" jsonschema:"the entry's id, e.g. h-1"`
}

type openIn struct {
	Projekt   string `json:"projekt" jsonschema:"the project the question belongs to (at most 100 characters and 400 bytes)"`
	Frage     string `json:"frage" jsonschema:"the question, precise enough for an agent who knows nothing else"`
	Versucht  string `json:"versucht" jsonschema:"what was tried already, so the next agent does not repeat the dead end"`
	Benoetigt string `json:"benoetigt" jsonschema:"what is needed back, e.g. a fact or a decision"`
}

type listIn struct {
	State   string `json:"state,omitempty" jsonschema:"only entries in this state: open, claimed, resolved, blocked or escalated"`
	Projekt string `json:"projekt,omitempty" jsonschema:"only entries of this project"`
	Owner   string `json:"owner,omitempty" jsonschema:"only entries held (or last held) by this caller id"`
	Opener  string `json:"opener,omitempty" jsonschema:"only entries opened by this caller id"`
	Since   string `json:"since,omitempty" jsonschema:"only entries opened at or after this RFC 3339 time"`
	Limit   int    `json:"limit,omitempty" jsonschema:"entries per page: at most 100 (default 50)"`
	Cursor  string `json:"cursor,omitempty" jsonschema:"the next_cursor of the previous page; leave it out for the first"`
}

type pageIn struct {
	Limit  int    `json:"limit,omitempty" jsonschema:"entries per page: at most 100 (default 50)"`
	Cursor string `json:"cursor,omitempty" jsonschema:"the next_cursor of the previous page; leave it out for the first"`
}

type answerIn struct {
	ID      string `json:"id" jsonschema:"the entry's id"`
	Antwort string `json:"antwort" jsonschema:"the answer"`
}

type askIn struct {
	ID         string `json:"id" jsonschema:"the entry's id"`
	Rueckfrage string `json:"rueckfrage" jsonschema:"the one follow-up question to the opener (a second one blocks the entry)"`
}

type blockIn struct {
	ID    string `json:"id" jsonschema:"the entry's id"`
	Grund string `json:"grund" jsonschema:"why nobody can help"`
}

type withdrawIn struct {
	ID    string `json:"id" jsonschema:"the entry's id"`
	Grund string `json:"grund" jsonschema:"why the question is taken back"`
}

type decideIn struct {
	ID      string `json:"id" jsonschema:"the escalated entry's id"`
	Antwort string `json:"antwort" jsonschema:"the decision"`
}

type escalateIn struct {
	ID    string `json:"id" jsonschema:"the entry's id"`
	Thema string `json:"thema" jsonschema:"one of geld, aussenwirkung, irreversibel, zugangsdaten, prioritaet_scope"`
}

type waitIn struct {
	ID       string  `json:"id" jsonschema:"the entry's id"`
	TimeoutS float64 `json:"timeout_s" jsonschema:"seconds to wait at most (above 0, at most 300)"`
}

type watchIn struct {
	State    string  `json:"state,omitempty" jsonschema:"only entries now in this state, e.g. open to hear of new work"`
	Projekt  string  `json:"projekt,omitempty" jsonschema:"only entries of this project"`
	After    int64   `json:"after,omitempty" jsonschema:"the after (or a listing's watch_after) of an earlier answer; 0, the default, is from the beginning: what already matches comes at once"`
	TimeoutS float64 `json:"timeout_s" jsonschema:"seconds to wait at most for a change (above 0, at most 300)"`
	Limit    int     `json:"limit,omitempty" jsonschema:"entries per answer: at most 100 (default 50)"`
}

type waitOut struct {
	Entry   *Entry `json:"entry"`
	Changed bool   `json:"changed" jsonschema:"true when the entry changed, false at the timeout or when it is settled"`
}

// entryVerb adapts a desk verb on one entry to a tool whose answer is that entry.
func entryVerb[In any](do func(who Who, in In) (*Entry, error)) meshsdk.Handler[In, *Entry] {
	return func(ctx context.Context, in In) (string, *Entry, error) {
		e, err := do(callerOf(ctx), in)
		if err != nil {
			return "", nil, err
		}
		return summary(e), e, nil
	}
}

func timeout(seconds float64) (time.Duration, error) {
	if !(seconds > 0) || seconds > MaxWait.Seconds() || math.IsInf(seconds, 0) {
		return 0, refuse(fmt.Sprintf("give timeout_s above 0 and at most %g; call again for longer", MaxWait.Seconds()),
			"timeout_s %g is out of range", seconds)
	}
	return time.Duration(seconds * float64(time.Second)), nil
}

func addVerbs(server *mcp.Server, d *Desk) {
	verb := func(v string) string { return meshsdk.SeatVerb("handoff", v) }
	meshsdk.AddTool(server, verb("open"), "Hand a question to another agent. All four fields are required and non-empty; frage, versucht and benoetigt"+long+". You become its opener.",
		entryVerb(func(who Who, in openIn) (*Entry, error) {
			return d.Open(who, in.Projekt, in.Frage, in.Versucht, in.Benoetigt)
		}))
	meshsdk.AddTool(server, verb("list"), "The entries without their logs, blocking ones first, then oldest first, "+paging+", optionally of one state, project, owner, opener or since a time: poll it with state \"open\" to find work (or use handoff.watch).",
		func(_ context.Context, in listIn) (string, Page, error) {
			page, err := d.List(ListQuery{State: in.State, Projekt: in.Projekt, Owner: in.Owner, Opener: in.Opener,
				Since: in.Since, Cursor: in.Cursor, Limit: in.Limit})
			return listing(page.Entries, page.NextCursor), page, err
		})
	meshsdk.AddTool(server, verb("get"), "One entry with its state, owner, priority, antwort, rueckfrage, decision and full log.",
		entryVerb(func(_ Who, in idIn) (*Entry, error) { return d.Get(in.ID) }))
	meshsdk.AddTool(server, verb("claim"), "Become the entry's one owner. Refused when another holds it, when it is final, or when you opened it.",
		entryVerb(func(who Who, in idIn) (*Entry, error) { return d.Claim(who, in.ID) }))
	meshsdk.AddTool(server, verb("release"), "The owner gives the entry back: open again, with no owner (logged; not a claim expiry).",
		entryVerb(func(who Who, in idIn) (*Entry, error) { return d.Release(who, in.ID) }))
	meshsdk.AddTool(server, verb("answer"), "The owner's answer"+long+": the entry is resolved.",
		entryVerb(func(who Who, in answerIn) (*Entry, error) { return d.Answer(who, in.ID, in.Antwort) }))
	meshsdk.AddTool(server, verb("ask"), "The owner's one follow-up question to the opener"+long+"; a second one blocks the entry.",
		entryVerb(func(who Who, in askIn) (*Entry, error) { return d.Ask(who, in.ID, in.Rueckfrage) }))
	meshsdk.AddTool(server, verb("reply"), "The opener's reply to the follow-up question"+long+".",
		entryVerb(func(who Who, in answerIn) (*Entry, error) { return d.Reply(who, in.ID, in.Antwort) }))
	meshsdk.AddTool(server, verb("block"), "Nobody can help: the entry is blocked, stays readable and reaches no human. A claimed entry is blocked by its owner, an open one by anyone but its opener.",
		entryVerb(func(who Who, in blockIn) (*Entry, error) { return d.Block(who, in.ID, in.Grund) }))
	meshsdk.AddTool(server, verb("withdraw"), "The opener takes the question back: the entry is blocked, with grund"+long+".",
		entryVerb(func(who Who, in withdrawIn) (*Entry, error) { return d.Withdraw(who, in.ID, in.Grund) }))
	meshsdk.AddTool(server, verb("escalate"), "The opener or owner hands the entry to the human, for one of the five topics only.",
		entryVerb(func(who Who, in escalateIn) (*Entry, error) { return d.Escalate(who, in.ID, in.Thema) }))
	meshsdk.AddTool(server, verb("decide"), "A human (HANDOFF_HUMANS) decides an escalated entry, once"+long+". It stays escalated; the opener's handoff.wait returns with the decision.",
		entryVerb(func(who Who, in decideIn) (*Entry, error) { return d.Decide(who, in.ID, in.Antwort) }))
	meshsdk.AddTool(server, verb("wait"), "Returns when the entry changes, is settled, or at timeout_s. While its opener waits, the entry's priority is blocking. An escalated entry waits for the human's decision.",
		func(ctx context.Context, in waitIn) (string, waitOut, error) {
			wait, err := timeout(in.TimeoutS)
			if err != nil {
				return "", waitOut{}, err
			}
			e, changed, err := d.Wait(ctx, callerOf(ctx), in.ID, wait)
			if err != nil {
				return "", waitOut{}, err
			}
			return summary(e), waitOut{Entry: e, Changed: changed}, nil
		})
	meshsdk.AddTool(server, verb("watch"), "Returns as soon as entries matching state and projekt appear or change after the change number after (their latest state, without logs, "+paging+"), or empty at timeout_s. Call it again with the answer's after: a long poll for work.",
		func(ctx context.Context, in watchIn) (string, WatchPage, error) {
			wait, err := timeout(in.TimeoutS)
			if err != nil {
				return "", WatchPage{}, err
			}
			f, err := filterOf(in.State, in.Projekt, "", "", "")
			if err != nil {
				return "", WatchPage{}, err
			}
			page, err := d.Watch(ctx, f, in.After, in.Limit, wait)
			if err != nil {
				return "", WatchPage{}, err
			}
			text := listing(page.Entries, "")
			if page.TimedOut {
				text = fmt.Sprintf("nothing changed; watch on with after %d", page.After)
			}
			return text, page, nil
		})
	meshsdk.AddTool(server, verb("holders"), "Who holds what: every claimed entry, grouped by its owner, "+paging+".",
		func(_ context.Context, in pageIn) (string, HoldersPage, error) {
			page, err := d.Holders(in.Cursor, in.Limit)
			lines := make([]string, 0, len(page.Holders))
			for _, h := range page.Holders {
				ids := make([]string, len(h.Entries))
				for i, e := range h.Entries {
					ids[i] = e.ID
				}
				lines = append(lines, h.Owner+" holds "+strings.Join(ids, ", "))
			}
			if len(lines) == 0 {
				lines = append(lines, "nobody holds an entry")
			}
			return strings.Join(lines, "\n"), page, err
		})
	meshsdk.AddTool(server, verb("attention"), "What reaches the human: escalated entries only (blocked ones never do), undecided first, "+paging+".",
		func(_ context.Context, in pageIn) (string, AttentionPage, error) {
			page, err := d.Attention(in.Cursor, in.Limit)
			text := listing(page.Entries, page.NextCursor)
			if len(page.Entries) > 0 {
				text = fmt.Sprintf("%d undecided\n%s", page.Undecided, text)
			}
			return text, page, err
		})
}

func summary(e *Entry) string {
	s := fmt.Sprintf("%s (%s) is %s, %s", e.ID, e.Projekt, e.State, e.Priority)
	switch {
	case e.State == StateClaimed:
		s += ", held by " + e.Owner
	case e.Owner != "":
		s += ", last owner " + e.Owner
	}
	if e.DecidedBy != "" {
		s += ", decided by " + e.DecidedBy
	}
	return s
}

func listing(entries []*Entry, next string) string {
	if len(entries) == 0 {
		return "no entries"
	}
	lines := make([]string, len(entries), len(entries)+1)
	for i, e := range entries {
		lines[i] = summary(e)
	}
	if next != "" {
		lines = append(lines, "more: call again with cursor "+next)
	}
	return strings.Join(lines, "\n")
}
