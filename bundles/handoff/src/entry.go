package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The contract's states (seed 002). Final ones never change state again; an escalated entry
// still takes the human's one decision.
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

// MaxClaims bounds how often one entry is claimed (claims end by an answer, a block, an
// escalation, an expiry or a release): with it an entry's log has at most 1 + 2*MaxClaims + 4
// lines, and the entry always fits one reply.
const MaxClaims = 10

// LogLine is one step of an entry's history: every transition, and the follow-up in between.
type LogLine struct {
	At   time.Time `json:"at"`
	Who  string    `json:"who" jsonschema:"the caller's id, or handoff for the module's own clocks"`
	From string    `json:"from" jsonschema:"the state before (empty for the opening)"`
	To   string    `json:"to" jsonschema:"the state after"`
	Why  string    `json:"why"`
}

// Entry is one handoff as a caller sees it. Field names are the contract's own words where it
// has them. An answer of one entry carries its log; a listing leaves it out (log_lines counts it).
type Entry struct {
	ID        string `json:"id"`
	Projekt   string `json:"projekt"`
	Frage     string `json:"frage"`
	Versucht  string `json:"versucht"`
	Benoetigt string `json:"benoetigt"`
	State     string `json:"state"`
	Priority  string `json:"priority" jsonschema:"blocking while the opener waits on it (handoff.wait), else background; stored with the entry"`
	Opener    string `json:"opener" jsonschema:"the caller id that opened it"`
	Owner     string `json:"owner" jsonschema:"the caller id that holds the claim; empty when nobody does"`
	Antwort   string `json:"antwort"`
	// The one follow-up question the owner may ask, and the opener's reply to it.
	Rueckfrage        string    `json:"rueckfrage"`
	RueckfrageAntwort string    `json:"rueckfrage_antwort"`
	Grund             string    `json:"grund" jsonschema:"why it was blocked or withdrawn"`
	Thema             string    `json:"thema" jsonschema:"the escalation topic"`
	Entscheidung      string    `json:"entscheidung" jsonschema:"the human's decision on an escalated entry (handoff.decide); empty until then"`
	DecidedBy         string    `json:"decided_by" jsonschema:"who decided it"`
	OpenedAt          time.Time `json:"opened_at"`
	ClaimedAt         time.Time `json:"claimed_at,omitzero"`
	DecidedAt         time.Time `json:"decided_at,omitzero"`
	AgeS              int64     `json:"age_s" jsonschema:"seconds since it was opened, at the time of the answer"`
	Claims            int       `json:"claims" jsonschema:"how often it was claimed (at most 10)"`
	ClaimExpiries     int       `json:"claim_expiries" jsonschema:"claims that ran out without an answer; the second blocks it"`
	Version           int64     `json:"version" jsonschema:"counts every change of the entry; a write is applied only over the version it read"`
	Seq               int64     `json:"seq" jsonschema:"the store's change number of its last change (priority included): handoff.watch's after"`
	Clipped           []string  `json:"clipped,omitempty" jsonschema:"fields stored longer than their limit (before the limits existed), shown cut to it"`
	LogLines          int       `json:"log_lines" jsonschema:"how many lines its log has"`
	Log               []LogLine `json:"log,omitempty" jsonschema:"every transition; in answers about one entry, never in listings"`

	num           int64     // the row; ID is "h-<num>"
	blockingUntil time.Time // the opener's wait lease: priority is blocking until then
	pending       []LogLine // lines a verb added, stored with its write
}

// settled is an entry nothing more happens to: resolved, blocked, or escalated and decided.
// An escalated entry without a decision still waits for the human.
func (e *Entry) settled() bool {
	return e.State == StateResolved || e.State == StateBlocked || (e.State == StateEscalated && !e.DecidedAt.IsZero())
}

// move changes the state and logs it; callers have checked that the move is allowed.
func (e *Entry) move(at time.Time, who, to, why string) {
	e.pending = append(e.pending, LogLine{At: at, Who: who, From: e.State, To: to, Why: why})
	e.State = to
}

// note logs a step that keeps the state (the follow-up, its reply, the decision).
func (e *Entry) note(at time.Time, who, why string) { e.move(at, who, e.State, why) }

func (e *Entry) changed() bool { return len(e.pending) > 0 }

// entryID is the id of row num; parseID reads one back, refusing anything else.
func entryID(num int64) string { return "h-" + strconv.FormatInt(num, 10) }

func parseID(id string) (int64, error) {
	digits, ok := strings.CutPrefix(id, "h-")
	num, err := strconv.ParseInt(digits, 10, 64)
	if !ok || err != nil || num < 1 || len(id) > 24 || digits[0] == '0' || digits[0] == '+' {
		shown := id
		if len(shown) > 40 {
			shown = shown[:40] + "…"
		}
		return 0, refuse("use an id from handoff.open or handoff.list (h-1, h-2, ...)", "there is no entry %q", shown)
	}
	return num, nil
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
