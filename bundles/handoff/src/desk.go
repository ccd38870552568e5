package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Limits are the contract's clocks: an entry not resolved this long after it was opened is
// blocked; a claim this long without an answer goes back to open (the second time: blocked).
type Limits struct {
	Unanswered time.Duration
	Claim      time.Duration
}

// Desk is the handoff seat's state machine over a Store. One lock orders every call and every
// tick, so each verb reads, checks and writes an entry as one step.
type Desk struct {
	mu     sync.Mutex
	store  *Store
	now    func() time.Time
	limits Limits
	// waiting counts the opener's handoff.wait calls in flight per entry: priority is derived
	// from it. Bounded by the calls in flight, which the node bounds per child.
	waiting map[string]int
	// bell is closed and replaced on every change, waking every handoff.wait to look again.
	bell chan struct{}
}

func NewDesk(store *Store, now func() time.Time, limits Limits) *Desk {
	return &Desk{store: store, now: now, limits: limits, waiting: map[string]int{}, bell: make(chan struct{})}
}

var noCaller = &Refusal{
	Wrong: "this call has no caller identity (no _meta[\"mesh/caller\"])",
	Right: "handoff takes the opener and the owner only from the caller the node stamps on each call: call it through a mesh node that passes callers (meshctl call, or a request on mesh.seat.handoff.<verb>); list, get, wait, holders and attention work without one",
}

// Open files a new entry for the caller. Every one of the four fields must say something.
func (d *Desk) Open(who, projekt, frage, versucht, benoetigt string) (*Entry, error) {
	if who == "" {
		return nil, noCaller
	}
	var missing []string
	for _, f := range []struct{ name, value string }{
		{"projekt", projekt}, {"frage", frage}, {"versucht", versucht}, {"benoetigt", benoetigt},
	} {
		if blank(f.value) {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return nil, refuse("an entry needs all four of projekt, frage, versucht (what was tried, so nobody repeats it) and benoetigt, each non-empty",
			"%s empty or missing", strings.Join(missing, ", "))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	e := &Entry{Projekt: projekt, Frage: frage, Versucht: versucht, Benoetigt: benoetigt, Opener: who, OpenedAt: now}
	e.move(now, who, StateOpen, "opened")
	if err := d.store.Insert(e); err != nil {
		return nil, err
	}
	d.ring()
	return d.view(e), nil
}

// Claim makes the caller the entry's one owner.
func (d *Desk) Claim(who, id string) (*Entry, error) {
	return d.change(who, id, func(e *Entry, now time.Time) error {
		switch {
		case e.State == StateClaimed && e.Owner == who:
			return nil // claiming again what one holds changes nothing
		case e.State == StateClaimed:
			return refuse("wait until it is answered or its claim runs out (it then shows as open in handoff.list), or take another open entry",
				"%s is held by %s", e.ID, e.Owner)
		case terminal(e.State):
			return refuse("claim an entry that is open (handoff.list with state \"open\")", "%s is %s, which is final", e.ID, e.State)
		case e.Opener == who:
			return refuse("another agent claims it; the opener waits (handoff.wait) or answers a follow-up (handoff.reply)",
				"%s was opened by you (%s)", e.ID, who)
		}
		e.Owner, e.ClaimedAt = who, now
		e.move(now, who, StateClaimed, "claimed")
		return nil
	})
}

// Answer resolves the entry; only its owner can.
func (d *Desk) Answer(who, id, antwort string) (*Entry, error) {
	return d.change(who, id, func(e *Entry, now time.Time) error {
		if err := ownerOnly(e, who, "answer"); err != nil {
			return err
		}
		if blank(antwort) {
			return refuse("give the answer in antwort", "antwort is empty")
		}
		e.Antwort = antwort
		e.move(now, who, StateResolved, "answered")
		return nil
	})
}

// Ask puts the owner's one follow-up question to the opener; a second question blocks the entry.
func (d *Desk) Ask(who, id, rueckfrage string) (*Entry, error) {
	return d.change(who, id, func(e *Entry, now time.Time) error {
		if err := ownerOnly(e, who, "ask"); err != nil {
			return err
		}
		if blank(rueckfrage) {
			return refuse("put the question to the opener in rueckfrage", "rueckfrage is empty")
		}
		if e.Rueckfrage != "" {
			e.Grund = "a second follow-up question"
			e.move(now, who, StateBlocked, "a second follow-up question (at most one per entry): "+rueckfrage)
			return nil
		}
		e.Rueckfrage = rueckfrage
		e.note(now, who, "follow-up question: "+rueckfrage)
		return nil
	})
}

// Reply is the opener's answer to the follow-up question.
func (d *Desk) Reply(who, id, antwort string) (*Entry, error) {
	return d.change(who, id, func(e *Entry, now time.Time) error {
		switch {
		case terminal(e.State):
			return refuse("nothing more can be said on a final entry; open a new one if the question remains", "%s is %s, which is final", e.ID, e.State)
		case e.Opener != who:
			return refuse("only the opener replies to a follow-up question", "%s was opened by %s, not by you (%s)", e.ID, e.Opener, who)
		case e.Rueckfrage == "":
			return refuse("reply once the owner has asked (get shows rueckfrage)", "%s has no follow-up question", e.ID)
		case e.RueckfrageAntwort != "":
			return refuse("one follow-up, one reply: the owner now answers or blocks", "the follow-up on %s is answered already", e.ID)
		case blank(antwort):
			return refuse("give the reply in antwort", "antwort is empty")
		}
		e.RueckfrageAntwort = antwort
		e.note(now, who, "reply to the follow-up: "+antwort)
		return nil
	})
}

// Block is the owner saying that nobody can help: parked, readable, never delivered.
func (d *Desk) Block(who, id, grund string) (*Entry, error) {
	return d.change(who, id, func(e *Entry, now time.Time) error {
		if err := ownerOnly(e, who, "block"); err != nil {
			return err
		}
		if blank(grund) {
			return refuse("say in grund why nobody can help", "grund is empty")
		}
		e.Grund = grund
		e.move(now, who, StateBlocked, grund)
		return nil
	})
}

// Escalate hands the entry to the human, only for one of the five topics.
func (d *Desk) Escalate(who, id, thema string) (*Entry, error) {
	return d.change(who, id, func(e *Entry, now time.Time) error {
		switch {
		case !slices.Contains(Topics, thema):
			return refuse("thema is one of "+strings.Join(Topics, ", ")+"; anything else the agents settle or block",
				"thema %q reaches no human", thema)
		case terminal(e.State):
			return refuse("only an open or claimed entry can be escalated", "%s is %s, which is final", e.ID, e.State)
		case who != e.Opener && who != e.Owner:
			return refuse("the opener or the owner escalates", "you (%s) are neither the opener (%s) nor the owner (%s) of %s",
				who, e.Opener, orNobody(e.Owner), e.ID)
		}
		e.Thema = thema
		e.move(now, who, StateEscalated, "escalated: "+thema)
		return nil
	})
}

func ownerOnly(e *Entry, who, verb string) error {
	switch {
	case e.State != StateClaimed:
		return refuse("claim it first (handoff.claim); only a claimed entry's owner can "+verb,
			"%s is %s, not claimed", e.ID, e.State)
	case e.Owner != who:
		return refuse("only the owner can "+verb+"; the opener can reply to a follow-up or escalate",
			"%s is held by %s, not by you (%s)", e.ID, e.Owner, who)
	}
	return nil
}

func orNobody(s string) string {
	if s == "" {
		return "nobody"
	}
	return s
}

// change runs one verb on one entry under the lock and stores it when the verb changed it.
func (d *Desk) change(who, id string, verb func(*Entry, time.Time) error) (*Entry, error) {
	if who == "" {
		return nil, noCaller
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	e, err := d.load(id)
	if err != nil {
		return nil, err
	}
	before := e.Version
	if err := verb(e, d.now()); err != nil {
		return nil, err
	}
	if e.Version != before {
		if err := d.store.Put(e); err != nil {
			return nil, err
		}
		d.ring()
	}
	return d.view(e), nil
}

func (d *Desk) load(id string) (*Entry, error) {
	e, err := d.store.Get(id)
	if err != nil {
		return nil, err
	}
	if e == nil {
		return nil, refuse("use an id from handoff.open or handoff.list (h-1, h-2, ...)", "there is no entry %q", id)
	}
	return e, nil
}

// Get returns one entry with its whole log.
func (d *Desk) Get(id string) (*Entry, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, err := d.load(id)
	if err != nil {
		return nil, err
	}
	return d.view(e), nil
}

// List returns the entries, optionally of one state and one project, oldest first.
func (d *Desk) List(state, projekt string) ([]*Entry, error) {
	var only []string
	if state != "" {
		if !slices.Contains(states, state) {
			return nil, refuse("state is one of "+strings.Join(states, ", ")+", or leave it out for all", "state %q is not a state", state)
		}
		only = []string{state}
	}
	return d.find(only, projekt)
}

// Attention is what the human sees: escalated entries, nothing else.
func (d *Desk) Attention() ([]*Entry, error) { return d.find([]string{StateEscalated}, "") }

// Holders says who holds what: owner -> ids of the entries it has claimed.
func (d *Desk) Holders() (map[string][]string, error) {
	claimed, err := d.find([]string{StateClaimed}, "")
	if err != nil {
		return nil, err
	}
	holders := map[string][]string{}
	for _, e := range claimed {
		holders[e.Owner] = append(holders[e.Owner], e.ID)
	}
	return holders, nil
}

func (d *Desk) find(only []string, projekt string) ([]*Entry, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	found, err := d.store.Find(only, projekt)
	if err != nil {
		return nil, err
	}
	for i, e := range found {
		found[i] = d.view(e)
	}
	if found == nil {
		found = []*Entry{} // "entries": [] rather than null
	}
	return found, nil
}

// Wait returns the entry when it changes, when it is final, or after timeout; changed says
// which. While the opener waits the entry's priority is blocking. ctx ending (the caller
// cancelled) ends the wait with ctx's error.
func (d *Desk) Wait(ctx context.Context, who, id string, timeout time.Duration) (*Entry, bool, error) {
	d.mu.Lock()
	e, err := d.load(id)
	if err != nil {
		d.mu.Unlock()
		return nil, false, err
	}
	start := e.Version
	opener := who != "" && who == e.Opener
	if opener {
		d.waiting[id]++
		defer d.unwait(id)
	}
	d.mu.Unlock()

	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		d.mu.Lock()
		e, err := d.load(id)
		bell := d.bell
		if err == nil {
			e = d.view(e)
		}
		d.mu.Unlock()
		switch {
		case err != nil:
			return nil, false, err
		case e.Version != start:
			return e, true, nil
		case terminal(e.State):
			return e, false, nil
		}
		select {
		case <-bell:
		case <-timer.C:
			return e, false, nil
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
}

func (d *Desk) unwait(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.waiting[id]--; d.waiting[id] <= 0 {
		delete(d.waiting, id)
	}
}

// Tick applies the clocks at the desk's now: it is called by the module's own ticker, so an
// entry expires when nobody calls. It returns how many entries it changed.
func (d *Desk) Tick() (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	live, err := d.store.Find([]string{StateOpen, StateClaimed}, "")
	if err != nil {
		return 0, err
	}
	changed := 0
	for _, e := range live {
		switch {
		case now.Sub(e.OpenedAt) >= d.limits.Unanswered:
			e.move(now, Module, StateBlocked, fmt.Sprintf("unanswered %s after it was opened (HANDOFF_UNANSWERED_S)", d.limits.Unanswered))
		case e.State == StateClaimed && now.Sub(e.ClaimedAt) >= d.limits.Claim:
			e.ClaimExpiries++
			if e.ClaimExpiries >= 2 {
				e.move(now, Module, StateBlocked, fmt.Sprintf("the second claim ran out (%s without an answer, HANDOFF_CLAIM_S; held by %s)", d.limits.Claim, e.Owner))
			} else {
				why := fmt.Sprintf("claim by %s ran out (%s without an answer, HANDOFF_CLAIM_S); open again", e.Owner, d.limits.Claim)
				e.Owner, e.ClaimedAt = "", time.Time{}
				e.move(now, Module, StateOpen, why)
			}
		default:
			continue
		}
		if err := d.store.Put(e); err != nil {
			return changed, err
		}
		changed++
	}
	if changed > 0 {
		d.ring()
	}
	return changed, nil
}

// view is the entry as a caller sees it: with its derived priority.
func (d *Desk) view(e *Entry) *Entry {
	e.Priority = PriorityBackground
	if d.waiting[e.ID] > 0 && !terminal(e.State) {
		e.Priority = PriorityBlocking
	}
	if e.Log == nil {
		e.Log = []LogLine{}
	}
	return e
}

func (d *Desk) ring() {
	close(d.bell)
	d.bell = make(chan struct{})
}
