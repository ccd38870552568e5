package meshsdk

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"testing"
)

// BenchmarkToolsCall is one tools/call after another through the SDK's server, as the node
// makes them: a JSON line in, the answer line out, over pipes. Its CPU profile
// (`go test -run x -bench ToolsCall -cpuprofile cpu.out`) is where docs/performance.md's
// figures for the Go SDK come from.
func BenchmarkToolsCall(b *testing.B) {
	tuneGC() // as Serve does
	server := NewServer("bench", "0")
	type echoIn struct {
		Text string `json:"text"`
	}
	AddTool(server, "echo", "Answer with the text.", func(_ context.Context, in echoIn) (string, any, error) {
		return in.Text, nil, nil
	})
	inW, outR := servePipes(b, server)
	answers := bufio.NewReader(outR)
	ask := func(line string) {
		if _, err := io.WriteString(inW, line+"\n"); err != nil {
			b.Fatal(err)
		}
	}
	answer := func() {
		if _, err := answers.ReadBytes('\n'); err != nil {
			b.Fatal(err)
		}
	}
	ask(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"b","version":"0"}}}`)
	answer()
	ask(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ask(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}`, i+1))
		answer()
	}
}
