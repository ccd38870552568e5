package main

// The listings (list, attention, holders) and handoff.watch: every answer paged, at most MaxPage
// entries and MaxPageBytes of their JSON, each entry without its log.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Page is one page of a listing.
type Page struct {
	Entries    []*Entry `json:"entries"`
	NextCursor string   `json:"next_cursor,omitempty" jsonschema:"there is more: pass it as cursor for the next page; absent on the last page"`
	WatchAfter int64    `json:"watch_after" jsonschema:"the store's change number this answer reflects: handoff.watch with after set to it hears of every change since"`
}

// ListQuery is handoff.list's arguments, as the caller gave them.
type ListQuery struct {
	State, Projekt, Owner, Opener, Since, Cursor string
	Limit                                        int
}

// List returns entries without their logs: blocking ones first, then the rest, oldest first.
func (d *Desk) List(q ListQuery) (Page, error) {
	f, err := filterOf(q.State, q.Projekt, q.Owner, q.Opener, q.Since)
	if err != nil {
		return Page{}, err
	}
	return d.ranked(f, RankList, q.Cursor, q.Limit)
}

// AttentionPage is what the human sees: escalated entries, undecided ones first.
type AttentionPage struct {
	Page
	Undecided int `json:"undecided" jsonschema:"how many escalated entries have no decision yet"`
}

// Attention is the human's list: escalated entries only, undecided first, then blocking ones
// (the opener waits), then oldest.
func (d *Desk) Attention(cursor string, limit int) (AttentionPage, error) {
	page, err := d.ranked(Filter{States: []string{StateEscalated}}, RankAttention, cursor, limit)
	if err != nil {
		return AttentionPage{}, err
	}
	undecided, err := d.store.Undecided()
	return AttentionPage{Page: page, Undecided: undecided}, err
}

func (d *Desk) ranked(f Filter, rank, cursor string, limit int) (Page, error) {
	limit, err := pageLimit(limit)
	if err != nil {
		return Page{}, err
	}
	afterRank, afterNum, err := parseRankCursor(cursor)
	if err != nil {
		return Page{}, err
	}
	seq, err := d.store.Seq()
	if err != nil {
		return Page{}, err
	}
	now := d.now()
	nums, ranks, err := d.store.Ranked(f, rank, now, afterRank, afterNum, limit)
	if err != nil {
		return Page{}, err
	}
	entries, through, err := d.fill(nums, f)
	if err != nil {
		return Page{}, err
	}
	page := Page{Entries: entries, WatchAfter: seq}
	if through > 0 && (through < len(nums) || len(nums) == limit) {
		page.NextCursor = fmt.Sprintf("%d.%d", ranks[through-1], nums[through-1])
	}
	return page, nil
}

// fill loads the entries of a page, without their logs, until the page's bytes are spent
// (always at least one). It returns how many of nums it went through.
func (d *Desk) fill(nums []int64, f Filter) ([]*Entry, int, error) {
	entries, size := []*Entry{}, 0
	for i, num := range nums {
		e, err := d.store.loadBounded(num)
		if err != nil {
			return nil, 0, err
		}
		if e == nil || !f.matches(e) {
			continue // changed between the two reads; the next page or watch shows it as it is now
		}
		v, err := d.view(e, false)
		if err != nil {
			return nil, 0, err
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, 0, err
		}
		if len(entries) > 0 && size+len(b)+1 > MaxPageBytes {
			return entries, i, nil
		}
		size += len(b) + 1
		entries = append(entries, v)
	}
	return entries, len(nums), nil
}

// matches checks again, on an entry read after its page was chosen, what the query checked.
func (f Filter) matches(e *Entry) bool {
	return (len(f.States) == 0 || slices.Contains(f.States, e.State)) && (f.Projekt == "" || f.Projekt == e.Projekt) &&
		(f.Owner == "" || f.Owner == e.Owner) && (f.Opener == "" || f.Opener == e.Opener) &&
		(f.Since.IsZero() || !e.OpenedAt.Before(f.Since))
}

// filterOf checks a listing's filters as a caller gave them.
func filterOf(state, projekt, owner, opener, since string) (Filter, error) {
	var f Filter
	if state != "" {
		if !slices.Contains(states, state) {
			shown, _ := clip(state, TextLimit{Chars: 40, Bytes: 160})
			return f, refuse("state is one of "+strings.Join(states, ", ")+", or leave it out for all", "state %q is not a state", shown)
		}
		f.States = []string{state}
	}
	var err error
	if f.Projekt, err = checkText("projekt", projekt, ProjektLimit); err != nil {
		return f, err
	}
	if f.Owner, err = checkID("owner", owner); err != nil {
		return f, err
	}
	if f.Opener, err = checkID("opener", opener); err != nil {
		return f, err
	}
	if since != "" {
		t, err := time.Parse(time.RFC3339Nano, since)
		if err != nil || len(since) > 64 {
			shown, _ := clip(since, TextLimit{Chars: 64, Bytes: 256})
			return f, refuse("give since as an RFC 3339 time, e.g. 2026-09-09T12:00:00Z", "since %q is not a time", shown)
		}
		f.Since = t
	}
	return f, nil
}

// checkID checks a caller id given as a filter: compared as it is, so not normalised.
func checkID(field, value string) (string, error) {
	if strings.ContainsFunc(value, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return "", refuse("give a caller id, \"ACCOUNT/user\" or \"ACCOUNT\", as get shows it", "%s holds a control character", field)
	}
	if len(value) > CallerIDLimit.Bytes {
		return "", refuse(fmt.Sprintf("a caller id has at most %d bytes", CallerIDLimit.Bytes), "%s has %d bytes", field, len(value))
	}
	return value, nil
}

func pageLimit(limit int) (int, error) {
	switch {
	case limit == 0:
		return DefaultPage, nil
	case limit < 0 || limit > MaxPage:
		return 0, refuse(fmt.Sprintf("give limit from 1 to %d (leave it out for %d), and page on with cursor", MaxPage, DefaultPage),
			"limit %d is out of range", limit)
	}
	return limit, nil
}

var badCursor = "pass the next_cursor of the previous page as it came, or leave cursor out for the first page"

func parseRankCursor(cursor string) (int64, int64, error) {
	if cursor == "" {
		return -1, 0, nil
	}
	rank, num, ok := strings.Cut(cursor, ".")
	r, err1 := strconv.ParseInt(rank, 10, 64)
	n, err2 := strconv.ParseInt(num, 10, 64)
	if !ok || err1 != nil || err2 != nil || r < 0 || r > 3 || n < 0 || len(cursor) > 40 {
		return 0, 0, refuse(badCursor, "cursor %q is not one this desk gave", shorten(cursor))
	}
	return r, n, nil
}

func shorten(s string) string {
	out, _ := clip(s, TextLimit{Chars: 40, Bytes: 160})
	return out
}

// Holder is one owner and what it holds.
type Holder struct {
	Owner   string     `json:"owner"`
	Entries []HeldLine `json:"entries"`
}

// HeldLine is one claimed entry in the holders' list.
type HeldLine struct {
	ID        string    `json:"id"`
	Projekt   string    `json:"projekt"`
	Frage     string    `json:"frage" jsonschema:"the start of the question (at most 200 characters)"`
	Priority  string    `json:"priority"`
	ClaimedAt time.Time `json:"claimed_at"`
	HeldS     int64     `json:"held_s" jsonschema:"seconds since the claim"`
	AgeS      int64     `json:"age_s" jsonschema:"seconds since it was opened"`
}

// HoldersPage is who holds what: owners in order, each with its claimed entries.
type HoldersPage struct {
	Holders    []Holder `json:"holders"`
	NextCursor string   `json:"next_cursor,omitempty" jsonschema:"there is more: pass it as cursor for the next page"`
}

// Holders says who holds what: every claimed entry, grouped by its owner.
func (d *Desk) Holders(cursor string, limit int) (HoldersPage, error) {
	limit, err := pageLimit(limit)
	if err != nil {
		return HoldersPage{}, err
	}
	afterOwner, afterNum := "", int64(0)
	if cursor != "" {
		enc, num, ok := strings.Cut(cursor, ".")
		owner, err1 := base64.RawURLEncoding.DecodeString(enc)
		n, err2 := strconv.ParseInt(num, 10, 64)
		if !ok || err1 != nil || err2 != nil || n < 0 || len(cursor) > 1024 {
			return HoldersPage{}, refuse(badCursor, "cursor %q is not one this desk gave", shorten(cursor))
		}
		afterOwner, afterNum = string(owner), n
	}
	nums, err := d.store.Held(afterOwner, afterNum, limit)
	if err != nil {
		return HoldersPage{}, err
	}
	page := HoldersPage{Holders: []Holder{}}
	now, size, last := d.now(), 0, (*Entry)(nil)
	for _, num := range nums {
		e, err := d.store.loadBounded(num)
		if err != nil {
			return HoldersPage{}, err
		}
		if e == nil || e.State != StateClaimed {
			continue
		}
		v, err := d.view(e, false)
		if err != nil {
			return HoldersPage{}, err
		}
		line := HeldLine{ID: v.ID, Projekt: v.Projekt, Frage: excerpt(v.Frage), Priority: v.Priority, ClaimedAt: v.ClaimedAt,
			HeldS: int64(now.Sub(v.ClaimedAt) / time.Second), AgeS: v.AgeS}
		b, _ := json.Marshal(line)
		if last != nil && size+len(b)+len(v.Owner)+32 > MaxPageBytes {
			break
		}
		size += len(b) + len(v.Owner) + 32
		if n := len(page.Holders); n == 0 || page.Holders[n-1].Owner != v.Owner {
			page.Holders = append(page.Holders, Holder{Owner: v.Owner})
		}
		h := &page.Holders[len(page.Holders)-1]
		h.Entries = append(h.Entries, line)
		last = v
	}
	if last != nil && (len(nums) == limit || countLines(page.Holders) < len(nums)) {
		page.NextCursor = base64.RawURLEncoding.EncodeToString([]byte(last.Owner)) + "." + strconv.FormatInt(last.num, 10)
	}
	return page, nil
}

func countLines(hs []Holder) int {
	n := 0
	for _, h := range hs {
		n += len(h.Entries)
	}
	return n
}

// WatchPage is what handoff.watch answers: the entries that appeared or changed after `after`.
type WatchPage struct {
	Entries  []*Entry `json:"entries"`
	After    int64    `json:"after" jsonschema:"pass it as after to the next handoff.watch: it returns what changes after this answer"`
	TimedOut bool     `json:"timed_out" jsonschema:"true when nothing matching changed within timeout_s"`
}

// Watch returns, as soon as there are any, the entries matching f that appeared or changed
// after the change number `after` (their latest state, in the order of their last change), or
// an empty page at the timeout. after 0 means from the beginning: what already matches comes
// at once. A change another process makes on the same store wakes it too (PollStore).
func (d *Desk) Watch(ctx context.Context, f Filter, after int64, limit int, timeout time.Duration) (WatchPage, error) {
	limit, err := pageLimit(limit)
	if err != nil {
		return WatchPage{}, err
	}
	seq, err := d.store.Seq()
	if err != nil {
		return WatchPage{}, err
	}
	if after < 0 || after > seq {
		return WatchPage{}, refuse(fmt.Sprintf("pass the after (or watch_after) of an earlier answer from this desk, or 0 for everything; this store's last change is %d", seq),
			"after %d is not a change of this store", after)
	}
	d.listen(1)
	defer d.listen(-1)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		bell := d.currentBell()
		page, err := d.changes(f, after, limit)
		if err != nil || len(page.Entries) > 0 {
			return page, err
		}
		after = page.After // nothing matching up to here: later looks start from it
		select {
		case <-bell:
		case <-timer.C:
			page.TimedOut = true
			return page, nil
		case <-ctx.Done():
			return WatchPage{}, ctx.Err()
		}
	}
}

func (d *Desk) changes(f Filter, after int64, limit int) (WatchPage, error) {
	seq, err := d.store.Seq() // first: whatever Changed then sees is at least this far
	if err != nil {
		return WatchPage{}, err
	}
	nums, seqs, err := d.store.Changed(f, after, limit)
	if err != nil {
		return WatchPage{}, err
	}
	entries, through, err := d.fill(nums, f)
	if err != nil {
		return WatchPage{}, err
	}
	page := WatchPage{Entries: entries, After: seq}
	switch {
	case through < len(nums) || (len(nums) == limit && through > 0):
		page.After = seqs[through-1] // cut: the next watch goes on from the last one looked at
	case len(seqs) > 0 && seqs[len(seqs)-1] > seq:
		page.After = seqs[len(seqs)-1]
	}
	return page, nil
}
