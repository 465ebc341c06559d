// Command argocd-lua runs Argo CD resource health checks (Lua) outside Argo CD, in the
// environment Argo CD runs them in (see vm.go), so a check can be tested on real objects.
//
//	argocd-lua -script health.lua [-open-libs] [FILE...]   one script on every object
//	argocd-lua -argocd-cm argocd-cm.yaml [FILE...]         the script argocd-cm sets for each object's kind
//	argocd-lua -test DIR                                   the health_test.yaml cases under DIR
//
// Objects: YAML (several documents) or JSON, `kind: List` included; FILE "-" or none is stdin.
// Output, one JSON line per object in input order:
//
//	{"apiVersion":..,"kind":..,"namespace":..,"name":..,"status":..,"message":..}
//
// plus "error" when the script failed (status is then Unknown, as Argo CD shows it) and
// "noHealthCheck": true when argocd-cm has no script for the kind. -test prints one line per case
// and exits 1 if any fails. Exit status 2: bad usage or unreadable input.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

type objectResult struct {
	APIVersion    string `json:"apiVersion"`
	Kind          string `json:"kind"`
	Namespace     string `json:"namespace,omitempty"`
	Name          string `json:"name"`
	Status        string `json:"status"`
	Message       string `json:"message"`
	Error         string `json:"error,omitempty"`
	NoHealthCheck bool   `json:"noHealthCheck,omitempty"`
}

func main() {
	scriptPath := flag.String("script", "", "health.lua to run on every object")
	openLibs := flag.Bool("open-libs", false, "open gopher-lua's standard libraries (Argo CD does for built-in scripts)")
	cmPath := flag.String("argocd-cm", "", "argocd-cm ConfigMap (YAML) whose resource.customizations keys choose the script")
	testDir := flag.String("test", "", "run the health_test.yaml cases of a resource_customizations-style directory")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(),
			"usage: argocd-lua -script health.lua [-open-libs] [FILE...]\n"+
				"       argocd-lua -argocd-cm argocd-cm.yaml [FILE...]\n"+
				"       argocd-lua -test DIR\n")
		flag.PrintDefaults()
	}
	flag.Parse()

	modes := 0
	for _, set := range []bool{*scriptPath != "", *cmPath != "", *testDir != ""} {
		if set {
			modes++
		}
	}
	if modes != 1 || (*openLibs && *scriptPath == "") {
		flag.Usage()
		os.Exit(2)
	}

	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	emit := func(v any) {
		line, err := json.Marshal(v)
		if err != nil {
			fail(err)
		}
		fmt.Fprintf(out, "%s\n", line)
	}

	if *testDir != "" {
		if flag.NArg() > 0 {
			flag.Usage()
			os.Exit(2)
		}
		results, err := runTestCases(*testDir)
		for _, r := range results {
			emit(r)
		}
		if err != nil {
			out.Flush()
			fail(err)
		}
		for _, r := range results {
			if !r.Pass {
				out.Flush()
				os.Exit(1)
			}
		}
		return
	}

	var evaluate func(*unstructured.Unstructured) objectResult
	if *scriptPath != "" {
		script, err := os.ReadFile(*scriptPath)
		if err != nil {
			fail(err)
		}
		evaluate = func(obj *unstructured.Unstructured) objectResult {
			r := describe(obj)
			health, err := runHealthScript(obj.Object, string(script), *openLibs)
			if err != nil {
				r.Status, r.Message, r.Error = "Unknown", err.Error(), err.Error()
				return r
			}
			r.Status, r.Message = health.Status, health.Message
			return r
		}
	} else {
		cms, err := readObjects(*cmPath)
		if err != nil {
			fail(err)
		}
		if len(cms) != 1 {
			fail(fmt.Errorf("%s: expected one ConfigMap, found %d objects", *cmPath, len(cms)))
		}
		overrides, err := parseArgoCDCM(cms[0])
		if err != nil {
			fail(err)
		}
		evaluate = func(obj *unstructured.Unstructured) objectResult {
			r := describe(obj)
			health, found, err := healthFromOverrides(obj, overrides)
			r.Status, r.Message, r.NoHealthCheck = health.Status, health.Message, !found
			if err != nil {
				r.Error = err.Error()
			}
			return r
		}
	}

	inputs := flag.Args()
	if len(inputs) == 0 {
		inputs = []string{"-"}
	}
	for _, input := range inputs {
		objects, err := readObjects(input)
		if err != nil {
			out.Flush()
			fail(err)
		}
		for _, obj := range objects {
			emit(evaluate(obj))
		}
	}
}

func describe(obj *unstructured.Unstructured) objectResult {
	return objectResult{
		APIVersion: obj.GetAPIVersion(),
		Kind:       obj.GetKind(),
		Namespace:  obj.GetNamespace(),
		Name:       obj.GetName(),
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "argocd-lua: %v\n", err)
	os.Exit(2)
}
