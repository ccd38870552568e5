//! hello-rust: one tool, `greet`, served over MCP on stdio through the mesh's Rust SDK.

use mesh_sdk::prelude::*;
use mesh_sdk::rmcp::serde_json::json;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct GreetArgs {
    /// Who to greet.
    name: String,
}

#[derive(Clone)]
struct Hello;

#[tool_router]
impl Hello {
    #[tool(description = "Greet someone by name")]
    async fn greet(&self, Parameters(args): Parameters<GreetArgs>) -> CallToolResult {
        let greeting = format!("Hello, {}! (rust)", args.name);
        let mut result = CallToolResult::success(vec![ContentBlock::text(greeting.clone())]);
        result.structured_content = Some(json!({ "greeting": greeting }));
        result
    }
}

// Fills in initialize, tools/list and tools/call from the router above; serverInfo is the
// module's name and this crate's version. (rmcp's `#[tool_router(server_handler)]` shortcut
// expands to `::rmcp` paths, which need rmcp as a direct dependency, so it is spelled out.)
#[tool_handler(name = "hello-rust")]
impl ServerHandler for Hello {}

#[tokio::main]
async fn main() -> Result<(), mesh_sdk::Error> {
    mesh_sdk::serve_stdio(Hello).await
}
