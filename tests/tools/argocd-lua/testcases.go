package main

// The health_test.yaml cases of a directory laid out like Argo CD's resource_customizations
// (<group>/<Kind>/health.lua, health_test.yaml, testdata/), checked as Argo CD's own
// TestLuaHealthScript checks its built-in scripts: objects read with sigs.k8s.io/yaml into plain
// maps, the script run with the standard libraries open, and the result compared exactly with
// the expected status and message. The script is the one Argo CD would pick for the object's
// group/kind (see scriptFor), whichever directory lists the case.

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
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
	Case string `json:"case"`
	// Script is the directory of the health.lua that ran: Argo CD picks it by the object's
	// group and kind, not by where the case is listed.
	Script string `json:"script"`
	Pass   bool   `json:"pass"`
	Want   Health `json:"want"`
	Got    Health `json:"got"`
	Error  string `json:"error,omitempty"`
}

// runTestCases runs every case under root; an error means the layout itself is wrong.
func runTestCases(root string) ([]CaseResult, error) {
	var scripts []string // directories holding a health.lua, relative to root, sorted
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "health.lua" {
			return err
		}
		dir, err := filepath.Rel(root, filepath.Dir(path))
		scripts = append(scripts, filepath.ToSlash(dir))
		return err
	})
	if err != nil {
		return nil, err
	}
	if len(scripts) == 0 {
		return nil, fmt.Errorf("no health.lua under %s", root)
	}
	sort.Strings(scripts)
	var results []CaseResult
	for _, dir := range scripts {
		testsPath := filepath.Join(root, filepath.FromSlash(dir), "health_test.yaml")
		raw, err := os.ReadFile(testsPath)
		if err != nil {
			return results, fmt.Errorf("every health.lua needs a health_test.yaml beside it: %w", err)
		}
		var tests testFile
		if err := yaml.Unmarshal(raw, &tests); err != nil {
			return results, fmt.Errorf("%s: %w", testsPath, err)
		}
		if len(tests.Tests) == 0 {
			return results, fmt.Errorf("%s lists no tests", testsPath)
		}
		for _, test := range tests.Tests {
			results = append(results, runCase(root, dir, scripts, test.InputPath, test.HealthStatus))
		}
	}
	return results, nil
}

func runCase(root, dir string, scripts []string, inputPath string, want Health) CaseResult {
	result := CaseResult{Case: dir + "/" + filepath.ToSlash(inputPath), Want: want}
	raw, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(dir), inputPath))
	if err != nil {
		result.Error = err.Error()
		return result
	}
	obj := map[string]any{}
	if err := yaml.Unmarshal(raw, &obj); err != nil {
		result.Error = err.Error()
		return result
	}
	result.Script = scriptFor(objectKey(obj), scripts)
	if result.Script == "" {
		result.Error = fmt.Sprintf("no health.lua under %s applies to %s", root, objectKey(obj))
		return result
	}
	script, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(result.Script), "health.lua"))
	if err != nil {
		result.Error = err.Error()
		return result
	}
	result.Got, err = runHealthScript(obj, string(script), true)
	if err != nil {
		result.Error = err.Error()
		return result
	}
	result.Pass = result.Got == want
	return result
}

// scriptFor picks the script Argo CD would use among its built-ins for an object's
// "group/Kind": the directory of that name, else the first (sorted) directory with "_" in its
// path whose pattern ("_" as "*") matches.
func scriptFor(key string, scripts []string) string {
	for _, dir := range scripts {
		if dir == key {
			return dir
		}
	}
	for _, dir := range scripts {
		if !strings.Contains(dir, "_") {
			continue
		}
		if ok, _ := path.Match(strings.ReplaceAll(dir, "_", "*"), key); ok {
			return dir
		}
	}
	return ""
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
