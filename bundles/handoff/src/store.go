package main

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	_ "modernc.org/sqlite" // pure Go: the bundle stays one static binary (CGO_ENABLED=0)
)

// Store keeps the entries in one SQLite file. Each entry is one row: its id, the two columns
// a listing filters on, and the whole entry (with its log) as JSON, written in one statement,
// so a transition is never half stored. The desk serialises every change; SQLite's own lock
// keeps a second process (an overlapping restart) from interleaving with it.
type Store struct{ db *sql.DB }

// OpenStore opens (or creates) handoff.db in dir: WAL with synchronous=FULL, so a change that
// was answered is on disk, and a busy timeout instead of an immediate "database is locked".
func OpenStore(dir string) (*Store, error) {
	path := filepath.Join(dir, "handoff.db")
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=busy_timeout(5000)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	db.SetMaxOpenConns(1) // one writer; the desk's lock orders the calls anyway
	_, err = db.Exec(`CREATE TABLE IF NOT EXISTS entries (
		num     INTEGER PRIMARY KEY AUTOINCREMENT,
		id      TEXT UNIQUE,
		state   TEXT NOT NULL,
		projekt TEXT NOT NULL,
		body    TEXT NOT NULL)`)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("create the entries table in %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

func (s *Store) Close() error { return s.db.Close() }

// Insert stores a new entry and gives it its id ("h-<n>", n counting from 1, never reused).
func (s *Store) Insert(e *Entry) error {
	tx, err := s.db.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var num int64
	if err := tx.QueryRow(`INSERT INTO entries (state, projekt, body) VALUES (?, ?, '') RETURNING num`,
		e.State, e.Projekt).Scan(&num); err != nil {
		return err
	}
	e.ID = fmt.Sprintf("h-%d", num)
	body, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(`UPDATE entries SET id = ?, body = ? WHERE num = ?`, e.ID, string(body), num); err != nil {
		return err
	}
	return tx.Commit()
}

// Put writes a changed entry over its stored one.
func (s *Store) Put(e *Entry) error {
	body, err := json.Marshal(e)
	if err != nil {
		return err
	}
	_, err = s.db.Exec(`UPDATE entries SET state = ?, body = ? WHERE id = ?`, e.State, string(body), e.ID)
	return err
}

// Get returns the entry, or nil when there is none with that id.
func (s *Store) Get(id string) (*Entry, error) {
	var body string
	err := s.db.QueryRow(`SELECT body FROM entries WHERE id = ?`, id).Scan(&body)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return decode(body)
}

// Find returns the entries in any of the states (all when none) of a project (any when ""),
// oldest first.
func (s *Store) Find(states []string, projekt string) ([]*Entry, error) {
	query, args := `SELECT body FROM entries WHERE 1 = 1`, []any{}
	if len(states) > 0 {
		query += ` AND state IN (?` + strings.Repeat(`, ?`, len(states)-1) + `)`
		for _, st := range states {
			args = append(args, st)
		}
	}
	if projekt != "" {
		query += ` AND projekt = ?`
		args = append(args, projekt)
	}
	rows, err := s.db.Query(query+` ORDER BY num`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var found []*Entry
	for rows.Next() {
		var body string
		if err := rows.Scan(&body); err != nil {
			return nil, err
		}
		e, err := decode(body)
		if err != nil {
			return nil, err
		}
		found = append(found, e)
	}
	return found, rows.Err()
}

func decode(body string) (*Entry, error) {
	var e Entry
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		return nil, fmt.Errorf("a stored entry is not readable JSON: %w", err)
	}
	return &e, nil
}
