//! The mesh's thin Rust SDK for tools bundles.
//!
//! A tools bundle is a process the node's runtime launches and speaks MCP to over stdio
//! (record 0188). Everything protocol-shaped is `rmcp`, the official Rust MCP SDK, re-exported
//! here so a bundle needs no rmcp version of its own; this crate only adds what a module's code
//! needs on top: the stdio loop ([`serve_stdio`]), seat-verb tool names ([`seat_verb`]), the
//! MESH_* facts ([`facts`]), logging to stderr ([`init_logging`]) and what a tool learns about
//! its call from the node ([`Call`]: the caller, cancellation, progress, asking the caller).
//!
//! ```ignore
//! use mesh_sdk::prelude::*;
//!
//! #[derive(Clone)]
//! struct Hello;
//!
//! #[tool_router]
//! impl Hello {
//!     #[tool(description = "Say hello")]
//!     async fn greet(&self, Parameters(args): Parameters<GreetArgs>) -> String { ... }
//! }
//!
//! #[tool_handler]
//! impl ServerHandler for Hello {}
//!
//! #[tokio::main]
//! async fn main() -> Result<(), mesh_sdk::Error> {
//!     mesh_sdk::serve_stdio(Hello).await
//! }
//! ```

mod asking;
mod call;
mod facts;
mod names;
mod stdio;

use std::{
    io,
    os::fd::{AsFd, OwnedFd},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use rmcp::{ServiceExt, service::ServerInitializeError};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    sync::Notify,
};

pub use asking::CALL_REF_KEY;
pub use call::{CALLER_KEY, Call, Caller, MAX_CALLER_FIELD_BYTES, Person, Via};
pub use facts::{Facts, FactsError, facts};
pub use names::{ToolNameError, check_tool_name, seat_verb};
pub use rmcp;
/// What [`Call::cancellation`] returns, so a bundle can name it without a tokio-util of its own.
pub use tokio_util::sync::CancellationToken;

/// What everything here fails with; boxed so `main` can simply return it.
pub type Error = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What a bundle's `main.rs` imports to define tools: rmcp's macros and the types they use.
pub mod prelude {
    // `rmcp` itself is in the prelude because the macros expand to `rmcp::...` paths.
    pub use crate::{Call, Caller, Facts, facts, seat_verb};
    pub use rmcp::{
        self, ErrorData, Json, ServerHandler,
        handler::server::wrapper::Parameters,
        model::{CallToolResult, ContentBlock, ElicitationAction, ElicitationSchema},
        tool, tool_handler, tool_router,
    };
}

/// Serve `handler` over stdin/stdout until the runtime closes stdin, then return at once.
///
/// Sets up logging to stderr first. stdout is kept for the protocol alone: file descriptor 1 is
/// pointed at stderr, so a stray `println!` in a tool lands in the logs instead of corrupting
/// the JSON-RPC stream. When stdin and stdout are pipes or sockets (as the runtime gives them)
/// they are read and written through tokio's reactor on the runtime's own threads; otherwise
/// (a regular file, a terminal) through tokio's blocking threads. rmcp runs every request in
/// its own task, so a slow tool does not hold up other calls; use the multi-thread runtime
/// (`#[tokio::main]`'s default) and `spawn_blocking` for blocking work so CPU-heavy calls run
/// side by side too.
pub async fn serve_stdio<S: rmcp::ServerHandler>(handler: S) -> Result<(), Error> {
    init_logging();
    match facts() {
        Ok(f) => {
            tracing::info!(node = %f.node, module = %f.module, bundle = %f.bundle, "serving MCP on stdio")
        }
        Err(e) => tracing::info!("serving MCP on stdio ({e})"),
    }
    let writer = stdio::output(protocol_stdout()?);
    serve(handler, stdio::input(), writer).await
}

/// Serve `handler` over any byte stream pair: the loop behind [`serve_stdio`].
///
/// Returns when `reader` reaches its end, without waiting for calls still in flight: closing
/// stdin means "exit now" to the mesh runtime, while rmcp on its own would keep the process
/// up to 5 s to drain answers nobody reads.
pub async fn serve<S, R, W>(handler: S, reader: R, writer: W) -> Result<(), Error>
where
    S: rmcp::ServerHandler,
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    let closed = Arc::new(Notify::new());
    let reader = NotifyOnEof {
        inner: reader,
        closed: closed.clone(),
    };
    let running = match handler.serve((reader, writer)).await {
        Ok(running) => running,
        // Input ended before `initialize`: the runtime stopped us early, which is no failure.
        Err(ServerInitializeError::ConnectionClosed(_)) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    tokio::select! {
        quit = running.waiting() => { quit?; }
        // Dropping the running service cancels it; the runtime drops the handlers' tasks.
        _ = closed.notified() => tracing::info!("stdin closed; exiting"),
    }
    Ok(())
}

/// Log to stderr (the runtime captures it) at the level LOG_LEVEL names; info by default.
///
/// rmcp's own lines (one per notification, the whole handshake) show from LOG_LEVEL=debug on;
/// below that only its warnings and errors do. Safe to call more than once: the first call wins.
pub fn init_logging() {
    use tracing::Level;
    use tracing_subscriber::{filter::Targets, layer::SubscriberExt, util::SubscriberInitExt};

    let level = match std::env::var("LOG_LEVEL")
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
        .as_str()
    {
        "trace" => Level::TRACE,
        "debug" => Level::DEBUG,
        "warn" | "warning" => Level::WARN,
        "error" => Level::ERROR,
        _ => Level::INFO, // unset or unknown: info, rather than refusing to start over a log knob
    };
    let rmcp_level = if level >= Level::DEBUG {
        level
    } else {
        level.min(Level::WARN)
    };
    let _ = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(io::stderr)
                .with_ansi(false),
        )
        .with(
            Targets::new()
                .with_default(level)
                .with_target("rmcp", rmcp_level),
        )
        .try_init();
}

/// A handle on the real stdout for the protocol, with descriptor 1 then pointed at stderr.
fn protocol_stdout() -> io::Result<OwnedFd> {
    let protocol = io::stdout().as_fd().try_clone_to_owned()?;
    // SAFETY: dup2 only swaps which open file descriptor 1 refers to; both descriptors belong to
    // this process and stay open. Nothing holds a borrowed fd 1 across this call.
    if unsafe { libc::dup2(libc::STDERR_FILENO, libc::STDOUT_FILENO) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(protocol)
}

/// Passes reads through and wakes `closed` once the stream has ended.
struct NotifyOnEof<R> {
    inner: R,
    closed: Arc<Notify>,
}

impl<R: AsyncRead + Unpin> AsyncRead for NotifyOnEof<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &poll
            && buf.filled().len() == before
            && buf.remaining() > 0
        {
            // notify_one keeps a permit, so a waiter that arrives later still wakes.
            self.closed.notify_one();
        }
        poll
    }
}

#[cfg(test)]
mod tests {
    use super::prelude::*;
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct NapArgs {
        ms: u64,
    }

    #[derive(Clone)]
    struct Napper;

    #[tool_router]
    impl Napper {
        #[tool(description = "Sleep, then answer")]
        async fn nap(&self, Parameters(args): Parameters<NapArgs>) -> String {
            tokio::time::sleep(Duration::from_millis(args.ms)).await;
            format!("slept {}", args.ms)
        }
    }

    #[tool_handler]
    impl ServerHandler for Napper {}

    fn line(v: rmcp::serde_json::Value) -> Vec<u8> {
        let mut bytes = rmcp::serde_json::to_vec(&v).unwrap();
        bytes.push(b'\n');
        bytes
    }

    // Drives `serve` over in-memory pipes exactly as the runtime drives a child over stdio.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_in_flight_are_served_concurrently_and_eof_exits_at_once() {
        // One pipe per direction, so dropping the client's writer is an EOF like closing stdin.
        let (mut client_write, server_read) = tokio::io::duplex(1 << 16);
        let (server_write, client_read) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(super::serve(Napper, server_read, server_write));
        let mut replies = BufReader::new(client_read).lines();
        use rmcp::serde_json::json;

        client_write
            .write_all(&line(
                json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "test", "version": "0"}}}),
            ))
            .await
            .unwrap();
        let init: rmcp::serde_json::Value =
            rmcp::serde_json::from_str(&replies.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(init["result"]["protocolVersion"], "2025-11-25");
        client_write
            .write_all(&line(
                json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            ))
            .await
            .unwrap();

        // Ten 300 ms calls in flight at once finish in about 300 ms, not 3 s.
        let started = Instant::now();
        for id in 1..=10 {
            client_write
                .write_all(&line(
                    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                    "params": {"name": "nap", "arguments": {"ms": 300}}}),
                ))
                .await
                .unwrap();
        }
        let mut ids = Vec::new();
        for _ in 1..=10 {
            let reply: rmcp::serde_json::Value =
                rmcp::serde_json::from_str(&replies.next_line().await.unwrap().unwrap()).unwrap();
            assert_eq!(reply["result"]["content"][0]["text"], "slept 300");
            ids.push(reply["id"].as_i64().unwrap());
        }
        ids.sort();
        assert_eq!(ids, (1..=10).collect::<Vec<_>>());
        assert!(
            started.elapsed() < Duration::from_millis(2000),
            "took {:?}",
            started.elapsed()
        );

        // A long call in flight does not keep the server up once its input ends.
        client_write
            .write_all(&line(
                json!({"jsonrpc": "2.0", "id": 99, "method": "tools/call",
                "params": {"name": "nap", "arguments": {"ms": 30000}}}),
            ))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(client_write);
        let ended = tokio::time::timeout(Duration::from_secs(2), server).await;
        assert!(
            matches!(ended, Ok(Ok(Ok(())))),
            "server did not end promptly: {ended:?}"
        );
    }

    #[tokio::test]
    async fn input_ending_before_initialize_is_a_clean_exit() {
        let (client_io, server_io) = tokio::io::duplex(1024);
        let (server_read, server_write) = tokio::io::split(server_io);
        drop(client_io);
        super::serve(Napper, server_read, server_write)
            .await
            .unwrap();
    }
}
