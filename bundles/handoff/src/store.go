package main

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	_ "modernc.org/sqlite" // pure Go: the bundle stays one static binary (CGO_ENABLED=0)
)

// SchemaVersion is the store's layout (PRAGMA user_version). 0 is handoff 0.1's one table of
// JSON bodies; OpenStore moves such a store to this one in one transaction.
const SchemaVersion = 1

// Store keeps the entries in one SQLite file: a row per entry with a column per field, a row
// per log line, and a change counter. Every write is one transaction that takes SQLite's write
// lock at its start (BEGIN IMMEDIATE), so two processes on the same file (the old and the new
// child of an upgrade) never interleave inside one; a change of an entry is applied only over
// the version it was computed from (Write), so neither overwrites what the other wrote.
type Store struct {
	db   *sql.DB
	path string
}

var errLostClock = errors.New("a newer handoff process on this store keeps the clocks now")

// OpenStore opens (or creates) handoff.db in dir: WAL with synchronous=FULL, so a change that
// was answered is on disk, and a busy timeout instead of an immediate "database is locked".
func OpenStore(dir string) (*Store, error) {
	path := filepath.Join(dir, "handoff.db")
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=busy_timeout(10000)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	db.SetMaxOpenConns(1) // one connection: the desk's lock orders this process's calls anyway
	s := &Store{db: db, path: path}
	if err := s.migrate(); err != nil {
		db.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

func (s *Store) Close() error { return s.db.Close() }

const schema = `
CREATE TABLE entry (
	num                INTEGER PRIMARY KEY AUTOINCREMENT,
	state              TEXT NOT NULL,
	projekt            TEXT NOT NULL,
	frage              TEXT NOT NULL,
	versucht           TEXT NOT NULL,
	benoetigt          TEXT NOT NULL,
	opener             TEXT NOT NULL,
	owner              TEXT NOT NULL DEFAULT '',
	antwort            TEXT NOT NULL DEFAULT '',
	rueckfrage         TEXT NOT NULL DEFAULT '',
	rueckfrage_antwort TEXT NOT NULL DEFAULT '',
	grund              TEXT NOT NULL DEFAULT '',
	thema              TEXT NOT NULL DEFAULT '',
	entscheidung       TEXT NOT NULL DEFAULT '',
	decided_by         TEXT NOT NULL DEFAULT '',
	opened_at          INTEGER NOT NULL,           -- unix nanoseconds
	claimed_at         INTEGER NOT NULL DEFAULT 0, -- 0: not claimed
	decided_at         INTEGER NOT NULL DEFAULT 0, -- 0: not decided
	claims             INTEGER NOT NULL DEFAULT 0,
	claim_expiries     INTEGER NOT NULL DEFAULT 0,
	version            INTEGER NOT NULL,           -- the entry's own changes: the fence of Write
	seq                INTEGER NOT NULL,           -- the store's change number of its last change
	log_lines          INTEGER NOT NULL,
	blocking_until     INTEGER NOT NULL DEFAULT 0  -- the opener's wait lease (priority), unix ns
);
CREATE INDEX entry_seq ON entry (seq);
CREATE INDEX entry_opened ON entry (state, opened_at);
CREATE INDEX entry_claimed ON entry (state, claimed_at);
CREATE INDEX entry_owner ON entry (state, owner, num);
CREATE TABLE log (
	num   INTEGER NOT NULL REFERENCES entry (num),
	n     INTEGER NOT NULL,
	at    INTEGER NOT NULL,
	who   TEXT NOT NULL,
	"from" TEXT NOT NULL,
	"to"  TEXT NOT NULL,
	why   TEXT NOT NULL,
	PRIMARY KEY (num, n)
) WITHOUT ROWID;
-- seq: the change counter (handoff.watch's cursor); clock: which process keeps the clocks.
CREATE TABLE meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL) WITHOUT ROWID;
`

// migrate brings the file to SchemaVersion; a second process migrating at the same moment
// waits on the write lock and then finds the work done.
func (s *Store) migrate() error {
	tx, err := s.db.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var version int
	if err := tx.QueryRow(`PRAGMA user_version`).Scan(&version); err != nil {
		return err
	}
	switch {
	case version == SchemaVersion:
		return nil
	case version > SchemaVersion:
		return fmt.Errorf("the store has schema %d, newer than this handoff's %d: run the newer handoff (a store it migrated is not read by an older one)", version, SchemaVersion)
	}
	if _, err := tx.Exec(schema); err != nil {
		return fmt.Errorf("create the tables: %w", err)
	}
	copied, err := fromV0(tx)
	if err != nil {
		return fmt.Errorf("move handoff 0.1's entries to schema %d: %w", SchemaVersion, err)
	}
	if _, err := tx.Exec(`INSERT INTO meta (k, v) VALUES ('seq', ?), ('clock', 0)`, copied); err != nil {
		return err
	}
	if _, err := tx.Exec(fmt.Sprintf(`PRAGMA user_version = %d`, SchemaVersion)); err != nil {
		return err
	}
	return tx.Commit()
}

// v0Entry is an entry as handoff 0.1 stored it: one JSON body per row of table entries.
type v0Entry struct {
	Projekt, Frage, Versucht, Benoetigt, State, Opener, Owner, Antwort string
	Rueckfrage                                                         string `json:"rueckfrage"`
	RueckfrageAntwort                                                  string `json:"rueckfrage_antwort"`
	Grund, Thema                                                       string
	OpenedAt                                                           time.Time `json:"opened_at"`
	ClaimedAt                                                          time.Time `json:"claimed_at"`
	ClaimExpiries                                                      int       `json:"claim_expiries"`
	Version                                                            int64
	Log                                                                []LogLine
}

// fromV0 copies handoff 0.1's table, if there is one, row by row with the same numbers (so the
// same ids), then drops it; ids go on counting where 0.1 stopped. It returns how many it copied.
func fromV0(tx *sql.Tx) (int64, error) {
	var found int
	if err := tx.QueryRow(`SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'entries'`).Scan(&found); err != nil || found == 0 {
		return 0, err
	}
	var nums []int64
	rows, err := tx.Query(`SELECT num FROM entries ORDER BY num`)
	if err != nil {
		return 0, err
	}
	for rows.Next() {
		var num int64
		if err := rows.Scan(&num); err != nil {
			rows.Close()
			return 0, err
		}
		nums = append(nums, num)
	}
	rows.Close()
	var seq int64
	for _, num := range nums {
		var body string
		if err := tx.QueryRow(`SELECT body FROM entries WHERE num = ?`, num).Scan(&body); err != nil {
			return 0, err
		}
		var old v0Entry
		if err := json.Unmarshal([]byte(body), &old); err != nil {
			return 0, fmt.Errorf("entry h-%d is not readable JSON: %w", num, err)
		}
		claims := 0
		for _, l := range old.Log {
			if l.To == StateClaimed && l.From != StateClaimed {
				claims++
			}
		}
		seq++
		version := max(old.Version, int64(len(old.Log)))
		if _, err := tx.Exec(`INSERT INTO entry (num, state, projekt, frage, versucht, benoetigt, opener, owner, antwort,
			rueckfrage, rueckfrage_antwort, grund, thema, opened_at, claimed_at, claims, claim_expiries, version, seq, log_lines)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			num, old.State, old.Projekt, old.Frage, old.Versucht, old.Benoetigt, old.Opener, old.Owner, old.Antwort,
			old.Rueckfrage, old.RueckfrageAntwort, old.Grund, old.Thema, nanos(old.OpenedAt), nanos(old.ClaimedAt),
			claims, old.ClaimExpiries, version, seq, len(old.Log)); err != nil {
			return 0, err
		}
		if err := insertLog(tx, num, 0, old.Log); err != nil {
			return 0, err
		}
	}
	// AUTOINCREMENT's high-water mark: an id 0.1 gave out is never given again.
	if _, err := tx.Exec(`INSERT INTO sqlite_sequence (name, seq) SELECT 'entry', seq FROM sqlite_sequence
		WHERE name = 'entries' AND NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'entry')`); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(`UPDATE sqlite_sequence SET seq = max(seq, (SELECT seq FROM sqlite_sequence WHERE name = 'entries'))
		WHERE name = 'entry' AND EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'entries')`); err != nil {
		return 0, err
	}
	_, err = tx.Exec(`DROP TABLE entries`)
	return seq, err
}

func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func insertLog(tx *sql.Tx, num int64, before int, lines []LogLine) error {
	for i, l := range lines {
		if _, err := tx.Exec(`INSERT INTO log (num, n, at, who, "from", "to", why) VALUES (?, ?, ?, ?, ?, ?, ?)`,
			num, before+i+1, nanos(l.At), l.Who, l.From, l.To, l.Why); err != nil {
			return err
		}
	}
	return nil
}

func nextSeq(tx *sql.Tx) (int64, error) {
	var seq int64
	err := tx.QueryRow(`UPDATE meta SET v = v + 1 WHERE k = 'seq' RETURNING v`).Scan(&seq)
	return seq, err
}

// Seq is the store's change counter: it moves with every change, whichever process made it.
func (s *Store) Seq() (int64, error) {
	var seq int64
	err := s.db.QueryRow(`SELECT v FROM meta WHERE k = 'seq'`).Scan(&seq)
	return seq, err
}

// TakeClock makes this process the one that keeps the clocks and returns its epoch. A process
// that started earlier finds a newer epoch at its next tick and stops: the clocks of an old child
// that drains during an upgrade stop before the new child's first tick.
func (s *Store) TakeClock() (int64, error) {
	var epoch int64
	err := s.db.QueryRow(`UPDATE meta SET v = v + 1 WHERE k = 'clock' RETURNING v`).Scan(&epoch)
	return epoch, err
}

// Insert stores a new entry with its first log lines and gives it its id ("h-<n>", n counting
// from 1, never reused).
func (s *Store) Insert(e *Entry) error {
	tx, err := s.db.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	seq, err := nextSeq(tx)
	if err != nil {
		return err
	}
	var num int64
	if err := tx.QueryRow(`INSERT INTO entry (state, projekt, frage, versucht, benoetigt, opener, opened_at, version, seq, log_lines)
		VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?, ?) RETURNING num`,
		e.State, e.Projekt, e.Frage, e.Versucht, e.Benoetigt, e.Opener, nanos(e.OpenedAt), seq, len(e.pending)).Scan(&num); err != nil {
		return err
	}
	if err := insertLog(tx, num, 0, e.pending); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	e.num, e.ID, e.Version, e.Seq = num, entryID(num), 1, seq
	e.LogLines, e.Log, e.pending = len(e.pending), e.pending, nil
	return nil
}

// Write stores a changed entry, only over the version it was read at (was): it returns false,
// and writes nothing, when someone else changed the entry first. The fields a verb never
// changes (the four of the question, the opener, the opening time) are not written, so an
// entry stored before the limits keeps its long texts whole. A clock write (epoch > 0) is
// applied only while this process keeps the clocks; otherwise it returns errLostClock.
func (s *Store) Write(e *Entry, was int64, epoch int64) (bool, error) {
	tx, err := s.db.Begin()
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	if epoch > 0 {
		var holder int64
		if err := tx.QueryRow(`SELECT v FROM meta WHERE k = 'clock'`).Scan(&holder); err != nil {
			return false, err
		}
		if holder != epoch {
			return false, errLostClock
		}
	}
	seq, err := nextSeq(tx)
	if err != nil {
		return false, err
	}
	res, err := tx.Exec(`UPDATE entry SET state = ?, owner = ?, antwort = ?, rueckfrage = ?, rueckfrage_antwort = ?,
		grund = ?, thema = ?, entscheidung = ?, decided_by = ?, claimed_at = ?, decided_at = ?, claims = ?,
		claim_expiries = ?, version = version + 1, seq = ?, log_lines = log_lines + ?
		WHERE num = ? AND version = ?`,
		e.State, e.Owner, e.Antwort, e.Rueckfrage, e.RueckfrageAntwort, e.Grund, e.Thema, e.Entscheidung,
		e.DecidedBy, nanos(e.ClaimedAt), nanos(e.DecidedAt), e.Claims, e.ClaimExpiries, seq, len(e.pending), e.num, was)
	if err != nil {
		return false, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return false, err // fenced: the entry moved on since it was read
	}
	// The version matched, so no line was added since the read: the new ones follow LogLines.
	if err := insertLog(tx, e.num, e.LogLines, e.pending); err != nil {
		return false, err
	}
	if err := tx.Commit(); err != nil {
		return false, err
	}
	e.Version, e.Seq = was+1, seq
	e.LogLines += len(e.pending)
	e.Log, e.pending = append(e.Log, e.pending...), nil
	return true, nil
}

// SetBlocking stores the opener's wait lease: the entry is blocking until `until` (zero: not
// blocking). With ifUntil set it clears only the lease this process wrote, not a newer one. It
// moves seq (a watcher sees the priority change) but not the version (a waiter does not wake).
// It returns the change number, 0 when there was nothing to change.
func (s *Store) SetBlocking(num int64, until time.Time, ifUntil *time.Time) (int64, error) {
	tx, err := s.db.Begin()
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	seq, err := nextSeq(tx)
	if err != nil {
		return 0, err
	}
	query, args := `UPDATE entry SET blocking_until = ?, seq = ? WHERE num = ?`, []any{nanos(until), seq, num}
	if ifUntil != nil {
		query += ` AND blocking_until = ?`
		args = append(args, nanos(*ifUntil))
	}
	res, err := tx.Exec(query, args...)
	if err != nil {
		return 0, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return 0, err // nothing to change: the seq bump is rolled back with it
	}
	return seq, tx.Commit()
}

// Undecided counts the escalated entries that wait for a human.
func (s *Store) Undecided() (int, error) {
	var n int
	err := s.db.QueryRow(`SELECT count(*) FROM entry WHERE state = 'escalated' AND decided_at = 0`).Scan(&n)
	return n, err
}

// The columns of an entry. A listing reads each text only to one character past its limit
// (substr counts characters), so a store holding megabyte fields costs a listing nothing more.
func entryColumns(bounded bool) string {
	text := func(col string, limit TextLimit) string {
		if !bounded {
			return col
		}
		return fmt.Sprintf("substr(%s, 1, %d)", col, limit.Chars+1)
	}
	long := func(col string) string { return text(col, LongLimit) }
	id := func(col string) string { return text(col, CallerIDLimit) }
	return strings.Join([]string{"num", "state", text("projekt", ProjektLimit), long("frage"), long("versucht"),
		long("benoetigt"), id("opener"), id("owner"), long("antwort"), long("rueckfrage"), long("rueckfrage_antwort"),
		long("grund"), text("thema", ProjektLimit), long("entscheidung"), id("decided_by"), "opened_at", "claimed_at",
		"decided_at", "claims", "claim_expiries", "version", "seq", "log_lines", "blocking_until"}, ", ")
}

type scanner interface{ Scan(dest ...any) error }

func scanEntry(row scanner) (*Entry, error) {
	var e Entry
	var opened, claimed, decided, blocking int64
	err := row.Scan(&e.num, &e.State, &e.Projekt, &e.Frage, &e.Versucht, &e.Benoetigt, &e.Opener, &e.Owner,
		&e.Antwort, &e.Rueckfrage, &e.RueckfrageAntwort, &e.Grund, &e.Thema, &e.Entscheidung, &e.DecidedBy,
		&opened, &claimed, &decided, &e.Claims, &e.ClaimExpiries, &e.Version, &e.Seq, &e.LogLines, &blocking)
	if err != nil {
		return nil, err
	}
	e.ID = entryID(e.num)
	e.OpenedAt, e.ClaimedAt, e.DecidedAt, e.blockingUntil = fromNanos(opened), fromNanos(claimed), fromNanos(decided), fromNanos(blocking)
	return &e, nil
}

// Load returns the entry whole (for a change), or nil when there is none.
func (s *Store) Load(num int64) (*Entry, error) {
	e, err := scanEntry(s.db.QueryRow(`SELECT `+entryColumns(false)+` FROM entry WHERE num = ?`, num))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	return e, err
}

// loadBounded is Load with each text read only to just past its limit (for an answer).
func (s *Store) loadBounded(num int64) (*Entry, error) {
	e, err := scanEntry(s.db.QueryRow(`SELECT `+entryColumns(true)+` FROM entry WHERE num = ?`, num))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	return e, err
}

// MaxLogLinesShown bounds the log of one answer; the rules keep a log far below it (MaxClaims),
// it is there for a store written by hand.
const MaxLogLinesShown = 64

// Log returns the entry's log, oldest first, each why cut to a bound.
func (s *Store) Log(num int64) ([]LogLine, error) {
	rows, err := s.db.Query(`SELECT at, substr(who, 1, ?), "from", "to", substr(why, 1, ?) FROM log WHERE num = ? ORDER BY n LIMIT ?`,
		CallerIDLimit.Chars+1, whyLimit.Chars+1, num, MaxLogLinesShown)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	lines := []LogLine{}
	for rows.Next() {
		var l LogLine
		var at int64
		if err := rows.Scan(&at, &l.Who, &l.From, &l.To, &l.Why); err != nil {
			return nil, err
		}
		l.At = fromNanos(at)
		l.Who, _ = clip(l.Who, CallerIDLimit)
		l.Why, _ = clip(l.Why, whyLimit)
		lines = append(lines, l)
	}
	return lines, rows.Err()
}

// whyLimit bounds a log line's why: a fixed text and an excerpt of at most WhyExcerpt characters.
var whyLimit = TextLimit{Chars: 1000, Bytes: 4000}

// Filter narrows a listing; zero fields do not narrow.
type Filter struct {
	States  []string
	Projekt string
	Owner   string
	Opener  string
	Since   time.Time // opened at or after
}

func (f Filter) where() (string, []any) {
	clauses, args := []string{"1 = 1"}, []any{}
	if len(f.States) > 0 {
		clauses = append(clauses, `state IN (?`+strings.Repeat(`, ?`, len(f.States)-1)+`)`)
		for _, st := range f.States {
			args = append(args, st)
		}
	}
	for _, c := range []struct{ col, value string }{{"projekt", f.Projekt}, {"owner", f.Owner}, {"opener", f.Opener}} {
		if c.value != "" {
			clauses = append(clauses, c.col+` = ?`)
			args = append(args, c.value)
		}
	}
	if !f.Since.IsZero() {
		clauses = append(clauses, `opened_at >= ?`)
		args = append(args, f.Since.UnixNano())
	}
	return strings.Join(clauses, " AND "), args
}

// The rank of an entry in a listing. blockingSQL is priority as stored: the opener's wait lease
// has not run out and the entry is not settled (an escalated one waits for the human).
const blockingSQL = `(blocking_until > ? AND (state IN ('open', 'claimed') OR (state = 'escalated' AND decided_at = 0)))`

const (
	// RankList: blocking entries first, then the rest; oldest first within each.
	RankList = `CASE WHEN ` + blockingSQL + ` THEN 0 ELSE 1 END`
	// RankAttention: undecided first, then decided; blocking first within each.
	RankAttention = `(CASE WHEN decided_at = 0 THEN 0 ELSE 2 END + CASE WHEN ` + blockingSQL + ` THEN 0 ELSE 1 END)`
)

// Ranked returns the nums of up to limit entries matching f, ordered by (rank, num), after the
// cursor position (afterRank, afterNum), with the rank of each.
func (s *Store) Ranked(f Filter, rank string, now time.Time, afterRank, afterNum int64, limit int) ([]int64, []int64, error) {
	where, args := f.where()
	query := `SELECT num, r FROM (SELECT num, ` + rank + ` AS r FROM entry WHERE ` + where + `)
		WHERE r > ? OR (r = ? AND num > ?) ORDER BY r, num LIMIT ?`
	// Each rank holds blockingSQL once: its one placeholder (now) comes before the filter's.
	all := append([]any{now.UnixNano()}, args...)
	all = append(all, afterRank, afterRank, afterNum, limit)
	return s.numsAndKeys(query, all)
}

func (s *Store) numsAndKeys(query string, args []any) ([]int64, []int64, error) {
	rows, err := s.db.Query(query, args...)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	var nums, keys []int64
	for rows.Next() {
		var num, key int64
		if err := rows.Scan(&num, &key); err != nil {
			return nil, nil, err
		}
		nums, keys = append(nums, num), append(keys, key)
	}
	return nums, keys, rows.Err()
}

// Changed returns the nums of up to limit entries matching f whose last change is after seq
// `after`, in the order of their changes, with the seq of each.
func (s *Store) Changed(f Filter, after int64, limit int) ([]int64, []int64, error) {
	where, args := f.where()
	return s.numsAndKeys(`SELECT num, seq FROM entry WHERE seq > ? AND `+where+` ORDER BY seq LIMIT ?`,
		append(append([]any{after}, args...), limit))
}

// Held returns up to limit claimed entries, ordered by owner then num, after (owner, num).
func (s *Store) Held(afterOwner string, afterNum int64, limit int) ([]int64, error) {
	rows, err := s.db.Query(`SELECT num FROM entry WHERE state = 'claimed' AND (owner > ? OR (owner = ? AND num > ?))
		ORDER BY owner, num LIMIT ?`, afterOwner, afterOwner, afterNum, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var nums []int64
	for rows.Next() {
		var num int64
		if err := rows.Scan(&num); err != nil {
			return nil, err
		}
		nums = append(nums, num)
	}
	return nums, rows.Err()
}

// NextDue is the earliest moment a clock runs out for some entry, or zero when none can.
// Three lookups on the (state, time) indexes: the ticker asks this after every change.
func (s *Store) NextDue(l Limits) (time.Time, error) {
	var openedOpen, openedClaimed, claimed sql.NullInt64
	err := s.db.QueryRow(`SELECT
		(SELECT min(opened_at) FROM entry WHERE state = 'open'),
		(SELECT min(opened_at) FROM entry WHERE state = 'claimed'),
		(SELECT min(claimed_at) FROM entry WHERE state = 'claimed')`).Scan(&openedOpen, &openedClaimed, &claimed)
	if err != nil {
		return time.Time{}, err
	}
	var due time.Time
	for _, c := range []struct {
		at    sql.NullInt64
		limit time.Duration
	}{{openedOpen, l.Unanswered}, {openedClaimed, l.Unanswered}, {claimed, l.Claim}} {
		if c.at.Valid {
			if t := fromNanos(c.at.Int64).Add(c.limit); due.IsZero() || t.Before(due) {
				due = t
			}
		}
	}
	return due, nil
}

// Due returns up to limit entries whose clock has run out at now.
func (s *Store) Due(now time.Time, l Limits, limit int) ([]int64, error) {
	rows, err := s.db.Query(`SELECT num FROM entry WHERE (state IN ('open', 'claimed') AND opened_at <= ?)
		OR (state = 'claimed' AND claimed_at <= ?) ORDER BY num LIMIT ?`,
		now.Add(-l.Unanswered).UnixNano(), now.Add(-l.Claim).UnixNano(), limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var nums []int64
	for rows.Next() {
		var num int64
		if err := rows.Scan(&num); err != nil {
			return nil, err
		}
		nums = append(nums, num)
	}
	return nums, rows.Err()
}
