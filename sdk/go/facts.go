package meshsdk

import (
	"fmt"
	"os"
	"strings"
)

// Env holds the facts the node's runtime passes to every bundle it launches.
type Env struct {
	Node      string // MESH_NODE: the node's name
	Module    string // MESH_MODULE: this bundle's module
	Bundle    string // MESH_BUNDLE: this bundle's name in the module
	BundleDir string // MESH_BUNDLE_DIR: the unpacked bundle (read-only by intent; replaced on upgrade)
	DataDir   string // MESH_DATA_DIR: the module's persistent data; survives upgrades
}

// Facts reads the MESH_* variables and makes sure the data folder exists. A missing variable
// is an error naming each one, since running without the runtime is a setup mistake worth
// saying; the returned Env still holds whatever was set, for a bundle run by hand.
func Facts() (Env, error) {
	env := Env{
		Node:      os.Getenv("MESH_NODE"),
		Module:    os.Getenv("MESH_MODULE"),
		Bundle:    os.Getenv("MESH_BUNDLE"),
		BundleDir: os.Getenv("MESH_BUNDLE_DIR"),
		DataDir:   os.Getenv("MESH_DATA_DIR"),
	}
	var missing []string
	for _, v := range []struct{ name, value string }{
		{"MESH_NODE", env.Node}, {"MESH_MODULE", env.Module}, {"MESH_BUNDLE", env.Bundle},
		{"MESH_BUNDLE_DIR", env.BundleDir}, {"MESH_DATA_DIR", env.DataDir},
	} {
		if v.value == "" {
			missing = append(missing, v.name)
		}
	}
	if len(missing) > 0 {
		return env, fmt.Errorf("%s not set: the node's runtime sets these when it launches a bundle; set them to run it by hand",
			strings.Join(missing, ", "))
	}
	// The runtime normally creates it; creating it here too keeps a first start or a hand run working.
	if err := os.MkdirAll(env.DataDir, 0o750); err != nil {
		return env, fmt.Errorf("MESH_DATA_DIR %s cannot be created: %w", env.DataDir, err)
	}
	return env, nil
}
