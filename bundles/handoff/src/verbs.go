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

// MaxWait caps handoff.wait below the bundle's timeout_ms (310 s in module.toml).
const MaxWait = 300 * time.Second

type idIn struct {
	ID string `json:"id" jsonschema:"the entry's id, e.g. h-1"`
}

type openIn struct {
	Projekt   string `json:"projekt" jsonschema:"the project the question belongs to"`
	Frage     string `json:"frage" jsonschema:"the question, precise enough for an agent who knows nothing else"`
	Versucht  string `json:"versucht" jsonschema:"what was tried already, so the next agent does not repeat the dead end"`
	Benoetigt string `json:"benoetigt" jsonschema:"what is needed back, e.g. a fact or a decision"`
}

type listIn struct {
	State   string `json:"state,omitempty" jsonschema:"only entries in this state: open, claimed, resolved, blocked or escalated"`
	Projekt string `json:"projekt,omitempty" jsonschema:"only entries of this project"`
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

type escalateIn struct {
	ID    string `json:"id" jsonschema:"the entry's id"`
	Thema string `json:"thema" jsonschema:"one of geld, aussenwirkung, irreversibel, zugangsdaten, prioritaet_scope"`
}

type waitIn struct {
	ID       string  `json:"id" jsonschema:"the entry's id"`
	TimeoutS float64 `json:"timeout_s" jsonschema:"seconds to wait at most (above 0, at most 300)"`
}

type entriesOut struct {
	Entries []*Entry `json:"entries"`
}

type waitOut struct {
	Entry   *Entry `json:"entry"`
	Changed bool   `json:"changed" jsonschema:"true when the entry changed, false at the timeout or when it is final"`
}

type holdersOut struct {
	Holders map[string][]string `json:"holders" jsonschema:"owner -> the ids of the entries it holds"`
}

// caller is the caller's id, or "" when the node sent none (the verbs that need one refuse).
func caller(ctx context.Context) string {
	if c := meshsdk.CallerFrom(ctx); c != nil {
		return c.ID()
	}
	return ""
}

// entryVerb adapts a desk verb on one entry to a tool whose answer is that entry.
func entryVerb[In any](do func(who string, in In) (*Entry, error)) meshsdk.Handler[In, *Entry] {
	return func(ctx context.Context, in In) (string, *Entry, error) {
		e, err := do(caller(ctx), in)
		if err != nil {
			return "", nil, err
		}
		return summary(e), e, nil
	}
}

func addVerbs(server *mcp.Server, d *Desk) {
	verb := func(v string) string { return meshsdk.SeatVerb("handoff", v) }
	meshsdk.AddTool(server, verb("open"), "Hand a question to another agent. All four fields are required and non-empty. You become its opener.",
		entryVerb(func(who string, in openIn) (*Entry, error) {
			return d.Open(who, in.Projekt, in.Frage, in.Versucht, in.Benoetigt)
		}))
	meshsdk.AddTool(server, verb("list"), "The entries, oldest first, optionally of one state and project: poll it with state \"open\" to find work.",
		func(_ context.Context, in listIn) (string, entriesOut, error) {
			found, err := d.List(in.State, in.Projekt)
			return listing(found), entriesOut{found}, err
		})
	meshsdk.AddTool(server, verb("get"), "One entry with its state, owner, priority, antwort, rueckfrage and full log.",
		entryVerb(func(_ string, in idIn) (*Entry, error) { return d.Get(in.ID) }))
	meshsdk.AddTool(server, verb("claim"), "Become the entry's one owner. Refused when another holds it, when it is final, or when you opened it.",
		entryVerb(func(who string, in idIn) (*Entry, error) { return d.Claim(who, in.ID) }))
	meshsdk.AddTool(server, verb("answer"), "The owner's answer: the entry is resolved.",
		entryVerb(func(who string, in answerIn) (*Entry, error) { return d.Answer(who, in.ID, in.Antwort) }))
	meshsdk.AddTool(server, verb("ask"), "The owner's one follow-up question to the opener; a second one blocks the entry.",
		entryVerb(func(who string, in askIn) (*Entry, error) { return d.Ask(who, in.ID, in.Rueckfrage) }))
	meshsdk.AddTool(server, verb("reply"), "The opener's reply to the follow-up question.",
		entryVerb(func(who string, in answerIn) (*Entry, error) { return d.Reply(who, in.ID, in.Antwort) }))
	meshsdk.AddTool(server, verb("block"), "The owner: nobody can help. Blocked entries stay readable and reach no human.",
		entryVerb(func(who string, in blockIn) (*Entry, error) { return d.Block(who, in.ID, in.Grund) }))
	meshsdk.AddTool(server, verb("escalate"), "The opener or owner hands the entry to the human, for one of the five topics only.",
		entryVerb(func(who string, in escalateIn) (*Entry, error) { return d.Escalate(who, in.ID, in.Thema) }))
	meshsdk.AddTool(server, verb("wait"), "Returns when the entry changes, is final, or at timeout_s. While its opener waits, the entry's priority is blocking.",
		func(ctx context.Context, in waitIn) (string, waitOut, error) {
			if !(in.TimeoutS > 0) || in.TimeoutS > MaxWait.Seconds() || math.IsInf(in.TimeoutS, 0) {
				return "", waitOut{}, refuse(fmt.Sprintf("give timeout_s above 0 and at most %g; poll again for longer", MaxWait.Seconds()),
					"timeout_s %g is out of range", in.TimeoutS)
			}
			e, changed, err := d.Wait(ctx, caller(ctx), in.ID, time.Duration(in.TimeoutS*float64(time.Second)))
			if err != nil {
				return "", waitOut{}, err
			}
			return summary(e), waitOut{Entry: e, Changed: changed}, nil
		})
	meshsdk.AddTool(server, verb("holders"), "Who holds what: owner -> ids of its claimed entries.",
		func(context.Context, struct{}) (string, holdersOut, error) {
			h, err := d.Holders()
			return fmt.Sprintf("%d holders", len(h)), holdersOut{h}, err
		})
	meshsdk.AddTool(server, verb("attention"), "What reaches the human: escalated entries only (blocked ones never do).",
		func(context.Context, struct{}) (string, entriesOut, error) {
			found, err := d.Attention()
			return listing(found), entriesOut{found}, err
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
	return s
}

func listing(entries []*Entry) string {
	if len(entries) == 0 {
		return "no entries"
	}
	lines := make([]string, len(entries))
	for i, e := range entries {
		lines[i] = summary(e)
	}
	return strings.Join(lines, "\n")
}
