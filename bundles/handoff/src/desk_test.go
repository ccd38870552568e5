package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	meshsdk "mesh.local/sdk/go"
)

// clock is a fake now the tests move by hand; the desk never reads the wall clock itself.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) pass(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newClock() *clock { return &clock{t: time.Date(2026, 9, 9, 12, 0, 0, 0, time.UTC)} }
func limits() Limits   { return Limits{Unanswered: 30 * time.Minute, Claim: 10 * time.Minute} }

func desk(t *testing.T, c *clock) *Desk { return deskOn(t, t.TempDir(), c) }

// deskOn opens a desk on the store in dir: two of them on one dir are two processes' worth of
// desks (each its own SQLite connection), which is what the fencing tests need.
func deskOn(t *testing.T, dir string, c *clock) *Desk {
	t.Helper()
	d, err := NewDesk(store(t, dir), c.now, limits(), Humans{"@local", "OPS/samuel"})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func store(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

var (
	alice  = Who{ID: "ALICE/alice", Account: "ALICE"}
	bob    = Who{ID: "BOB/bob", Account: "BOB"}
	carol  = Who{ID: "CAROL", Account: "CAROL"}
	local  = Who{ID: "MESH/operator", Account: "MESH", Local: true}
	samuel = Who{ID: "OPS/samuel", Account: "OPS"}
)

func refused(t *testing.T, err error, want ...string) {
	t.Helper()
	var r *Refusal
	if !errors.As(err, &r) {
		t.Fatalf("want a refusal, got %v", err)
	}
	for _, w := range want {
		if !strings.Contains(r.Error(), w) {
			t.Fatalf("refusal %q does not say %q", r.Error(), w)
		}
	}
	if r.Wrong == "" || r.Right == "" {
		t.Fatalf("refusal %+v must say what was wrong and what would be right", r)
	}
}

func open(t *testing.T, d *Desk) *Entry {
	t.Helper()
	return must[*Entry](t)(d.Open(alice, "p", "what is X?", "read the docs", "the value of X"))
}

func logStates(e *Entry) string {
	var s []string
	for _, l := range e.Log {
		s = append(s, l.From+">"+l.To)
	}
	return strings.Join(s, " ")
}

func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func ids(entries []*Entry) string {
	var s []string
	for _, e := range entries {
		s = append(s, e.ID)
	}
	return strings.Join(s, " ")
}

func list(t *testing.T, d *Desk, q ListQuery) Page {
	t.Helper()
	return must[Page](t)(d.List(q))
}

func TestOpenNeedsAllFourFieldsAndACaller(t *testing.T) {
	d := desk(t, newClock())
	_, err := d.Open(alice, "p", " ", "", "x")
	refused(t, err, "frage, versucht empty or missing", "all four")
	_, err = d.Open(Who{}, "p", "f", "v", "b")
	refused(t, err, "no caller identity", "mesh/caller")
	e := open(t, d)
	if e.ID != "h-1" || e.State != StateOpen || e.Opener != alice.ID || e.Owner != "" || e.Priority != PriorityBackground || e.Version != 1 || e.LogLines != 1 {
		t.Fatalf("opened %+v", e)
	}
	if e2 := open(t, d); e2.ID != "h-2" {
		t.Fatalf("second id %s", e2.ID)
	}
	for _, bad := range []string{"h-0", "h-01", "x-1", "h-", "h-+1", "h-99999999999999999999", strings.Repeat("h", 1000)} {
		_, err := d.Get(bad)
		refused(t, err, "there is no entry", "h-1, h-2")
	}
}

func TestTextBounds(t *testing.T) {
	d := desk(t, newClock())
	// NFC: "é" as e + combining acute is one character, stored composed.
	decomposed := strings.Repeat("e\u0301", LongLimit.Chars)
	e := must[*Entry](t)(d.Open(alice, "p", decomposed, "v", "b"))
	if e.Frage != strings.Repeat("é", LongLimit.Chars) {
		t.Fatalf("not stored in NFC: %q…", e.Frage[:10])
	}
	_, err := d.Open(alice, "p", decomposed+"x", "v", "b")
	refused(t, err, "frage has 8001 characters", "at most 8000 characters and 16384 bytes", "NFC")
	// Bytes bind for four-byte characters: 4097 emoji are 16388 bytes.
	_, err = d.Open(alice, "p", "f", strings.Repeat("😀", 4097), "b")
	refused(t, err, "versucht has 16388 bytes", "16384 bytes")
	_, err = d.Open(alice, strings.Repeat("p", 101), "f", "v", "b")
	refused(t, err, "projekt has 101 characters", "at most 100 characters and 400 bytes")
	_, err = d.Open(alice, "p", "a"+strings.Repeat("\x1c", 3998)+"b", "v", "b")
	refused(t, err, "frage holds the control character U+001C at character 2", "newlines (\\n) and tabs (\\t)")
	_, err = d.Open(alice, "p", "f", "v", "b\r\n")
	refused(t, err, "benoetigt holds the control character U+000D")
	_, err = d.Open(alice, "p", strings.Repeat("x", 1<<20), "v", "b") // the flood: refused before any work
	refused(t, err, "frage has 1048576 bytes")
	ok := must[*Entry](t)(d.Open(alice, "p", "line one\n\tline two", "v", "b"))
	if ok.Frage != "line one\n\tline two" {
		t.Fatalf("newline and tab: %q", ok.Frage)
	}
	must[*Entry](t)(d.Claim(bob, ok.ID))
	_, err = d.Answer(bob, ok.ID, strings.Repeat("a", 8001))
	refused(t, err, "antwort has 8001 characters")
	_, err = d.Ask(bob, ok.ID, "\x00")
	refused(t, err, "rueckfrage holds the control character U+0000")
	_, err = d.Block(bob, ok.ID, strings.Repeat("ü", 8001))
	refused(t, err, "grund has 8001 characters")
	if got := must[*Entry](t)(d.Get(ok.ID)); got.State != StateClaimed || got.LogLines != 2 {
		t.Fatalf("a refused text changed the entry: %+v", got)
	}
	// A follow-up's text is in its field; the log line holds an excerpt.
	long := strings.Repeat("w", 5000)
	asked := must[*Entry](t)(d.Ask(bob, ok.ID, long))
	if asked.Rueckfrage != long || len([]rune(asked.Log[2].Why)) != len("follow-up question: ")+WhyExcerpt+1 {
		t.Fatalf("rueckfrage %d, why %d", len(asked.Rueckfrage), len(asked.Log[2].Why))
	}
}

func TestClip(t *testing.T) {
	l := TextLimit{Chars: 3, Bytes: 7}
	for in, want := range map[string]string{"abcd": "abc", "ab": "ab", "äöüß": "äöü", "😀😀": "😀", "a😀😀": "a😀"} {
		if got, _ := clip(in, l); got != want {
			t.Errorf("clip(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestTheLargestEntryFitsAReply builds the largest entry the rules allow: every text at its
// limit in a character JSON writes as six bytes, claimed the most times, with a follow-up,
// a reply, an escalation and a decision, and checks its answer and a full page of such entries.
func TestTheLargestEntryFitsAReply(t *testing.T) {
	c := newClock()
	d := desk(t, c)
	worst := strings.Repeat("<", LongLimit.Chars) // "\u003c" in Go's JSON
	var last *Entry
	for range MaxPage + 1 {
		e := must[*Entry](t)(d.Open(alice, strings.Repeat("&", ProjektLimit.Chars), worst, worst, worst))
		for i := range MaxClaims - 1 {
			owner := Who{ID: fmt.Sprintf("%s/%d", strings.Repeat("B", 250), i), Account: strings.Repeat("B", 250)}
			must[*Entry](t)(d.Claim(owner, e.ID))
			must[*Entry](t)(d.Release(owner, e.ID))
		}
		must[*Entry](t)(d.Claim(bob, e.ID))
		must[*Entry](t)(d.Ask(bob, e.ID, worst))
		must[*Entry](t)(d.Reply(alice, e.ID, worst))
		must[*Entry](t)(d.Escalate(bob, e.ID, "geld"))
		last = must[*Entry](t)(d.Decide(local, e.ID, worst))
	}
	got := must[*Entry](t)(d.Get(last.ID))
	body := must[[]byte](t)(json.Marshal(got))
	if len(got.Log) != 1+2*MaxClaims-1+4 || len(body) > MaxReplyBytes {
		t.Fatalf("the largest entry: %d log lines, %d bytes (bound %d)", len(got.Log), len(body), MaxReplyBytes)
	}
	t.Logf("the largest entry answers in %d bytes (bound %d)", len(body), MaxReplyBytes)
	seen := 0
	cursor := ""
	for pages := 0; ; pages++ {
		page := list(t, d, ListQuery{Limit: MaxPage, Cursor: cursor})
		size := len(must[[]byte](t)(json.Marshal(page)))
		if size > MaxPageBytes+1024 || len(page.Entries) == 0 {
			t.Fatalf("page %d: %d entries, %d bytes", pages, len(page.Entries), size)
		}
		seen += len(page.Entries)
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	if seen != MaxPage+1 {
		t.Fatalf("paged through %d of %d", seen, MaxPage+1)
	}
}

// TestAStoreWithHugeFieldsAnswersClipped is the flood of issue 25 as it may already sit in a
// store (written before the limits): every answer stays bounded and the store keeps it whole.
func TestAStoreWithHugeFieldsAnswersClipped(t *testing.T) {
	d := desk(t, newClock())
	huge := strings.Repeat("x", 1<<20)
	for range 70 {
		e := open(t, d)
		if _, err := d.store.db.Exec(`UPDATE entry SET frage = ?, versucht = ? WHERE num = ?`, huge, huge, e.num); err != nil {
			t.Fatal(err)
		}
	}
	page := list(t, d, ListQuery{})
	size := len(must[[]byte](t)(json.Marshal(page)))
	if len(page.Entries) == 0 || size > MaxPageBytes+1024 || page.NextCursor == "" {
		t.Fatalf("%d entries, %d bytes, cursor %q", len(page.Entries), size, page.NextCursor)
	}
	got := must[*Entry](t)(d.Get("h-1"))
	if len(got.Frage) != LongLimit.Chars || strings.Join(got.Clipped, ",") != "frage,versucht" {
		t.Fatalf("clipped %v, frage %d bytes", got.Clipped, len(got.Frage))
	}
	must[*Entry](t)(d.Claim(bob, "h-1")) // a change writes only what it changed
	var stored int
	if err := d.store.db.QueryRow(`SELECT length(frage) FROM entry WHERE num = 1`).Scan(&stored); err != nil || stored != 1<<20 {
		t.Fatalf("the stored frage is %d bytes, %v", stored, err)
	}
}

func TestClaimAnswerResolves(t *testing.T) {
	d := desk(t, newClock())
	e := open(t, d)
	_, err := d.Claim(alice, e.ID)
	refused(t, err, "opened by you")
	_, err = d.Answer(bob, e.ID, "42")
	refused(t, err, "is open, not claimed", "claim it first")
	e = must[*Entry](t)(d.Claim(bob, e.ID))
	if e.State != StateClaimed || e.Owner != bob.ID || e.Claims != 1 {
		t.Fatalf("claimed %+v", e)
	}
	again := must[*Entry](t)(d.Claim(bob, e.ID)) // again by the owner: nothing changes
	if again.Version != e.Version {
		t.Fatalf("claiming again changed the entry: %d -> %d", e.Version, again.Version)
	}
	_, err = d.Claim(carol, e.ID)
	refused(t, err, "held by BOB/bob")
	_, err = d.Answer(carol, e.ID, "41")
	refused(t, err, "not by you (CAROL)", "only the owner")
	h := must[HoldersPage](t)(d.Holders("", 0))
	if len(h.Holders) != 1 || h.Holders[0].Owner != bob.ID || h.Holders[0].Entries[0].ID != "h-1" {
		t.Fatalf("holders %+v", h)
	}
	_, err = d.Answer(bob, e.ID, "  ")
	refused(t, err, "antwort is empty")
	e = must[*Entry](t)(d.Answer(bob, e.ID, "42"))
	if e.State != StateResolved || e.Antwort != "42" || logStates(e) != ">open open>claimed claimed>resolved" {
		t.Fatalf("answered %+v / %s", e, logStates(e))
	}
	if e.Log[1].Who != bob.ID || e.Log[2].Who != bob.ID || e.Log[0].Who != alice.ID {
		t.Fatalf("log who %+v", e.Log)
	}
	_, err = d.Claim(carol, e.ID)
	refused(t, err, "resolved, which is final")
	if h := must[HoldersPage](t)(d.Holders("", 0)); len(h.Holders) != 0 {
		t.Fatalf("holders after resolve %v", h)
	}
	_, err = d.Get("h-99")
	refused(t, err, `no entry "h-99"`)
}

func TestReleaseWithdrawAndBlockingAnOpenEntry(t *testing.T) {
	d := desk(t, newClock())
	e := open(t, d)
	_, err := d.Release(bob, e.ID)
	refused(t, err, "open, not claimed")
	must[*Entry](t)(d.Claim(bob, e.ID))
	_, err = d.Release(carol, e.ID)
	refused(t, err, "held by BOB/bob, not by you (CAROL)")
	e = must[*Entry](t)(d.Release(bob, e.ID))
	if e.State != StateOpen || e.Owner != "" || e.ClaimExpiries != 0 || !strings.Contains(e.Log[2].Why, "released by its owner") || e.Log[2].Who != bob.ID {
		t.Fatalf("released %+v", e)
	}
	// Claims are bounded; releases count as claims ended.
	for i := 1; i < MaxClaims; i++ {
		must[*Entry](t)(d.Claim(carol, e.ID))
		must[*Entry](t)(d.Release(carol, e.ID))
	}
	_, err = d.Claim(carol, e.ID)
	refused(t, err, "claimed 10 times already")

	// Block on an open entry: anyone but the opener.
	_, err = d.Block(alice, e.ID, "nobody")
	refused(t, err, "opened by you", "handoff.withdraw")
	blocked := must[*Entry](t)(d.Block(carol, e.ID, "nobody here knows X"))
	if blocked.State != StateBlocked || blocked.Grund != "nobody here knows X" || blocked.Log[len(blocked.Log)-1].Who != carol.ID {
		t.Fatalf("blocked %+v", blocked)
	}
	// Withdraw: the opener only, open or claimed.
	w := open(t, d)
	must[*Entry](t)(d.Claim(bob, w.ID))
	_, err = d.Withdraw(bob, w.ID, "mine")
	refused(t, err, "only its opener withdraws")
	_, err = d.Withdraw(alice, w.ID, "")
	refused(t, err, "grund is empty")
	w = must[*Entry](t)(d.Withdraw(alice, w.ID, "found it myself"))
	if w.State != StateBlocked || w.Grund != "found it myself" || w.Log[2].Why != "withdrawn by its opener: found it myself" {
		t.Fatalf("withdrawn %+v", w)
	}
	_, err = d.Withdraw(alice, w.ID, "again")
	refused(t, err, "blocked, which is final")
	if att := must[AttentionPage](t)(d.Attention("", 0)); len(att.Entries) != 0 {
		t.Fatal("a withdrawn entry reached the human")
	}
}

func TestOneFollowUpThenTheSecondBlocks(t *testing.T) {
	d := desk(t, newClock())
	e := open(t, d)
	must[*Entry](t)(d.Claim(bob, e.ID))
	_, err := d.Reply(alice, e.ID, "early")
	refused(t, err, "no follow-up question")
	e = must[*Entry](t)(d.Ask(bob, e.ID, "which X?"))
	if e.Rueckfrage != "which X?" || e.State != StateClaimed {
		t.Fatalf("asked %+v", e)
	}
	_, err = d.Reply(bob, e.ID, "me?")
	refused(t, err, "opened by ALICE/alice, not by you")
	must[*Entry](t)(d.Reply(alice, e.ID, "the big one"))
	_, err = d.Reply(alice, e.ID, "again")
	refused(t, err, "answered already")
	e = must[*Entry](t)(d.Ask(bob, e.ID, "and which colour?"))
	if e.State != StateBlocked || !strings.Contains(e.Log[len(e.Log)-1].Why, "second follow-up") {
		t.Fatalf("second ask %+v", e)
	}
	if got := logStates(e); got != ">open open>claimed claimed>claimed claimed>claimed claimed>blocked" {
		t.Fatalf("log %s", got)
	}
	if att := must[AttentionPage](t)(d.Attention("", 0)); len(att.Entries) != 0 {
		t.Fatalf("a blocked entry reached the human: %v", att)
	}
}

func TestBlockAndEscalate(t *testing.T) {
	d := desk(t, newClock())
	a, b := open(t, d), open(t, d)
	must[*Entry](t)(d.Claim(bob, a.ID))
	_, err := d.Block(bob, a.ID, "")
	refused(t, err, "grund is empty")
	_, err = d.Block(carol, a.ID, "not mine")
	refused(t, err, "only the owner blocks a claimed entry")
	a = must[*Entry](t)(d.Block(bob, a.ID, "nobody can reach the server"))
	if a.State != StateBlocked || a.Grund != "nobody can reach the server" {
		t.Fatalf("blocked %+v", a)
	}
	_, err = d.Escalate(alice, b.ID, "langeweile")
	refused(t, err, `"langeweile" reaches no human`, "geld, aussenwirkung, irreversibel, zugangsdaten, prioritaet_scope")
	_, err = d.Escalate(carol, b.ID, "geld")
	refused(t, err, "neither the opener", "owner (nobody)")
	_, err = d.Escalate(alice, a.ID, "geld")
	refused(t, err, "blocked, which is final")
	for _, topic := range Topics {
		e := open(t, d)
		must[*Entry](t)(d.Claim(bob, e.ID))
		if e = must[*Entry](t)(d.Escalate(bob, e.ID, topic)); e.State != StateEscalated || e.Thema != topic {
			t.Fatalf("escalated %+v", e)
		}
	}
	b = must[*Entry](t)(d.Escalate(alice, b.ID, "zugangsdaten"))
	att := must[AttentionPage](t)(d.Attention("", 0))
	if len(att.Entries) != 6 || att.Entries[0].ID != b.ID || att.Undecided != 6 {
		t.Fatalf("attention %+v", att)
	}
	for _, e := range att.Entries {
		if e.State != StateEscalated || e.Log != nil {
			t.Fatalf("attention holds a %s entry, log %v", e.State, e.Log)
		}
	}
	_, err = d.List(ListQuery{State: "done"})
	refused(t, err, `state "done" is not a state`)
	if got := list(t, d, ListQuery{State: StateBlocked, Projekt: "p"}); ids(got.Entries) != a.ID {
		t.Fatalf("list blocked %v", ids(got.Entries))
	}
	if got := list(t, d, ListQuery{Projekt: "other"}); len(got.Entries) != 0 {
		t.Fatalf("list of another project %v", ids(got.Entries))
	}
}

func TestTheHumanDecidesAndTheWaitingOpenerHearsIt(t *testing.T) {
	d := desk(t, newClock())
	e := open(t, d)
	e = must[*Entry](t)(d.Escalate(alice, e.ID, "geld"))
	quiet := must[*Entry](t)(d.Escalate(alice, open(t, d).ID, "irreversibel"))
	// A wait already in flight on the escalated entry returns with the decision.
	type got struct {
		e       *Entry
		changed bool
		err     error
	}
	done := make(chan got, 1)
	go func() {
		w, changed, err := d.Wait(context.Background(), alice, e.ID, 10*time.Second)
		done <- got{w, changed, err}
	}()
	waitFor(t, func() bool { return must[*Entry](t)(d.Get(e.ID)).Priority == PriorityBlocking })
	_, err := d.Decide(bob, e.ID, "yes")
	refused(t, err, "not one of the humans", "HANDOFF_HUMANS (here: @local,OPS/samuel)")
	_, err = d.Decide(local, open(t, d).ID, "yes")
	refused(t, err, "is open, not escalated")
	_, err = d.Decide(samuel, e.ID, " ")
	refused(t, err, "antwort is empty")
	decided := must[*Entry](t)(d.Decide(samuel, e.ID, "spend at most 200 EUR"))
	if decided.State != StateEscalated || decided.Entscheidung != "spend at most 200 EUR" || decided.DecidedBy != samuel.ID || decided.DecidedAt.IsZero() {
		t.Fatalf("decided %+v", decided)
	}
	if last := decided.Log[len(decided.Log)-1]; last.From != StateEscalated || last.To != StateEscalated || last.Who != samuel.ID || last.Why != "decided: spend at most 200 EUR" {
		t.Fatalf("log %+v", last)
	}
	r := <-done
	if r.err != nil || !r.changed || r.e.Entscheidung != "spend at most 200 EUR" || r.e.Priority != PriorityBackground {
		t.Fatalf("the opener's wait returned %+v", r)
	}
	_, err = d.Decide(local, e.ID, "no")
	refused(t, err, "decided by OPS/samuel", "a decision is final")
	// A wait on a decided entry returns at once; the attention list shows undecided first.
	start := time.Now()
	if _, changed, _ := d.Wait(context.Background(), alice, e.ID, time.Minute); changed || time.Since(start) > time.Second {
		t.Fatal("a wait on a decided entry did not return at once")
	}
	att := must[AttentionPage](t)(d.Attention("", 0))
	if ids(att.Entries) != quiet.ID+" "+e.ID || att.Undecided != 1 {
		t.Fatalf("attention %s, undecided %d", ids(att.Entries), att.Undecided)
	}
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestClaimExpiresBackToOpenThenBlocked(t *testing.T) {
	c := newClock()
	d := desk(t, c)
	e := open(t, d)
	must[*Entry](t)(d.Claim(bob, e.ID))
	if due := must[time.Time](t)(d.store.NextDue(d.limits)); !due.Equal(c.now().Add(10 * time.Minute)) {
		t.Fatalf("next due %s", due)
	}
	c.pass(10*time.Minute - time.Second)
	if n, _ := d.Tick(); n != 0 {
		t.Fatal("expired early")
	}
	c.pass(time.Second)
	if n, _ := d.Tick(); n != 1 {
		t.Fatal("did not expire")
	}
	e = must[*Entry](t)(d.Get(e.ID))
	last := e.Log[len(e.Log)-1]
	if e.State != StateOpen || e.Owner != "" || e.ClaimExpiries != 1 || last.Who != Module || !strings.Contains(last.Why, "claim by BOB/bob ran out") {
		t.Fatalf("after the first expiry %+v", e)
	}
	// Open again: the next limit is the unanswered one, 30 minutes from the opening.
	if due := must[time.Time](t)(d.store.NextDue(d.limits)); !due.Equal(e.OpenedAt.Add(30 * time.Minute)) {
		t.Fatalf("next due %s", due)
	}
	must[*Entry](t)(d.Claim(carol, e.ID))
	c.pass(10 * time.Minute)
	d.Tick()
	e = must[*Entry](t)(d.Get(e.ID))
	if e.State != StateBlocked || !strings.Contains(e.Log[len(e.Log)-1].Why, "second claim ran out") {
		t.Fatalf("after the second expiry %+v", e)
	}
	if logStates(e) != ">open open>claimed claimed>open open>claimed claimed>blocked" {
		t.Fatalf("log %s", logStates(e))
	}
	if due := must[time.Time](t)(d.store.NextDue(d.limits)); !due.IsZero() {
		t.Fatalf("nothing is live, yet next due %s", due)
	}
}

func TestUnansweredBlocksOpenOrClaimed(t *testing.T) {
	c := newClock()
	d := desk(t, c)
	quiet, held := open(t, d), open(t, d)
	c.pass(25 * time.Minute)
	must[*Entry](t)(d.Claim(bob, held.ID)) // claimed late: the 30 minutes count from the opening
	c.pass(5 * time.Minute)
	if n, _ := d.Tick(); n != 2 {
		t.Fatalf("changed %d, want 2", n)
	}
	for _, id := range []string{quiet.ID, held.ID} {
		e := must[*Entry](t)(d.Get(id))
		if e.State != StateBlocked || e.Log[len(e.Log)-1].Who != Module || !strings.Contains(e.Log[len(e.Log)-1].Why, "unanswered 30m0s") {
			t.Fatalf("%s: %+v", id, e)
		}
	}
	c.pass(time.Hour)
	if n, _ := d.Tick(); n != 0 {
		t.Fatal("a final entry changed again")
	}
}

func TestWaitMakesItBlockingStoredAndListedFirst(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	d := deskOn(t, dir, c)
	older, e := open(t, d), open(t, d)
	other := deskOn(t, dir, c) // another process on the same file sees the stored priority
	type got struct {
		e       *Entry
		changed bool
		err     error
	}
	done := make(chan got, 1)
	go func() {
		e, changed, err := d.Wait(context.Background(), alice, e.ID, 5*time.Second)
		done <- got{e, changed, err}
	}()
	waitFor(t, func() bool { return must[*Entry](t)(other.Get(e.ID)).Priority == PriorityBlocking })
	if l := list(t, other, ListQuery{State: StateOpen}); ids(l.Entries) != e.ID+" "+older.ID || l.Entries[0].Priority != PriorityBlocking {
		t.Fatalf("list %s, first %s", ids(l.Entries), l.Entries[0].Priority)
	}
	must[*Entry](t)(other.Claim(bob, e.ID))
	d.saw(must[int64](t)(d.store.Seq())) // what the store poller does in the child
	r := <-done
	if r.err != nil || !r.changed || r.e.State != StateClaimed {
		t.Fatalf("wait returned %+v", r)
	}
	if p := must[*Entry](t)(other.Get(e.ID)).Priority; p != PriorityBackground {
		t.Fatalf("after the wait priority is %s", p)
	}
	if l := list(t, d, ListQuery{}); ids(l.Entries) != older.ID+" "+e.ID {
		t.Fatalf("list after the wait %s", ids(l.Entries))
	}

	// Someone else's wait does not make it blocking; a timeout returns unchanged.
	w, changed, err := d.Wait(context.Background(), carol, e.ID, 50*time.Millisecond)
	if err != nil || changed || w.Priority != PriorityBackground {
		t.Fatalf("timeout wait %+v %v %v", w, changed, err)
	}
	// A cancelled wait ends with ctx's error.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := d.Wait(ctx, alice, e.ID, time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v", err)
	}
	// The lease outlives a process that died waiting only up to the wait's timeout.
	if _, err := d.store.SetBlocking(older.num, c.now().Add(time.Minute), nil); err != nil {
		t.Fatal(err)
	}
	if p := must[*Entry](t)(d.Get(older.ID)).Priority; p != PriorityBlocking {
		t.Fatalf("leased: %s", p)
	}
	c.pass(time.Minute)
	if p := must[*Entry](t)(d.Get(older.ID)).Priority; p != PriorityBackground {
		t.Fatalf("after the lease: %s", p)
	}
	// A final entry returns at once.
	must[*Entry](t)(d.Answer(bob, e.ID, "x"))
	start := time.Now()
	if w, changed, _ := d.Wait(context.Background(), alice, e.ID, time.Minute); changed || w.State != StateResolved || time.Since(start) > time.Second {
		t.Fatalf("wait on a final entry %+v %v", w, changed)
	}
}

func TestListFiltersAndPages(t *testing.T) {
	c := newClock()
	d := desk(t, c)
	var opened []*Entry
	for i := range 7 {
		who := alice
		if i%2 == 1 {
			who = carol
		}
		opened = append(opened, must[*Entry](t)(d.Open(who, "p", fmt.Sprintf("q%d", i), "v", "b")))
		c.pass(time.Minute)
	}
	must[*Entry](t)(d.Claim(bob, opened[0].ID))
	must[*Entry](t)(d.Claim(bob, opened[3].ID))
	if got := list(t, d, ListQuery{Owner: bob.ID}); ids(got.Entries) != "h-1 h-4" {
		t.Fatalf("owner %s", ids(got.Entries))
	}
	if got := list(t, d, ListQuery{Opener: carol.ID}); ids(got.Entries) != "h-2 h-4 h-6" {
		t.Fatalf("opener %s", ids(got.Entries))
	}
	since := opened[5].OpenedAt.Format(time.RFC3339Nano)
	if got := list(t, d, ListQuery{Since: since}); ids(got.Entries) != "h-6 h-7" {
		t.Fatalf("since %s", ids(got.Entries))
	}
	_, err := d.List(ListQuery{Since: "yesterday"})
	refused(t, err, `since "yesterday" is not a time`, "RFC 3339")
	_, err = d.List(ListQuery{Limit: 101})
	refused(t, err, "limit 101 is out of range")
	_, err = d.List(ListQuery{Cursor: "x.y"})
	refused(t, err, `cursor "x.y" is not one this desk gave`)
	_, err = d.List(ListQuery{Owner: "a\x00b"})
	refused(t, err, "owner holds a control character")
	if got := list(t, d, ListQuery{}); got.Entries[0].Log != nil || got.Entries[0].LogLines != 2 {
		t.Fatalf("a listing carries the log: %+v", got.Entries[0])
	}
	// Paging: every entry once, while entries are added between pages.
	var all []string
	cursor := ""
	for {
		page := list(t, d, ListQuery{Limit: 3, Cursor: cursor})
		all = append(all, ids(page.Entries))
		if len(all) == 1 {
			open(t, d) // h-8, added after the first page: it comes on a later one
		}
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	if got := strings.Join(all, " "); got != "h-1 h-2 h-3 h-4 h-5 h-6 h-7 h-8" {
		t.Fatalf("pages %q", got)
	}
}

func TestHoldersGroupsAndPages(t *testing.T) {
	d := desk(t, newClock())
	for range 5 {
		open(t, d)
	}
	must[*Entry](t)(d.Claim(carol, "h-2"))
	must[*Entry](t)(d.Claim(bob, "h-3"))
	must[*Entry](t)(d.Claim(bob, "h-1"))
	must[*Entry](t)(d.Claim(carol, "h-5"))
	page := must[HoldersPage](t)(d.Holders("", 3))
	if len(page.Holders) != 2 || page.Holders[0].Owner != bob.ID || len(page.Holders[0].Entries) != 2 ||
		page.Holders[0].Entries[0].ID != "h-1" || page.Holders[1].Entries[0].ID != "h-2" || page.NextCursor == "" {
		t.Fatalf("first page %+v", page)
	}
	rest := must[HoldersPage](t)(d.Holders(page.NextCursor, 3))
	if len(rest.Holders) != 1 || rest.Holders[0].Owner != carol.ID || rest.Holders[0].Entries[0].ID != "h-5" || rest.NextCursor != "" {
		t.Fatalf("second page %+v", rest)
	}
	_, err := d.Holders("!!.1", 0)
	refused(t, err, "not one this desk gave")
}

func TestWatch(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	d := deskOn(t, dir, c)
	ctx := context.Background()
	open(t, d)
	// after 0: what already matches comes at once.
	first := must[WatchPage](t)(d.Watch(ctx, Filter{States: []string{StateOpen}}, 0, 0, time.Minute))
	if ids(first.Entries) != "h-1" || first.TimedOut || first.After != 1 {
		t.Fatalf("first watch %+v", first)
	}
	// Nothing new: the timeout, with a cursor to go on from.
	quiet := must[WatchPage](t)(d.Watch(ctx, Filter{States: []string{StateOpen}}, first.After, 0, 30*time.Millisecond))
	if !quiet.TimedOut || len(quiet.Entries) != 0 || quiet.After != first.After {
		t.Fatalf("quiet watch %+v", quiet)
	}
	// A change by another process on the same file wakes it (through the poller).
	other := deskOn(t, dir, c)
	pollCtx, stop := context.WithCancel(ctx)
	defer stop()
	go d.PollStore(pollCtx, time.Second)
	done := make(chan WatchPage, 1)
	go func() {
		page, err := d.Watch(ctx, Filter{States: []string{StateOpen}}, first.After, 0, 10*time.Second)
		if err != nil {
			t.Error(err)
		}
		done <- page
	}()
	time.Sleep(100 * time.Millisecond) // the watch waits; a claim (not open) does not match
	must[*Entry](t)(other.Claim(bob, "h-1"))
	started := time.Now()
	must[*Entry](t)(other.Open(carol, "p", "new work", "v", "b"))
	woke := <-done
	if ids(woke.Entries) != "h-2" || woke.Entries[0].State != StateOpen || woke.After <= first.After {
		t.Fatalf("woke %+v", woke)
	}
	t.Logf("a change in another process woke the watch after %s", time.Since(started))
	// Paging: a cut page's after goes on from the last entry shown.
	for range 4 {
		open(t, d)
	}
	page := must[WatchPage](t)(d.Watch(ctx, Filter{}, 0, 2, time.Second))
	next := must[WatchPage](t)(d.Watch(ctx, Filter{}, page.After, 10, time.Second))
	if ids(page.Entries)+" "+ids(next.Entries) != "h-1 h-2 h-3 h-4 h-5 h-6" {
		t.Fatalf("paged watch %s | %s", ids(page.Entries), ids(next.Entries))
	}
	_, err := d.Watch(ctx, Filter{}, 10_000, 0, time.Second)
	refused(t, err, "after 10000 is not a change of this store", "last change is")
}

// TestFencedWritesAcrossTwoProcesses: two desks on one file (two connections, as two processes
// have) change the same entry at once; none is applied over the other.
func TestFencedWritesAcrossTwoProcesses(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	one, two := deskOn(t, dir, c), deskOn(t, dir, c)
	e := open(t, one)

	// A write computed from a stale read is refused by the store.
	stale := must[*Entry](t)(one.store.Load(e.num))
	must[*Entry](t)(two.Claim(bob, e.ID))
	stale.Owner, stale.State = carol.ID, StateClaimed
	stale.move(c.now(), carol.ID, StateClaimed, "claimed")
	if stored, err := one.store.Write(stale, stale.Version, 0); stored || err != nil {
		t.Fatalf("a stale write was applied: %v %v", stored, err)
	}
	if got := must[*Entry](t)(one.Get(e.ID)); got.Owner != bob.ID || got.LogLines != 2 {
		t.Fatalf("after the stale write %+v", got)
	}
	// A verb retries on the fresh entry: carol's claim now sees bob holding it.
	_, err := one.Claim(carol, e.ID)
	refused(t, err, "held by BOB/bob")
	must[*Entry](t)(two.Release(bob, e.ID))

	// Both claim and release as fast as they can; each success must be in the log exactly once.
	var mu sync.Mutex
	succeeded := 0
	var wg sync.WaitGroup
	for _, side := range []struct {
		d   *Desk
		who Who
	}{{one, bob}, {two, carol}} {
		wg.Go(func() {
			for range 200 {
				if _, err := side.d.Claim(side.who, e.ID); err == nil {
					if _, err := side.d.Release(side.who, e.ID); err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					succeeded++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	got := must[*Entry](t)(one.Get(e.ID))
	if got.Claims != MaxClaims || succeeded != MaxClaims-1 || got.LogLines != 1+2*MaxClaims || int(got.Version) != got.LogLines {
		t.Fatalf("claims %d, successes %d, log %d, version %d", got.Claims, succeeded, got.LogLines, got.Version)
	}
	for i := 1; i < len(got.Log); i += 2 { // claimed, released, claimed, ...: never two claims in a row
		if got.Log[i].To != StateClaimed || got.Log[i+1].To != StateOpen || got.Log[i].Who != got.Log[i+1].Who {
			t.Fatalf("log line %d: %+v then %+v", i, got.Log[i], got.Log[i+1])
		}
	}
}

// TestTheNewestProcessKeepsTheClocks: the old child of an upgrade stops writing expiries the
// moment the new one has taken the clocks.
func TestTheNewestProcessKeepsTheClocks(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	old := deskOn(t, dir, c)
	must[struct{}](t)(struct{}{}, old.TakeClock())
	e := open(t, old)
	must[*Entry](t)(old.Claim(bob, e.ID))
	c.pass(10 * time.Minute)
	updated := deskOn(t, dir, c)
	must[struct{}](t)(struct{}{}, updated.TakeClock())
	if n, err := old.Tick(); n != 0 || !errors.Is(err, errLostClock) {
		t.Fatalf("the old clock ticked: %d %v", n, err)
	}
	if got := must[*Entry](t)(updated.Get(e.ID)); got.State != StateClaimed {
		t.Fatalf("the old clock wrote: %+v", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	old.RunClock(ctx) // returns at once: it lost the clock
	if ctx.Err() != nil {
		t.Fatal("the old clock kept running")
	}
	if n, err := updated.Tick(); n != 1 || err != nil {
		t.Fatalf("the new clock: %d %v", n, err)
	}
}

// A store as handoff 0.1 wrote it (captured from a run of 0.1; the rest of tests/data/handoff_v0.sql).
const v0Schema = `CREATE TABLE entries (num INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE, state TEXT NOT NULL, projekt TEXT NOT NULL, body TEXT NOT NULL)`

var v0Rows = []string{
	`{"id":"h-1","projekt":"line-7","frage":"What is the scale_factor?","versucht":"looked in my folder","benoetigt":"a number","state":"resolved","priority":"","opener":"ALICE/alice","owner":"BOB/bob","antwort":"scale_factor = 2.5","rueckfrage":"","rueckfrage_antwort":"","grund":"","thema":"","opened_at":"2026-12-01T21:03:46.555625234Z","claimed_at":"2026-12-01T21:03:46.558342283Z","claim_expiries":0,"version":3,"log":[{"at":"2026-12-01T21:03:46.555625234Z","who":"ALICE/alice","from":"","to":"open","why":"opened"},{"at":"2026-12-01T21:03:46.558342283Z","who":"BOB/bob","from":"open","to":"claimed","why":"claimed"},{"at":"2026-12-01T21:03:46.560473766Z","who":"BOB/bob","from":"claimed","to":"resolved","why":"answered"}]}`,
	`{"id":"h-2","projekt":"web","frage":"Which port?","versucht":"looked in my folder","benoetigt":"a number","state":"claimed","priority":"","opener":"ALICE/alice","owner":"BOB/bob","antwort":"","rueckfrage":"","rueckfrage_antwort":"","grund":"","thema":"","opened_at":"2026-12-01T21:03:46.575026468Z","claimed_at":"2026-12-01T21:03:46.577049232Z","claim_expiries":0,"version":2,"log":[{"at":"2026-12-01T21:03:46.575026468Z","who":"ALICE/alice","from":"","to":"open","why":"opened"},{"at":"2026-12-01T21:03:46.577049232Z","who":"BOB/bob","from":"open","to":"claimed","why":"claimed"}]}`,
}

func TestAStoreOfHandoff01IsMigrated(t *testing.T) {
	dir := t.TempDir()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "handoff.db"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(v0Schema); err != nil {
		t.Fatal(err)
	}
	for i, body := range v0Rows {
		var e struct{ ID, State, Projekt string }
		json.Unmarshal([]byte(body), &e)
		if _, err := db.Exec(`INSERT INTO entries (num, id, state, projekt, body) VALUES (?, ?, ?, ?, ?)`, i+1, e.ID, e.State, e.Projekt, body); err != nil {
			t.Fatal(err)
		}
	}
	// 0.1 had given out h-3 (an id is never reused), though its row is not here.
	if _, err := db.Exec(`UPDATE sqlite_sequence SET seq = 3 WHERE name = 'entries'`); err != nil {
		t.Fatal(err)
	}
	db.Close()

	d := deskOn(t, dir, newClock())
	first := must[*Entry](t)(d.Get("h-1"))
	if first.State != StateResolved || first.Antwort != "scale_factor = 2.5" || first.Opener != alice.ID || first.Owner != bob.ID ||
		logStates(first) != ">open open>claimed claimed>resolved" || first.Claims != 1 || first.Version != 3 {
		t.Fatalf("h-1 after the migration %+v", first)
	}
	held := must[*Entry](t)(d.Get("h-2"))
	if held.State != StateClaimed || held.ClaimedAt.Format(time.RFC3339Nano) != "2026-12-01T21:03:46.577049232Z" || held.Priority != PriorityBackground {
		t.Fatalf("h-2 after the migration %+v", held)
	}
	if h := must[HoldersPage](t)(d.Holders("", 0)); len(h.Holders) != 1 || h.Holders[0].Entries[0].ID != "h-2" {
		t.Fatalf("holders %+v", h)
	}
	must[*Entry](t)(d.Answer(bob, "h-2", "5432"))
	if e := open(t, d); e.ID != "h-4" {
		t.Fatalf("the next id is %s, want h-4", e.ID)
	}
	var version, old int
	d.store.db.QueryRow(`PRAGMA user_version`).Scan(&version)
	d.store.db.QueryRow(`SELECT count(*) FROM sqlite_master WHERE name = 'entries'`).Scan(&old)
	if version != SchemaVersion || old != 0 {
		t.Fatalf("user_version %d, old table left: %d", version, old)
	}
	// Opening it again changes nothing.
	d.store.Close()
	again := deskOn(t, dir, newClock())
	if got := must[*Entry](t)(again.Get("h-2")); got.State != StateResolved {
		t.Fatalf("after reopening %+v", got)
	}
}

func TestEntriesSurviveAReopenedStore(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	s1, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	d := must[*Desk](t)(NewDesk(s1, c.now, limits(), nil))
	e := open(t, d)
	must[*Entry](t)(d.Claim(bob, e.ID))
	s1.Close()
	d2 := deskOn(t, dir, c)
	got := must[*Entry](t)(d2.Get(e.ID))
	if got.State != StateClaimed || got.Owner != bob.ID || len(got.Log) != 2 {
		t.Fatalf("after reopening %+v", got)
	}
	if e2 := open(t, d2); e2.ID != "h-2" {
		t.Fatalf("ids restarted: %s", e2.ID)
	}
}

func TestLimitsAndHumansFromEnv(t *testing.T) {
	t.Setenv("HANDOFF_UNANSWERED_S", "")
	t.Setenv("HANDOFF_CLAIM_S", "1.5")
	l, err := limitsFromEnv()
	if err != nil || l.Unanswered != 30*time.Minute || l.Claim != 1500*time.Millisecond {
		t.Fatalf("limits %+v %v", l, err)
	}
	for _, bad := range []string{"-1", "0", "soon", "1e12"} {
		t.Setenv("HANDOFF_CLAIM_S", bad)
		if _, err := limitsFromEnv(); err == nil || !strings.Contains(err.Error(), "HANDOFF_CLAIM_S") {
			t.Errorf("HANDOFF_CLAIM_S=%s: %v", bad, err)
		}
	}
	if got := pollEvery(Limits{Unanswered: 2 * time.Second, Claim: time.Second}); got != 50*time.Millisecond {
		t.Fatalf("pollEvery %s", got)
	}
	if got := pollEvery(limits()); got != time.Second {
		t.Fatalf("pollEvery %s", got)
	}

	h := must[Humans](t)(ParseHumans(""))
	if h.String() != "@local" || !h.Include(local) || h.Include(alice) || h.Include(Who{Local: true}) {
		t.Fatalf("default humans %v", h)
	}
	h = must[Humans](t)(ParseHumans(" OPS , ALICE/alice "))
	if !h.Include(samuel) || !h.Include(alice) || h.Include(Who{ID: "ALICE/eve", Account: "ALICE"}) || h.Include(local) {
		t.Fatalf("humans %v", h)
	}
	for _, bad := range []string{"OPS/", "/x", "a/b/c", "OPS,,x", "ops team", "a\x01"} {
		if _, err := ParseHumans(bad); err == nil || !strings.Contains(err.Error(), "HANDOFF_HUMANS") {
			t.Errorf("HANDOFF_HUMANS=%q: %v", bad, err)
		}
	}
}

// The node's person behind a console is @local; the same person through an MCP face (an agent
// acting for them) is not, nor is another person through the console, nor anyone when the node
// gave no local person.
func TestLocalIsTheMeshCallerOrTheNodesPersonThroughAConsole(t *testing.T) {
	me := &meshsdk.Person{Iss: "unix:box", Sub: "ops"}
	other := &meshsdk.Person{Iss: "unix:box", Sub: "eve"}
	mine := (&meshsdk.Caller{Account: "CONSOLES", User: "mesh-console", Via: "console", Person: me}).ID()
	cases := []struct {
		caller *meshsdk.Caller
		local  string
		want   bool
	}{
		{&meshsdk.Caller{Account: "MESH", Via: "local"}, mine, true},
		{&meshsdk.Caller{Account: "CONSOLES", User: "mesh-console", Via: "console", Person: me}, mine, true},
		{&meshsdk.Caller{Account: "FACES", User: "mesh-face", Via: "mcp", Person: me}, mine, false},
		{&meshsdk.Caller{Account: "CONSOLES", User: "mesh-console", Via: "console", Person: other}, mine, false},
		{&meshsdk.Caller{Account: "CONSOLES", User: "mesh-console", Via: "console", Person: me}, "", false},
		{&meshsdk.Caller{Account: "CONSOLES", User: "mesh-console", Via: "console"}, mine, false},
		{&meshsdk.Caller{Account: "ALICE", User: "alice", Via: "bus"}, mine, false},
	}
	for i, c := range cases {
		if got := isLocal(c.caller, c.local); got != c.want {
			t.Errorf("case %d (%s via %s, local %q): %v, want %v", i, c.caller.ID(), c.caller.Via, c.local, got, c.want)
		}
	}
}
