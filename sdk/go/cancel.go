package meshsdk

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// cancelAware wraps a transport so that a request the peer cancelled gets no reply.
//
// The go-sdk cancels the handler's ctx on notifications/cancelled but still writes the
// handler's reply; MCP says the receiver should not answer a cancelled request, and the node
// has forgotten the id by then. The connection remembers which incoming requests are in flight
// (bounded by the calls in flight, which the node bounds per child) and which of those were
// cancelled, and drops the reply of a cancelled one.
type cancelAware struct{ inner mcp.Transport }

func (t cancelAware) Connect(ctx context.Context) (mcp.Connection, error) {
	conn, err := t.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &cancelAwareConn{Connection: conn, inFlight: map[jsonrpc.ID]bool{}}, nil
}

type cancelAwareConn struct {
	mcp.Connection
	mu       sync.Mutex
	inFlight map[jsonrpc.ID]bool // incoming request id -> cancelled by the peer
}

func (c *cancelAwareConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if req, ok := msg.(*jsonrpc.Request); ok && err == nil {
		c.mu.Lock()
		if req.IsCall() {
			c.inFlight[req.ID] = false
		} else if req.Method == "notifications/cancelled" {
			if id, ok := cancelledID(req.Params); ok {
				if _, known := c.inFlight[id]; known {
					c.inFlight[id] = true // a cancel for an id not in flight (answered already) does nothing
				}
			}
		}
		c.mu.Unlock()
	}
	return msg, err
}

func (c *cancelAwareConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if resp, ok := msg.(*jsonrpc.Response); ok {
		c.mu.Lock()
		cancelled := c.inFlight[resp.ID]
		delete(c.inFlight, resp.ID)
		c.mu.Unlock()
		if cancelled {
			return nil
		}
	}
	return c.Connection.Write(ctx, msg)
}

// cancelledID reads requestId from notifications/cancelled params; a malformed one is
// ignored here (the go-sdk's own handling of it decides what else happens).
func cancelledID(params json.RawMessage) (jsonrpc.ID, bool) {
	var p struct {
		RequestID any `json:"requestId"`
	}
	if json.Unmarshal(params, &p) != nil || p.RequestID == nil {
		return jsonrpc.ID{}, false
	}
	id, err := jsonrpc.MakeID(p.RequestID)
	return id, err == nil
}
