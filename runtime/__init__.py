"""The node: config, the bus side, routes, status, and the `meshctl` CLI."""
