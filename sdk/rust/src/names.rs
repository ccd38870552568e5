//! Tool names: `<seat>.<verb>` implements a seat's verb; a name without a dot is the module's own.

use std::fmt;

/// A name the runtime could not serve on a bus subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolNameError(String);

impl fmt::Display for ToolNameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ToolNameError {}

/// The tool name that implements `verb` of `seat`: `"seat.verb"`.
///
/// The seat follows the manifest's seat names (`[a-z][a-z0-9-]{0,62}`) so the tool matches its
/// `[[seat]]`; the verb is one bus-subject token: a letter, then letters, digits, `_` or `-`.
pub fn seat_verb(seat: &str, verb: &str) -> Result<String, ToolNameError> {
    if !is_seat(seat) {
        return Err(ToolNameError(format!(
            "seat {seat:?} is not a seat name: [a-z][a-z0-9-]{{0,62}}, e.g. \"memory\""
        )));
    }
    if !is_part(verb) {
        return Err(ToolNameError(format!(
            "verb {verb:?} is not a verb: a letter, then letters, digits, _ or - (at most 64)"
        )));
    }
    Ok(format!("{seat}.{verb}"))
}

/// `name` if the runtime can serve it: no dot (the module's own tool) or exactly one (a seat verb).
pub fn check_tool_name(name: &str) -> Result<&str, ToolNameError> {
    match name.split_once('.') {
        Some((seat, verb)) if !verb.contains('.') => seat_verb(seat, verb).map(|_| name),
        Some(_) => Err(ToolNameError(format!(
            "tool {name:?} has more than one dot; a seat verb is <seat>.<verb>"
        ))),
        None if is_part(name) => Ok(name),
        None => Err(ToolNameError(format!(
            "tool {name:?} is not a tool name: a letter, then letters, digits, _ or - (at most 64)"
        ))),
    }
}

fn is_seat(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some('a'..='z'))
        && s.len() <= 63
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '-'))
}

// One token of a subject and a valid MCP tool name: no dots, spaces, `*` or `>`.
fn is_part(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && s.len() <= 64
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seat_verb_joins_valid_parts() {
        assert_eq!(seat_verb("memory", "recall").unwrap(), "memory.recall");
        assert_eq!(seat_verb("hand-off", "put_v2").unwrap(), "hand-off.put_v2");
    }

    #[test]
    fn seat_verb_refuses_bad_seats() {
        for seat in [
            "",
            "Memory",
            "9lives",
            "mem.ory",
            "mem_ory",
            &"a".repeat(64),
        ] {
            let err = seat_verb(seat, "recall").unwrap_err();
            assert!(
                err.to_string().contains("is not a seat name"),
                "{seat}: {err}"
            );
        }
    }

    #[test]
    fn seat_verb_refuses_bad_verbs() {
        for verb in ["", "re.call", "re call", "_x", "x*", "x>", &"v".repeat(65)] {
            let err = seat_verb("memory", verb).unwrap_err();
            assert!(err.to_string().contains("is not a verb"), "{verb}: {err}");
        }
    }

    #[test]
    fn check_tool_name_accepts_own_tools_and_seat_verbs() {
        assert_eq!(check_tool_name("greet").unwrap(), "greet");
        assert_eq!(check_tool_name("memory.recall").unwrap(), "memory.recall");
        assert!(
            check_tool_name("a.b.c")
                .unwrap_err()
                .to_string()
                .contains("more than one dot")
        );
        assert!(check_tool_name("Memory.recall").is_err());
        assert!(check_tool_name("has space").is_err());
    }
}
