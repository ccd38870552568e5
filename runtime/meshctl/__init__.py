"""`meshctl`, the operator's tools: run a node, ask it, call tools, build, deliver, write units, smoke."""
