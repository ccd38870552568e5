package main

import (
	"fmt"
	"strings"
	"time"
)

// The contract's states (seed 002). Terminal ones never change again.
const (
	StateOpen      = "open"
	StateClaimed   = "claimed"
	StateResolved  = "resolved"
	StateBlocked   = "blocked"
	StateEscalated = "escalated"
)

var states = []string{StateOpen, StateClaimed, StateResolved, StateBlocked, StateEscalated}

func terminal(state string) bool {
	return state == StateResolved || state == StateBlocked || state == StateEscalated
}

// Topics are the only reasons an entry may reach the human: money, acting outward (sending,
// posting, publishing), the irreversible, credentials, priority and scope.
var Topics = []string{"geld", "aussenwirkung", "irreversibel", "zugangsdaten", "prioritaet_scope"}

// Priority is derived, never set: blocking while the opener waits on the entry.
const (
	PriorityBlocking   = "blocking"
	PriorityBackground = "background"
)

// Module is the "who" of a transition the module makes itself (a clock ran out).
const Module = "handoff"

// LogLine is one step of an entry's history: every transition, and the follow-up in between.
type LogLine struct {
	At   time.Time `json:"at"`
	Who  string    `json:"who" jsonschema:"the caller's id, or handoff for the module's own clocks"`
	From string    `json:"from" jsonschema:"the state before (empty for the opening)"`
	To   string    `json:"to" jsonschema:"the state after"`
	Why  string    `json:"why"`
}

// Entry is one handoff. Field names are the contract's own words where it has them.
type Entry struct {
	ID        string `json:"id"`
	Projekt   string `json:"projekt"`
	Frage     string `json:"frage"`
	Versucht  string `json:"versucht"`
	Benoetigt string `json:"benoetigt"`
	State     string `json:"state"`
	Priority  string `json:"priority" jsonschema:"blocking while the opener waits on it (handoff.wait), else background"`
	Opener    string `json:"opener" jsonschema:"the caller id that opened it"`
	Owner     string `json:"owner" jsonschema:"the caller id that holds the claim; empty when nobody does"`
	Antwort   string `json:"antwort"`
	// The one follow-up question the owner may ask, and the opener's reply to it.
	Rueckfrage        string    `json:"rueckfrage"`
	RueckfrageAntwort string    `json:"rueckfrage_antwort"`
	Grund             string    `json:"grund" jsonschema:"why it was blocked"`
	Thema             string    `json:"thema" jsonschema:"the escalation topic"`
	OpenedAt          time.Time `json:"opened_at"`
	ClaimedAt         time.Time `json:"claimed_at,omitzero"`
	ClaimExpiries     int       `json:"claim_expiries" jsonschema:"claims that ran out without an answer; the second blocks it"`
	Version           int       `json:"version" jsonschema:"counts every change; handoff.wait returns when it moves"`
	Log               []LogLine `json:"log"`
}

// move changes the state and logs it; callers have checked that the move is allowed.
func (e *Entry) move(at time.Time, who, to, why string) {
	e.Log = append(e.Log, LogLine{At: at, Who: who, From: e.State, To: to, Why: why})
	e.State = to
	e.Version++
}

// note logs a step that keeps the state (the follow-up and its reply).
func (e *Entry) note(at time.Time, who, why string) {
	e.Log = append(e.Log, LogLine{At: at, Who: who, From: e.State, To: e.State, Why: why})
	e.Version++
}

// Refusal is a call the contract does not allow: what was wrong, and what would be right. The
// SDK turns it into a tool error (isError), which is how MCP says a tool refused.
type Refusal struct {
	Wrong string
	Right string
}

func (r *Refusal) Error() string { return r.Wrong + "; " + r.Right }

func refuse(right, wrongFormat string, args ...any) *Refusal {
	return &Refusal{Wrong: fmt.Sprintf(wrongFormat, args...), Right: right}
}

func blank(s string) bool { return strings.TrimSpace(s) == "" }
