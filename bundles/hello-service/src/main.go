// hello-service: a daemon the host runs (record 0188 point 3). It writes heartbeat.json into
// MESH_DATA_DIR every HEARTBEAT_INTERVAL_MS and stops cleanly on SIGTERM. Nothing else: no
// MCP, no tool, no port.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

type heartbeat struct {
	Pid     int    `json:"pid"`
	Beats   int    `json:"beats"`
	At      string `json:"at"`
	Node    string `json:"node"`
	Bundle  string `json:"bundle"`
	Stopped bool   `json:"stopped"`
}

// write replaces the file whole: a reader never sees half a heartbeat.
func write(path string, hb heartbeat) error {
	data, err := json.Marshal(hb)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func main() {
	dir := os.Getenv("MESH_DATA_DIR")
	if dir == "" {
		fmt.Fprintln(os.Stderr, "hello-service: MESH_DATA_DIR is not set; run me from a mesh node (or set it to a folder I may write)")
		os.Exit(2)
	}
	interval := time.Second
	if raw := os.Getenv("HEARTBEAT_INTERVAL_MS"); raw != "" {
		ms, err := strconv.Atoi(raw)
		if err != nil || ms < 10 || ms > 3600000 {
			fmt.Fprintf(os.Stderr, "hello-service: HEARTBEAT_INTERVAL_MS=%q is not a number of milliseconds from 10 to 3600000\n", raw)
			os.Exit(2)
		}
		interval = time.Duration(ms) * time.Millisecond
	}
	path := filepath.Join(dir, "heartbeat.json")
	hb := heartbeat{Pid: os.Getpid(), Node: os.Getenv("MESH_NODE"), Bundle: os.Getenv("MESH_MODULE") + "/" + os.Getenv("MESH_BUNDLE")}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	fmt.Fprintf(os.Stderr, "hello-service: pid %d, heartbeat every %s into %s\n", hb.Pid, interval, path)
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		hb.Beats++
		hb.At = time.Now().UTC().Format(time.RFC3339Nano)
		if err := write(path, hb); err != nil {
			fmt.Fprintf(os.Stderr, "hello-service: cannot write %s: %v\n", path, err)
			os.Exit(1)
		}
		select {
		case sig := <-stop:
			hb.Stopped = true
			hb.At = time.Now().UTC().Format(time.RFC3339Nano)
			_ = write(path, hb)
			fmt.Fprintf(os.Stderr, "hello-service: %s after %d beats; stopping\n", sig, hb.Beats)
			return
		case <-ticker.C:
		}
	}
}
