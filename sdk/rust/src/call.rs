//! What a tool learns about its call from the node, beyond the arguments: who is calling
//! (`_meta["mesh/caller"]`, set only by the node), the request's progress token, and the
//! cancellation token rmcp cancels on `notifications/cancelled`. A tool takes a [`Call`] as one
//! of its arguments, next to `Parameters<...>`.

use rmcp::{
    ErrorData, Peer, RoleServer,
    handler::server::common::{AsRequestContext, FromContextPart},
    model::{ProgressNotificationParam, ProgressToken, RequestMetaObject},
    serde_json::{Map, Value},
    service::{RequestContext, ServiceError},
};
use tokio_util::sync::CancellationToken;

/// The `_meta` key the node puts the caller under on every `tools/call`.
pub const CALLER_KEY: &str = "mesh/caller";
/// Longest account, user or name accepted, in UTF-8 bytes.
pub const MAX_CALLER_FIELD_BYTES: usize = 256;

/// How the call reached the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// From another NATS account, through the mesh's service import.
    Bus,
    /// The node's own caller: its operator, or any caller of a bus that vouches for nobody.
    Local,
    /// Through an MCP face (a delegate, which may name the person behind the call).
    Mcp,
    /// Through a web console (a delegate, likewise).
    Console,
}

impl Via {
    /// The wire form: "bus", "local", "mcp" or "console".
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Bus => "bus",
            Via::Local => "local",
            Via::Mcp => "mcp",
            Via::Console => "console",
        }
    }

    fn is_delegate(self) -> bool {
        matches!(self, Via::Mcp | Via::Console)
    }
}

/// The human behind a delegate's call (an MCP face, a console), as the delegate named them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Person {
    /// Who vouched for them: an OAuth issuer, or `unix:<host>` for an OS user.
    pub iss: String,
    pub sub: String,
    pub name: String,
}

/// Who is calling, as the node took it from the NATS server-stamped request info.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub account: String,
    /// The user within the account; `None` when the account's import does not share it.
    pub user: Option<String>,
    pub name: Option<String>,
    pub via: Via,
    /// The person behind a delegate's call (via mcp or console); `None` otherwise.
    pub person: Option<Person>,
    /// The key for author or owner: the person's when a delegate named one
    /// (`"person:<iss>/<sub>"`), else `"<account>/<user>"` (`"<account>"` without a user),
    /// `"local:"` before it for the node's own caller; names escaped (`%`, `/`, `:` as `%25`,
    /// `%2F`, `%3A`), so no two callers share one.
    pub id: String,
}

/// A name as it stands in an id: `%`, `/` and `:` percent-encoded (every SDK's rule).
fn escape(text: &str) -> String {
    text.replace('%', "%25").replace('/', "%2F").replace(':', "%3A")
}

impl Caller {
    /// The caller in a request's `_meta`, or why there is none.
    pub fn from_meta(meta: &Map<String, Value>) -> Result<Caller, String> {
        let raw = meta.get(CALLER_KEY).ok_or("no caller in _meta")?;
        let fields = raw
            .as_object()
            .ok_or(format!("{CALLER_KEY} is not an object"))?;
        let malformed = |problem: String| format!("{CALLER_KEY} is malformed: {problem}");
        let account = text(fields, "account", false)
            .map_err(malformed)?
            .unwrap_or_default();
        let user = text(fields, "user", true).map_err(malformed)?;
        let name = text(fields, "name", true).map_err(malformed)?;
        let via = match fields.get("via").and_then(Value::as_str) {
            Some("bus") => Via::Bus,
            Some("local") => Via::Local,
            Some("mcp") => Via::Mcp,
            Some("console") => Via::Console,
            _ => return Err(malformed("via is not one of bus, local, mcp, console".into())),
        };
        let person = match fields.get("person") {
            None | Some(Value::Null) => None,
            Some(_) if !via.is_delegate() => {
                return Err(malformed("a person comes only with via mcp or console".into()));
            }
            Some(raw) => {
                let given = raw
                    .as_object()
                    .ok_or(malformed("person is not an object".into()))?;
                let field = |key: &str| {
                    text(given, key, false)
                        .map(Option::unwrap_or_default)
                        .map_err(|p| malformed(format!("person.{p}")))
                };
                Some(Person {
                    iss: field("iss")?,
                    sub: field("sub")?,
                    name: field("name")?,
                })
            }
        };
        let base = match &user {
            Some(user) => format!("{}/{}", escape(&account), escape(user)),
            None => escape(&account),
        };
        let id = match (&person, via) {
            (Some(p), _) => format!("person:{}/{}", escape(&p.iss), escape(&p.sub)),
            (None, Via::Local) => format!("local:{base}"),
            (None, _) => base,
        };
        Ok(Caller {
            account,
            user,
            name,
            via,
            person,
            id,
        })
    }
}

/// A caller field: a non-empty string of at most [`MAX_CALLER_FIELD_BYTES`] without control
/// characters; `None` for a missing or null optional one.
fn text(fields: &Map<String, Value>, key: &str, optional: bool) -> Result<Option<String>, String> {
    let value = match fields.get(key) {
        None | Some(Value::Null) if optional => return Ok(None),
        None => return Err(format!("{key} is missing")),
        Some(value) => value,
    };
    let s = value.as_str().ok_or(format!("{key} is not a string"))?;
    if s.is_empty() {
        return Err(format!("{key} is empty"));
    }
    if s.len() > MAX_CALLER_FIELD_BYTES {
        return Err(format!(
            "{key} is longer than {MAX_CALLER_FIELD_BYTES} bytes"
        ));
    }
    if s.chars().any(|c| c.is_ascii_control()) {
        return Err(format!("{key} holds control characters"));
    }
    Ok(Some(s.to_owned()))
}

/// One `tools/call` as the node sent it: take it as a tool argument.
///
/// ```ignore
/// #[tool(description = "Store a note")]
/// async fn note(&self, call: Call, Parameters(args): Parameters<NoteArgs>) -> String {
///     let Some(who) = call.caller() else { return "no caller".into() };
///     call.progress(1.0, Some(2.0), Some("stored")).await.ok();
///     if call.is_cancelled() { return String::new() } // dropped anyway: nothing is sent
///     format!("noted for {}", who.id)
/// }
/// ```
#[derive(Clone, Debug)]
pub struct Call {
    caller: Option<Caller>,
    progress_token: Option<ProgressToken>,
    ct: CancellationToken,
    // For the elicit helpers in src/asking.rs: the peer to ask, and `_meta["mesh/call"]`.
    pub(crate) peer: Peer<RoleServer>,
    pub(crate) call_ref: Option<i64>,
}

impl Call {
    /// The call behind an rmcp request context (for handlers that take the context itself).
    pub fn from_context(context: &RequestContext<RoleServer>) -> Call {
        Call {
            caller: caller_of(&context.meta),
            progress_token: context.meta.get_progress_token(),
            ct: context.ct.clone(),
            peer: context.peer.clone(),
            call_ref: crate::asking::call_ref_of(&context.meta.0.0),
        }
    }

    /// Who is calling; `None` when the call carries no caller (a bundle run by hand) or a
    /// malformed one (logged as a warning). Never take identity from the arguments.
    pub fn caller(&self) -> Option<&Caller> {
        self.caller.as_ref()
    }

    /// Cancelled by rmcp when `notifications/cancelled` names this call; its result is then
    /// dropped. `select!` on `cancelled()` or check `is_cancelled()` between steps.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.ct
    }

    /// Whether the caller cancelled this call.
    pub fn is_cancelled(&self) -> bool {
        self.ct.is_cancelled()
    }

    /// Send `notifications/progress` with the request's token; returns once it is written, so
    /// awaiting each call keeps them in order. A no-op without a token or once cancelled.
    pub async fn progress(
        &self,
        progress: f64,
        total: Option<f64>,
        message: Option<&str>,
    ) -> Result<(), ServiceError> {
        let Some(token) = self.progress_token.clone() else {
            return Ok(());
        };
        if self.ct.is_cancelled() {
            return Ok(());
        }
        let mut param = ProgressNotificationParam::new(token, progress);
        param.total = total;
        param.message = message.map(str::to_owned);
        self.peer.notify_progress(param).await
    }
}

fn caller_of(meta: &RequestMetaObject) -> Option<Caller> {
    match Caller::from_meta(&meta.0.0) {
        Ok(caller) => Some(caller),
        Err(why) => {
            if meta.0.0.contains_key(CALLER_KEY) {
                tracing::warn!("{why}; the handler gets no caller");
            }
            None
        }
    }
}

impl<C: AsRequestContext> FromContextPart<C> for Call {
    fn from_context_part(context: &mut C) -> Result<Self, ErrorData> {
        Ok(Call::from_context(context.as_request_context()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::serde_json::json;

    fn parse(caller: Value) -> Result<Caller, String> {
        Caller::from_meta(json!({ CALLER_KEY: caller }).as_object().unwrap())
    }

    #[test]
    fn a_caller_is_read_with_its_id() {
        let alice =
            parse(json!({"account": "ALICE", "user": "alice", "name": "cli", "via": "bus"}))
                .unwrap();
        assert_eq!(alice.id, "ALICE/alice");
        assert_eq!(
            (alice.user.as_deref(), alice.name.as_deref(), alice.via),
            (Some("alice"), Some("cli"), Via::Bus)
        );
        let bob = parse(json!({"account": "BOB", "via": "local"})).unwrap();
        assert_eq!(
            (bob.id.as_str(), bob.user, bob.name, bob.via.as_str()),
            ("local:BOB", None, None, "local")
        );
        // One id per caller: names escaped; the local caller and a person apart from bus callers.
        for (given, id) in [
            (json!({"account": "a", "user": "b/c", "via": "bus"}), "a/b%2Fc"),
            (json!({"account": "a/b", "user": "c", "via": "bus"}), "a%2Fb/c"),
            (json!({"account": "local:ops", "via": "bus"}), "local%3Aops"),
            (
                json!({"account": "faces", "user": "f", "via": "mcp",
                       "person": {"iss": "https://idp.example/", "sub": "alice", "name": "Alice"}}),
                "person:https%3A%2F%2Fidp.example%2F/alice",
            ),
        ] {
            assert_eq!(parse(given).unwrap().id, id);
        }
        assert_eq!(
            Caller::from_meta(&Map::new()),
            Err("no caller in _meta".into())
        );
    }

    #[test]
    fn a_malformed_caller_says_what_is_wrong() {
        let ok = json!({"account": "A", "user": null, "name": null, "via": "mcp"});
        let with = |key: &str, value: Value| {
            let mut v = ok.clone();
            v[key] = value;
            parse(v).unwrap_err()
        };
        assert!(parse(json!("A/b")).unwrap_err().contains("not an object"));
        assert!(with("account", json!(5)).contains("account is not a string"));
        assert!(
            with("person", json!({"iss": "i", "sub": "s"})).contains("person.name is missing")
        );
        assert!(with("person", json!("alice")).contains("person is not an object"));
        let mut on_bus = ok.clone();
        on_bus["via"] = json!("bus");
        on_bus["person"] = json!({"iss": "i", "sub": "s", "name": "n"});
        assert!(parse(on_bus).unwrap_err().contains("only with via mcp or console"));
        assert!(with("user", json!("")).contains("user is empty"));
        assert!(with("name", json!("é".repeat(129))).contains("longer than 256 bytes"));
        assert!(with("name", json!("a\u{7f}")).contains("control characters"));
        assert!(with("via", json!("BUS")).contains("via is not one of"));
        assert!(
            parse(json!({"user": "u", "via": "bus"}))
                .unwrap_err()
                .contains("account is missing")
        );
    }
}
