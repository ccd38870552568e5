package main

import (
	"fmt"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// TextLimit bounds one text field: characters (code points) and UTF-8 bytes, both counted after
// Unicode NFC, so "é" typed as e + combining accent counts as the one character it is stored as.
// The byte bound is what binds for scripts of 3 and 4 bytes a character.
type TextLimit struct {
	Chars int
	Bytes int
}

// The limits of every text a caller sends, documented in README.md ("Bounds"). With them an
// entry's largest JSON (every field at its limit in characters that JSON escapes to six bytes,
// and its longest log) stays below MaxReplyBytes: TestTheLargestEntryFitsAReply checks it.
var (
	// ProjektLimit is a project's name: a label, not a text.
	ProjektLimit = TextLimit{Chars: 100, Bytes: 400}
	// LongLimit is every text an agent or a human writes: frage, versucht, benoetigt, antwort,
	// rueckfrage, the reply to it, grund, and the human's decision.
	LongLimit = TextLimit{Chars: 8000, Bytes: 16 * 1024}
	// CallerIDLimit is an opener or owner given as a filter: an account and a user of at most
	// 256 bytes each (the SDK's bound on a caller field) and the slash between them.
	CallerIDLimit = TextLimit{Chars: 513, Bytes: 513}
	// WhyExcerpt is how much of a text a log line repeats; the whole text is in its field.
	WhyExcerpt = 200
)

// checkText returns value in NFC, or a refusal naming the field, what is wrong with it and what
// would be right: a control character other than newline and tab, or more characters or bytes
// than the limit. Emptiness is the caller's check (some fields may be empty, filters for one).
func checkText(field, value string, limit TextLimit) (string, error) {
	if len(value) > 4*limit.Bytes+4096 {
		// Far past the limit: say so without normalising a megabyte first.
		return "", tooLong(field, len(value), "bytes", limit)
	}
	value = norm.NFC.String(value)
	at := 0
	for _, r := range value {
		at++
		if unicode.IsControl(r) && r != '\n' && r != '\t' {
			return "", refuse("remove it; a text may hold newlines (\\n) and tabs (\\t) but no other control character",
				"%s holds the control character U+%04X at character %d", field, r, at)
		}
	}
	if n := utf8.RuneCountInString(value); n > limit.Chars {
		return "", tooLong(field, n, "characters", limit)
	}
	if len(value) > limit.Bytes {
		return "", tooLong(field, len(value), "bytes", limit)
	}
	return value, nil
}

func tooLong(field string, n int, unit string, limit TextLimit) *Refusal {
	return refuse(fmt.Sprintf("shorten %s to at most %d characters and %d bytes (counted after Unicode NFC); put a long text somewhere both agents can read and refer to it",
		field, limit.Chars, limit.Bytes), "%s has %d %s", field, n, unit)
}

// clip cuts a stored text to its limit for an answer: an entry stored before the limits (or
// written by hand) is shown clipped, never whole past the reply bound. The store keeps it whole.
func clip(s string, limit TextLimit) (string, bool) {
	if len(s) <= limit.Bytes && utf8.RuneCountInString(s) <= limit.Chars {
		return s, false
	}
	chars := 0
	for i, r := range s {
		if chars == limit.Chars || i+utf8.RuneLen(r) > limit.Bytes {
			return s[:i], true
		}
		chars++
	}
	return s, false
}

// excerpt is the start of a text, for a log line: at most WhyExcerpt characters, "…" when cut.
func excerpt(s string) string {
	chars := 0
	for i := range s {
		if chars == WhyExcerpt {
			return s[:i] + "…"
		}
		chars++
	}
	return s
}
