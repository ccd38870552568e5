package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// clock is a fake now the tests move by hand; the desk never reads the wall clock itself.
type clock struct{ t time.Time }

func (c *clock) now() time.Time         { return c.t }
func (c *clock) pass(d time.Duration)   { c.t = c.t.Add(d) }
func newClock() *clock                  { return &clock{t: time.Date(2026, 9, 9, 12, 0, 0, 0, time.UTC)} }
func limits() Limits                    { return Limits{Unanswered: 30 * time.Minute, Claim: 10 * time.Minute} }
func desk(t *testing.T, c *clock) *Desk { return NewDesk(store(t, t.TempDir()), c.now, limits()) }

func store(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

const (
	alice = "ALICE/alice"
	bob   = "BOB/bob"
	carol = "CAROL"
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

func TestOpenNeedsAllFourFieldsAndACaller(t *testing.T) {
	d := desk(t, newClock())
	_, err := d.Open(alice, "p", " ", "", "x")
	refused(t, err, "frage, versucht empty or missing", "all four")
	_, err = d.Open("", "p", "f", "v", "b")
	refused(t, err, "no caller identity", "mesh/caller")
	e := open(t, d)
	if e.ID != "h-1" || e.State != StateOpen || e.Opener != alice || e.Owner != "" || e.Priority != PriorityBackground {
		t.Fatalf("opened %+v", e)
	}
	if e2 := open(t, d); e2.ID != "h-2" {
		t.Fatalf("second id %s", e2.ID)
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
	if e.State != StateClaimed || e.Owner != bob {
		t.Fatalf("claimed %+v", e)
	}
	must[*Entry](t)(d.Claim(bob, e.ID)) // again by the owner: nothing changes
	_, err = d.Claim(carol, e.ID)
	refused(t, err, "held by BOB/bob")
	_, err = d.Answer(carol, e.ID, "41")
	refused(t, err, "not by you (CAROL)", "only the owner")
	h := must[map[string][]string](t)(d.Holders())
	if len(h) != 1 || h[bob][0] != "h-1" {
		t.Fatalf("holders %v", h)
	}
	_, err = d.Answer(bob, e.ID, "  ")
	refused(t, err, "antwort is empty")
	e = must[*Entry](t)(d.Answer(bob, e.ID, "42"))
	if e.State != StateResolved || e.Antwort != "42" || logStates(e) != ">open open>claimed claimed>resolved" {
		t.Fatalf("answered %+v / %s", e, logStates(e))
	}
	if e.Log[1].Who != bob || e.Log[2].Who != bob || e.Log[0].Who != alice {
		t.Fatalf("log who %+v", e.Log)
	}
	_, err = d.Claim(carol, e.ID)
	refused(t, err, "resolved, which is final")
	if h := must[map[string][]string](t)(d.Holders()); len(h) != 0 {
		t.Fatalf("holders after resolve %v", h)
	}
	_, err = d.Get("h-99")
	refused(t, err, `no entry "h-99"`)
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
	e = must[*Entry](t)(d.Reply(alice, e.ID, "the big one"))
	_, err = d.Reply(alice, e.ID, "again")
	refused(t, err, "answered already")
	e = must[*Entry](t)(d.Ask(bob, e.ID, "and which colour?"))
	if e.State != StateBlocked || !strings.Contains(e.Log[len(e.Log)-1].Why, "second follow-up") {
		t.Fatalf("second ask %+v", e)
	}
	if got := logStates(e); got != ">open open>claimed claimed>claimed claimed>claimed claimed>blocked" {
		t.Fatalf("log %s", got)
	}
	if att := must[[]*Entry](t)(d.Attention()); len(att) != 0 {
		t.Fatalf("a blocked entry reached the human: %v", att)
	}
}

func TestBlockAndEscalate(t *testing.T) {
	d := desk(t, newClock())
	a, b := open(t, d), open(t, d)
	must[*Entry](t)(d.Claim(bob, a.ID))
	_, err := d.Block(bob, a.ID, "")
	refused(t, err, "grund is empty")
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
	att := must[[]*Entry](t)(d.Attention())
	if len(att) != 6 || att[0].ID != b.ID {
		t.Fatalf("attention %v", att)
	}
	for _, e := range att {
		if e.State != StateEscalated {
			t.Fatalf("attention holds a %s entry", e.State)
		}
	}
	_, err = d.List("done", "")
	refused(t, err, `state "done" is not a state`)
	if got := must[[]*Entry](t)(d.List(StateBlocked, "p")); len(got) != 1 || got[0].ID != a.ID {
		t.Fatalf("list blocked %v", got)
	}
	if got := must[[]*Entry](t)(d.List("", "other")); len(got) != 0 {
		t.Fatalf("list of another project %v", got)
	}
}

func TestClaimExpiresBackToOpenThenBlocked(t *testing.T) {
	c := newClock()
	d := desk(t, c)
	e := open(t, d)
	must[*Entry](t)(d.Claim(bob, e.ID))
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

func TestWaitMakesItBlockingAndReturnsOnChange(t *testing.T) {
	d := desk(t, newClock())
	e := open(t, d)
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
	deadline := time.Now().Add(5 * time.Second)
	for must[*Entry](t)(d.Get(e.ID)).Priority != PriorityBlocking {
		if time.Now().After(deadline) {
			t.Fatal("the opener's wait did not make the entry blocking")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if l := must[[]*Entry](t)(d.List(StateOpen, "")); l[0].Priority != PriorityBlocking {
		t.Fatalf("list shows %s", l[0].Priority)
	}
	must[*Entry](t)(d.Claim(bob, e.ID))
	r := <-done
	if r.err != nil || !r.changed || r.e.State != StateClaimed {
		t.Fatalf("wait returned %+v", r)
	}
	if p := must[*Entry](t)(d.Get(e.ID)).Priority; p != PriorityBackground {
		t.Fatalf("after the wait priority is %s", p)
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
	// A final entry returns at once.
	must[*Entry](t)(d.Answer(bob, e.ID, "x"))
	start := time.Now()
	if w, changed, _ := d.Wait(context.Background(), alice, e.ID, time.Minute); changed || w.State != StateResolved || time.Since(start) > time.Second {
		t.Fatalf("wait on a final entry %+v %v", w, changed)
	}
}

func TestEntriesSurviveAReopenedStore(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	s1, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	d := NewDesk(s1, c.now, limits())
	e := open(t, d)
	must[*Entry](t)(d.Claim(bob, e.ID))
	s1.Close()
	d2 := NewDesk(store(t, dir), c.now, limits())
	got := must[*Entry](t)(d2.Get(e.ID))
	if got.State != StateClaimed || got.Owner != bob || len(got.Log) != 2 {
		t.Fatalf("after reopening %+v", got)
	}
	if e2 := open(t, d2); e2.ID != "h-2" {
		t.Fatalf("ids restarted: %s", e2.ID)
	}
}

func TestLimitsFromEnv(t *testing.T) {
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
	if got := tickEvery(Limits{Unanswered: 2 * time.Second, Claim: time.Second}); got != 50*time.Millisecond {
		t.Fatalf("tickEvery %s", got)
	}
	if got := tickEvery(limits()); got != time.Second {
		t.Fatalf("tickEvery %s", got)
	}
}
