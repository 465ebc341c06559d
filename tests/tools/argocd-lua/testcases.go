package main

// The health_test.yaml cases of a directory laid out like Argo CD's resource_customizations
// (<group>/<Kind>/health.lua, health_test.yaml, testdata/), checked as Argo CD's own
// TestLuaHealthScript checks its built-in scripts: objects read with sigs.k8s.io/yaml into plain
// maps, the script run with the standard libraries open, and the result compared exactly with
// the expected status and message. The script is the one for the object's group/kind, which
// must be the directory it sits in, as Argo CD looks built-in scripts up that way.

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
)

type testFile struct {
	Tests []struct {
		InputPath    string `json:"inputPath"`
		HealthStatus Health `json:"healthStatus"`
	} `json:"tests"`
}

// CaseResult is one health_test.yaml case, as printed.
type CaseResult struct {
	Case  string `json:"case"`
	Pass  bool   `json:"pass"`
	Want  Health `json:"want"`
	Got   Health `json:"got"`
	Error string `json:"error,omitempty"`
}

// runTestCases runs every case under root; an error means the layout itself is wrong.
func runTestCases(root string) ([]CaseResult, error) {
	var results []CaseResult
	found := false
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "health.lua" {
			return err
		}
		found = true
		dir := filepath.Dir(path)
		groupKind, err := filepath.Rel(root, dir)
		if err != nil {
			return err
		}
		script, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		raw, err := os.ReadFile(filepath.Join(dir, "health_test.yaml"))
		if err != nil {
			return fmt.Errorf("every health.lua needs a health_test.yaml beside it: %w", err)
		}
		var tests testFile
		if err := yaml.UnmarshalStrict(raw, &tests); err != nil {
			return fmt.Errorf("%s: %w", filepath.Join(dir, "health_test.yaml"), err)
		}
		if len(tests.Tests) == 0 {
			return fmt.Errorf("%s lists no tests", filepath.Join(dir, "health_test.yaml"))
		}
		for _, test := range tests.Tests {
			results = append(results, runCase(groupKind, dir, test.InputPath, string(script), test.HealthStatus))
		}
		return nil
	})
	if err == nil && !found {
		err = fmt.Errorf("no health.lua under %s", root)
	}
	return results, err
}

func runCase(groupKind, dir, inputPath, script string, want Health) CaseResult {
	result := CaseResult{Case: filepath.ToSlash(filepath.Join(groupKind, inputPath)), Want: want}
	raw, err := os.ReadFile(filepath.Join(dir, inputPath))
	if err != nil {
		result.Error = err.Error()
		return result
	}
	obj := map[string]any{}
	if err := yaml.Unmarshal(raw, &obj); err != nil {
		result.Error = err.Error()
		return result
	}
	if key := objectKey(obj); key != filepath.ToSlash(groupKind) {
		result.Error = fmt.Sprintf("%s is a %s, but the script is for %s", inputPath, key, groupKind)
		return result
	}
	result.Got, err = runHealthScript(obj, script, true)
	if err != nil {
		result.Error = err.Error()
		return result
	}
	result.Pass = result.Got == want
	return result
}

// objectKey is Argo CD's key for an object's group and kind: "group/Kind", or "Kind".
func objectKey(obj map[string]any) string {
	apiVersion, _ := obj["apiVersion"].(string)
	kind, _ := obj["kind"].(string)
	group, _, hasGroup := strings.Cut(apiVersion, "/")
	if !hasGroup {
		return kind
	}
	return group + "/" + kind
}
