package main

import (
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

// The bounds of an answer. Every listing is paged: at most MaxPage entries and MaxPageBytes of
// their JSON a page. With the text limits one entry with its log stays below MaxReplyBytes, so
// no answer comes near the node's line limit (64 MiB) or a NATS message (1 MiB), whatever the
// store holds (an entry stored before the limits is shown clipped to them).
const (
	DefaultPage   = 50
	MaxPage       = 100
	MaxPageBytes  = 512 * 1024
	MaxReplyBytes = 512 * 1024
	// maxTries is how often a verb is tried again on the fresh entry when another process
	// changed it between the read and the write, before the call is refused.
	maxTries = 8
)

// Desk is the handoff seat's state machine over a Store. One lock orders this process's
// changes; the store's fence (Store.Write) orders them against another process's.
type Desk struct {
	mu     sync.Mutex // held by every change and every tick
	store  *Store
	now    func() time.Time
	limits Limits
	humans Humans
	epoch  int64 // this process's turn at the clocks (TakeClock); 0: none taken

	waitMu sync.Mutex           // orders the opener's waits and their leases
	waits  map[int64]*waitLease // the opener's handoff.wait calls in flight here, per entry

	sig sync.Mutex // guards what follows
	// bell is closed and replaced on every change seen (this process's own, or another's that
	// the store poller found), waking every handoff.wait and handoff.watch to look again.
	bell      chan struct{}
	seen      int64         // the last change number this process knows of
	listeners int           // waits and watches in flight: the store is polled faster meanwhile
	nudge     chan struct{} // a listener came: the poller takes the faster pace now
}

// waitLease is this process's share of an entry's priority: how many of the opener's waits are
// in flight here, and until when it stored the entry as blocking.
type waitLease struct {
	count int
	until time.Time
}

func NewDesk(store *Store, now func() time.Time, limits Limits, humans Humans) (*Desk, error) {
	seen, err := store.Seq()
	if err != nil {
		return nil, err
	}
	return &Desk{store: store, now: now, limits: limits, humans: humans, bell: make(chan struct{}), seen: seen,
		waits: map[int64]*waitLease{}, nudge: make(chan struct{}, 1)}, nil
}

// TakeClock makes this process the one that keeps the clocks (Store.TakeClock).
func (d *Desk) TakeClock() error {
	epoch, err := d.store.TakeClock()
	d.epoch = epoch
	return err
}

var noCaller = &Refusal{
	Wrong: "this call has no caller identity (no _meta[\"mesh/caller\"])",
	Right: "handoff takes the opener and the owner only from the caller the node stamps on each call: call it through a mesh node that passes callers (meshctl call, or a request on mesh.seat.handoff.<verb>); list, get, wait, watch, holders and attention work without one",
}

// Open files a new entry for the caller. Every one of the four fields must say something.
func (d *Desk) Open(who Who, projekt, frage, versucht, benoetigt string) (*Entry, error) {
	if who.ID == "" {
		return nil, noCaller
	}
	fields := []struct {
		name  string
		value *string
		limit TextLimit
	}{{"projekt", &projekt, ProjektLimit}, {"frage", &frage, LongLimit}, {"versucht", &versucht, LongLimit}, {"benoetigt", &benoetigt, LongLimit}}
	var missing []string
	for _, f := range fields {
		if blank(*f.value) {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return nil, refuse("an entry needs all four of projekt, frage, versucht (what was tried, so nobody repeats it) and benoetigt, each non-empty",
			"%s empty or missing", strings.Join(missing, ", "))
	}
	for _, f := range fields {
		checked, err := checkText(f.name, *f.value, f.limit)
		if err != nil {
			return nil, err
		}
		*f.value = checked
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	e := &Entry{Projekt: projekt, Frage: frage, Versucht: versucht, Benoetigt: benoetigt, Opener: who.ID, OpenedAt: now}
	e.move(now, who.ID, StateOpen, "opened")
	if err := d.store.Insert(e); err != nil {
		return nil, err
	}
	d.wrote(e.Seq)
	return d.view(e, true)
}

// Claim makes the caller the entry's one owner.
func (d *Desk) Claim(who Who, id string) (*Entry, error) {
	return d.change(who, id, func(e *Entry, now time.Time) error {
		switch {
		case e.State == StateClaimed && e.Owner == who.ID:
			return nil // claiming again what one holds changes nothing
		case e.State == StateClaimed:
			return refuse("wait until it is answered or its claim runs out (it then shows as open in handoff.list), or take another open entry",
				"%s is held by %s", e.ID, e.Owner)
		case terminal(e.State):
			return refuse("claim an entry that is open (handoff.list with state \"open\")", "%s is %s, which is final", e.ID, e.State)
		case e.Opener == who.ID:
			return refuse("another agent claims it; the opener waits (handoff.wait) or answers a follow-up (handoff.reply)",
				"%s was opened by you (%s)", e.ID, who.ID)
		case e.Claims >= MaxClaims:
			return refuse("answer what you can elsewhere, or block it (handoff.block) if nobody can help; it also blocks by itself HANDOFF_UNANSWERED_S after it was opened",
				"%s was claimed %d times already, the most one entry takes", e.ID, e.Claims)
		}
		e.Owner, e.ClaimedAt = who.ID, now
		e.Claims++
		e.move(now, who.ID, StateClaimed, "claimed")
		return nil
	})
}

// Release is the owner giving the entry back: open again, with no owner. It is not an expiry.
func (d *Desk) Release(who Who, id string) (*Entry, error) {
	return d.change(who, id, func(e *Entry, now time.Time) error {
		if err := ownerOnly(e, who, "release it"); err != nil {
			return err
		}
		e.Owner, e.ClaimedAt = "", time.Time{}
		e.move(now, who.ID, StateOpen, "released by its owner; open again")
		return nil
	})
}

// Answer resolves the entry; only its owner can.
func (d *Desk) Answer(who Who, id, antwort string) (*Entry, error) {
	return d.change(who, id, func(e *Entry, now time.Time) error {
		if err := ownerOnly(e, who, "answer"); err != nil {
			return err
		}
		text, err := required("antwort", antwort, "give the answer in antwort")
		if err != nil {
			return err
		}
		e.Antwort = text
		e.move(now, who.ID, StateResolved, "answered")
		return nil
	})
}

// Ask puts the owner's one follow-up question to the opener; a second question blocks the entry.
func (d *Desk) Ask(who Who, id, rueckfrage string) (*Entry, error) {
	return d.change(who, id, func(e *Entry, now time.Time) error {
		if err := ownerOnly(e, who, "ask"); err != nil {
			return err
		}
		text, err := required("rueckfrage", rueckfrage, "put the question to the opener in rueckfrage")
		if err != nil {
			return err
		}
		if e.Rueckfrage != "" {
			e.Grund = "a second follow-up question"
			e.move(now, who.ID, StateBlocked, "a second follow-up question (at most one per entry): "+excerpt(text))
			return nil
		}
		e.Rueckfrage = text
		e.note(now, who.ID, "follow-up question: "+excerpt(text))
		return nil
	})
}

// Reply is the opener's answer to the follow-up question.
func (d *Desk) Reply(who Who, id, antwort string) (*Entry, error) {
	return d.change(who, id, func(e *Entry, now time.Time) error {
		switch {
		case terminal(e.State):
			return refuse("nothing more can be said on a final entry; open a new one if the question remains", "%s is %s, which is final", e.ID, e.State)
		case e.Opener != who.ID:
			return refuse("only the opener replies to a follow-up question", "%s was opened by %s, not by you (%s)", e.ID, e.Opener, who.ID)
		case e.Rueckfrage == "":
			return refuse("reply once the owner has asked (get shows rueckfrage)", "%s has no follow-up question", e.ID)
		case e.RueckfrageAntwort != "":
			return refuse("one follow-up, one reply: the owner now answers or blocks", "the follow-up on %s is answered already", e.ID)
		}
		text, err := required("antwort", antwort, "give the reply in antwort")
		if err != nil {
			return err
		}
		e.RueckfrageAntwort = text
		e.note(now, who.ID, "reply to the follow-up: "+excerpt(text))
		return nil
	})
}

// Block says that nobody can help: parked, readable, never delivered. A claimed entry is
// blocked by its owner; an open one by any caller but its opener (who withdraws instead).
func (d *Desk) Block(who Who, id, grund string) (*Entry, error) {
	return d.change(who, id, func(e *Entry, now time.Time) error {
		switch {
		case terminal(e.State):
			return refuse("a final entry stays as it is; open a new one if something is left", "%s is %s, which is final", e.ID, e.State)
		case e.State == StateOpen && e.Opener == who.ID:
			return refuse("the opener takes an entry back with handoff.withdraw; handoff.block is for an agent who cannot help",
				"%s was opened by you (%s)", e.ID, who.ID)
		case e.State == StateClaimed && e.Owner != who.ID:
			return refuse("only the owner blocks a claimed entry; the opener can withdraw it (handoff.withdraw)",
				"%s is held by %s, not by you (%s)", e.ID, e.Owner, who.ID)
		}
		text, err := required("grund", grund, "say in grund why nobody can help")
		if err != nil {
			return err
		}
		e.Grund = text
		e.move(now, who.ID, StateBlocked, excerpt(text))
		return nil
	})
}

// Withdraw is the opener taking the question back: the entry is blocked, with the reason.
func (d *Desk) Withdraw(who Who, id, grund string) (*Entry, error) {
	return d.change(who, id, func(e *Entry, now time.Time) error {
		switch {
		case terminal(e.State):
			return refuse("a final entry stays as it is", "%s is %s, which is final", e.ID, e.State)
		case e.Opener != who.ID:
			return refuse("only its opener withdraws an entry; an agent who cannot help blocks it (handoff.block)",
				"%s was opened by %s, not by you (%s)", e.ID, e.Opener, who.ID)
		}
		text, err := required("grund", grund, "say in grund why the question is taken back")
		if err != nil {
			return err
		}
		e.Grund = text
		e.move(now, who.ID, StateBlocked, "withdrawn by its opener: "+excerpt(text))
		return nil
	})
}

// Escalate hands the entry to the human, only for one of the five topics.
func (d *Desk) Escalate(who Who, id, thema string) (*Entry, error) {
	return d.change(who, id, func(e *Entry, now time.Time) error {
		switch {
		case !slices.Contains(Topics, thema):
			shown, _ := clip(thema, TextLimit{Chars: 40, Bytes: 160})
			return refuse("thema is one of "+strings.Join(Topics, ", ")+"; anything else the agents settle or block",
				"thema %q reaches no human", shown)
		case terminal(e.State):
			return refuse("only an open or claimed entry can be escalated", "%s is %s, which is final", e.ID, e.State)
		case who.ID != e.Opener && who.ID != e.Owner:
			return refuse("the opener or the owner escalates", "you (%s) are neither the opener (%s) nor the owner (%s) of %s",
				who.ID, e.Opener, orNobody(e.Owner), e.ID)
		}
		e.Thema = thema
		e.move(now, who.ID, StateEscalated, "escalated: "+thema)
		return nil
	})
}

// Decide is a human's answer to an escalated entry: stored, logged, once. The entry stays
// escalated (final); the opener's wait returns with the decision.
func (d *Desk) Decide(who Who, id, antwort string) (*Entry, error) {
	if who.ID != "" && !d.humans.Include(who) {
		return nil, refuse(fmt.Sprintf("a human listed in HANDOFF_HUMANS (here: %s) decides; agents settle or block what is theirs", d.humans),
			"you (%s) are not one of the humans who decide", who.ID)
	}
	return d.change(who, id, func(e *Entry, now time.Time) error {
		switch {
		case e.State != StateEscalated:
			return refuse("only an escalated entry waits for a human (handoff.attention lists them)", "%s is %s, not escalated", e.ID, e.State)
		case !e.DecidedAt.IsZero():
			return refuse("a decision is final; open a new entry if something is left",
				"%s was decided by %s at %s already", e.ID, e.DecidedBy, e.DecidedAt.Format(time.RFC3339))
		}
		text, err := required("antwort", antwort, "give the decision in antwort")
		if err != nil {
			return err
		}
		e.Entscheidung, e.DecidedBy, e.DecidedAt = text, who.ID, now
		e.note(now, who.ID, "decided: "+excerpt(text))
		return nil
	})
}

// required checks a text a verb needs: non-empty and within LongLimit.
func required(field, value, right string) (string, error) {
	if blank(value) {
		return "", refuse(right, "%s is empty", field)
	}
	return checkText(field, value, LongLimit)
}

func ownerOnly(e *Entry, who Who, verb string) error {
	switch {
	case e.State != StateClaimed:
		return refuse("claim it first (handoff.claim); only a claimed entry's owner can "+verb,
			"%s is %s, not claimed", e.ID, e.State)
	case e.Owner != who.ID:
		return refuse("only the owner can "+verb+"; the opener can reply to a follow-up, escalate or withdraw",
			"%s is held by %s, not by you (%s)", e.ID, e.Owner, who.ID)
	}
	return nil
}

func orNobody(s string) string {
	if s == "" {
		return "nobody"
	}
	return s
}

// change runs one verb on one entry and stores what it changed, fenced on the entry's version:
// when another process changed the entry since it was read, the verb runs again on the fresh
// entry (which may now refuse it), never over it.
func (d *Desk) change(who Who, id string, verb func(*Entry, time.Time) error) (*Entry, error) {
	if who.ID == "" {
		return nil, noCaller
	}
	num, err := parseID(id)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for range maxTries {
		e, err := d.load(num)
		if err != nil {
			return nil, err
		}
		was := e.Version
		if err := verb(e, d.now()); err != nil {
			return nil, err
		}
		if !e.changed() {
			return d.view(e, true)
		}
		stored, err := d.store.Write(e, was, 0)
		if err != nil {
			return nil, err
		}
		if stored {
			d.wrote(e.Seq)
			return d.view(e, true)
		}
	}
	return nil, refuse("call again; it is read afresh each time",
		"%s was changed by another process %d times while this call tried to change it", id, maxTries)
}

func (d *Desk) load(num int64) (*Entry, error) {
	e, err := d.store.Load(num)
	if err != nil {
		return nil, err
	}
	if e == nil {
		return nil, refuse("use an id from handoff.open or handoff.list (h-1, h-2, ...)", "there is no entry %q", entryID(num))
	}
	return e, nil
}

// Get returns one entry with its whole log.
func (d *Desk) Get(id string) (*Entry, error) {
	num, err := parseID(id)
	if err != nil {
		return nil, err
	}
	e, err := d.store.loadBounded(num)
	if err != nil {
		return nil, err
	}
	if e == nil {
		return nil, refuse("use an id from handoff.open or handoff.list (h-1, h-2, ...)", "there is no entry %q", id)
	}
	return d.view(e, true)
}

// Tick applies the clocks at the desk's now: the module's own clock calls it when the next
// limit runs out, so an entry expires when nobody calls. It returns how many entries it changed,
// and errLostClock when a newer process keeps the clocks now (this one then stops ticking).
func (d *Desk) Tick() (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	changed := 0
	for {
		nums, err := d.store.Due(now, d.limits, 100)
		if err != nil {
			return changed, err
		}
		progress := 0
		for _, num := range nums {
			e, err := d.store.Load(num)
			if err != nil {
				return changed, err
			}
			if e == nil {
				continue
			}
			was := e.Version
			d.expire(e, now)
			if !e.changed() {
				continue
			}
			stored, err := d.store.Write(e, was, d.epoch)
			if err != nil {
				return changed, err
			}
			if stored { // fenced otherwise: another process changed it; the next look sees it afresh
				changed++
				progress++
				d.wrote(e.Seq)
			}
		}
		if len(nums) < 100 || progress == 0 {
			return changed, nil
		}
	}
}

// expire applies the contract's limits to one entry at now.
func (d *Desk) expire(e *Entry, now time.Time) {
	switch {
	case e.State != StateOpen && e.State != StateClaimed:
	case now.Sub(e.OpenedAt) >= d.limits.Unanswered:
		e.move(now, Module, StateBlocked, fmt.Sprintf("unanswered %s after it was opened (HANDOFF_UNANSWERED_S)", d.limits.Unanswered))
	case e.State == StateClaimed && now.Sub(e.ClaimedAt) >= d.limits.Claim:
		e.ClaimExpiries++
		if e.ClaimExpiries >= 2 {
			e.move(now, Module, StateBlocked, fmt.Sprintf("the second claim ran out (%s without an answer, HANDOFF_CLAIM_S; held by %s)", d.limits.Claim, e.Owner))
			return
		}
		why := fmt.Sprintf("claim by %s ran out (%s without an answer, HANDOFF_CLAIM_S); open again", e.Owner, d.limits.Claim)
		e.Owner, e.ClaimedAt = "", time.Time{}
		e.move(now, Module, StateOpen, why)
	}
}

// view is the entry as a caller sees it: its derived priority and age, each text within its
// limit (clipped names what was cut), and its log when asked for.
func (d *Desk) view(e *Entry, withLog bool) (*Entry, error) {
	v := *e
	now := d.now()
	v.pending, v.Log, v.Clipped = nil, nil, nil
	v.Priority = PriorityBackground
	if v.blockingUntil.After(now) && !v.settled() {
		v.Priority = PriorityBlocking
	}
	v.AgeS = int64(now.Sub(v.OpenedAt) / time.Second)
	for _, f := range []struct {
		name  string
		text  *string
		limit TextLimit
	}{
		{"projekt", &v.Projekt, ProjektLimit}, {"frage", &v.Frage, LongLimit}, {"versucht", &v.Versucht, LongLimit},
		{"benoetigt", &v.Benoetigt, LongLimit}, {"opener", &v.Opener, CallerIDLimit}, {"owner", &v.Owner, CallerIDLimit},
		{"antwort", &v.Antwort, LongLimit}, {"rueckfrage", &v.Rueckfrage, LongLimit},
		{"rueckfrage_antwort", &v.RueckfrageAntwort, LongLimit}, {"grund", &v.Grund, LongLimit},
		{"thema", &v.Thema, ProjektLimit}, {"entscheidung", &v.Entscheidung, LongLimit}, {"decided_by", &v.DecidedBy, CallerIDLimit},
	} {
		if cut, clipped := clip(*f.text, f.limit); clipped {
			*f.text = cut
			v.Clipped = append(v.Clipped, f.name)
		}
	}
	if withLog {
		lines, err := d.store.Log(e.num)
		if err != nil {
			return nil, err
		}
		v.Log = lines
	}
	return &v, nil
}
