// Package meshsdk is the mesh's thin Go SDK for tools bundles.
//
// A tools bundle is a process the node's runtime launches and speaks MCP to over stdio
// (record 0188). Everything protocol-shaped is the official Go MCP SDK
// (github.com/modelcontextprotocol/go-sdk); this package only adds what a module's code needs
// on top: a server set up to log to stderr, the stdio loop, typed tool registration with a
// text answer, seat-verb tool names, the MESH_* facts the runtime passes in, the caller the node
// stamped on each call, progress notifications, asking the caller (elicitation), and no reply
// to a cancelled call.
package meshsdk

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// NewServer returns a go-sdk MCP server named after the module, logging to stderr.
//
// It also makes Logger() the process's default slog logger, so a plain slog.Info anywhere in
// the bundle lands on stderr (which the runtime captures) at the same level.
func NewServer(name, version string) *mcp.Server {
	log := Logger()
	slog.SetDefault(log)
	return mcp.NewServer(&mcp.Implementation{Name: name, Version: version}, &mcp.ServerOptions{Logger: log})
}

// Logger returns a text logger on stderr; LOG_LEVEL (debug, info, warn, error) sets its level.
// stdout belongs to the protocol, so nothing else may write there.
func Logger() *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(strings.TrimSpace(os.Getenv("LOG_LEVEL")))); err != nil {
		level = slog.LevelInfo // unset or unknown: info, rather than refusing to start over a log knob
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// Serve runs server on stdin/stdout until the runtime closes stdin (a clean exit, nil) or ctx
// ends. The go-sdk handles each tools/call in its own goroutine, so a slow tool does not hold
// up other calls; notifications/cancelled cancels the call's context, and the cancelled call's
// reply is not sent (MCP: the receiver of a cancel should not answer it).
//
// Before it starts, Serve points os.Stdout at stderr and keeps the real stdout for the
// protocol alone: a stray fmt.Println in a tool then shows up in the logs instead of
// corrupting the JSON-RPC stream.
func Serve(ctx context.Context, server *mcp.Server) error {
	tuneGC()
	protocol := os.Stdout
	os.Stdout = os.Stderr
	err := server.Run(ctx, cancelAware{&mcp.IOTransport{Reader: os.Stdin, Writer: protocol}})
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, mcp.ErrConnectionClosed) {
		return nil
	}
	return err
}

// gcPercent is the collector's heap goal while serving, unless GOGC says otherwise.
//
// The go-sdk decodes each JSON value with a fresh decoder that allocates a 32 KiB buffer
// (its internal/json.Unmarshal over segmentio's Decoder), several times per tools/call. With
// Go's default GOGC=100 and a bundle's small live heap the collector then runs every few
// dozen calls and takes about half of a call's CPU (docs/performance.md, "The Go SDK
// child"). A heap goal of three times the live heap halves that for about 18 MB more
// resident memory.
const gcPercent = 200

func tuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
}
