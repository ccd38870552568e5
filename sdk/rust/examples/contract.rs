//! The fixture bundle `tests/test_sdk_rust.py` drives over real stdio: the three tools of the
//! node's call contract (`tests/support/call_contract.py`): whoami, wait_cancel, count, confirm.

use std::{fs::OpenOptions, io::Write, time::Duration};

use mesh_sdk::prelude::*;
use mesh_sdk::rmcp::serde_json::{Value, json};

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct MarkerArgs {
    /// A file the tool writes "started" to, and "cancelled" once its call is cancelled.
    marker: String,
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct CountArgs {
    steps: u32,
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct ConfirmArgs {
    question: String,
}

fn append(path: &str, line: &str) {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("marker file");
    writeln!(file, "{line}").expect("marker write");
}

#[derive(Clone)]
struct Fixture;

#[tool_router]
impl Fixture {
    // No Parameters: whatever the arguments say (a forged caller too) is ignored.
    #[tool(description = "The caller this call carries, or null")]
    async fn whoami(&self, call: Call) -> CallToolResult {
        let caller = call.caller().map_or(Value::Null, |c| {
            let person = c.person.as_ref().map_or(Value::Null, |p| {
                json!({"iss": p.iss, "sub": p.sub, "name": p.name})
            });
            json!({"account": c.account, "user": c.user, "name": c.name, "via": c.via.as_str(),
                   "id": c.id, "person": person})
        });
        let mut result = CallToolResult::success(vec![ContentBlock::text(
            call.caller().map_or("nobody", |c| &c.id),
        )]);
        result.structured_content = Some(json!({ "caller": caller }));
        result
    }

    #[tool(description = "Wait until this call is cancelled (at most 30 s)")]
    async fn wait_cancel(&self, call: Call, Parameters(args): Parameters<MarkerArgs>) -> String {
        append(&args.marker, "started");
        tokio::select! {
            _ = call.cancellation().cancelled() => append(&args.marker, "cancelled"),
            _ = tokio::time::sleep(Duration::from_secs(30)) => return "never cancelled".into(),
        }
        "cancelled, and this must not be sent".into()
    }

    #[tool(description = "Report progress `steps` times, then answer")]
    async fn count(
        &self,
        call: Call,
        Parameters(args): Parameters<CountArgs>,
    ) -> Result<String, ErrorData> {
        let total = f64::from(args.steps);
        for i in 1..=args.steps {
            call.progress(f64::from(i), Some(total), Some(&format!("step {i}")))
                .await
                .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        }
        Ok(format!("counted {}", args.steps))
    }

    #[tool(
        description = "Ask the caller (an elicitation across the mesh), then say what they answered"
    )]
    async fn confirm(
        &self,
        call: Call,
        Parameters(args): Parameters<ConfirmArgs>,
    ) -> CallToolResult {
        let schema = ElicitationSchema::builder()
            .required_bool("ok")
            .build()
            .expect("a schema of one required field");
        let said = match call.elicit(&args.question, schema).await {
            // A caller that cannot answer: a tool error naming the node's JSON-RPC error.
            Err(e) => {
                let text = ContentBlock::text(format!("could not ask: {e}"));
                return CallToolResult::error(vec![text]);
            }
            Ok(answer) => match answer.action {
                ElicitationAction::Accept => {
                    let ok = answer.content.as_ref().and_then(|c| c["ok"].as_bool());
                    if ok == Some(true) {
                        "ok=true"
                    } else {
                        "ok=false"
                    }
                }
                ElicitationAction::Decline => "declined",
                _ => "cancelled", // ElicitationAction is non-exhaustive: Cancel and any later one
            },
        };
        CallToolResult::success(vec![ContentBlock::text(said)])
    }
}

#[tool_handler(name = "contract")]
impl ServerHandler for Fixture {}

#[tokio::main]
async fn main() -> Result<(), mesh_sdk::Error> {
    mesh_sdk::serve_stdio(Fixture).await
}
