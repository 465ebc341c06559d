// Command kstatus prints the kstatus status (sigs.k8s.io/cli-utils pkg/kstatus/status) of
// Kubernetes objects, computed the way Flux's health checks compute it: the object as
// unstructured, numbers as int64 as the API server returns them, status.Compute on it, and a
// Compute error reported as Unknown with the error as message (what cli-utils' generic status
// reader does inside the poller Flux waits with).
//
//	kstatus [-o json|text] [FILE...]    FILE "-" or none: stdin
//
// Input: YAML (several documents allowed) or JSON, including `kind: List` and other *List
// objects, whose items are reported one by one. Output, one line per object, in input order:
//
//	json: {"apiVersion":..,"kind":..,"namespace":..,"name":..,"status":..,"message":..}
//	text: KIND/NAME<TAB>STATUS<TAB>MESSAGE   (NAMESPACE/KIND/NAME for namespaced objects)
//
// Exit status 0 when every object was read (whatever its status), 2 on unreadable input.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type result struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace,omitempty"`
	Name       string `json:"name"`
	Status     string `json:"status"`
	Message    string `json:"message"`
}

func main() {
	output := flag.String("o", "json", "output format: json (one object per line) or text")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: kstatus [-o json|text] [FILE...]\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *output != "json" && *output != "text" {
		fail(fmt.Errorf("unknown output format %q", *output))
	}
	inputs := flag.Args()
	if len(inputs) == 0 {
		inputs = []string{"-"}
	}
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for _, input := range inputs {
		objects, err := readObjects(input)
		if err != nil {
			out.Flush()
			fail(err)
		}
		for _, obj := range objects {
			if err := write(out, *output, compute(obj)); err != nil {
				fail(err)
			}
		}
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "kstatus: %v\n", err)
	os.Exit(2)
}

// compute is Flux's view of one object: status.Compute, and Unknown when it cannot decide.
func compute(obj *unstructured.Unstructured) result {
	r := result{
		APIVersion: obj.GetAPIVersion(),
		Kind:       obj.GetKind(),
		Namespace:  obj.GetNamespace(),
		Name:       obj.GetName(),
	}
	res, err := status.Compute(obj)
	if err != nil {
		r.Status = string(status.UnknownStatus)
		r.Message = err.Error()
		return r
	}
	r.Status = string(res.Status)
	r.Message = res.Message
	return r
}

func write(out io.Writer, format string, r result) error {
	if format == "json" {
		line, err := json.Marshal(r)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s\n", line)
		return err
	}
	id := r.Kind + "/" + r.Name
	if r.Namespace != "" {
		id = r.Namespace + "/" + id
	}
	_, err := fmt.Fprintf(out, "%s\t%s\t%s\n", id, r.Status, strings.ReplaceAll(r.Message, "\n", " "))
	return err
}

// readObjects decodes every object in one input. Each document goes through the unstructured
// JSON scheme, which yields int64 for whole numbers as a client reading the API server gets;
// kstatus reads generations with NestedInt64 and errors on float64.
func readObjects(input string) ([]*unstructured.Unstructured, error) {
	var r io.Reader = os.Stdin
	name := "stdin"
	if input != "-" {
		f, err := os.Open(input)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r, name = f, input
	}
	decoder := utilyaml.NewYAMLOrJSONDecoder(bufio.NewReader(r), 4096)
	var objects []*unstructured.Unstructured
	for doc := 1; ; doc++ {
		var raw runtime.RawExtension
		if err := decoder.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return objects, nil
			}
			return nil, fmt.Errorf("%s: document %d: %w", name, doc, err)
		}
		data := strings.TrimSpace(string(raw.Raw))
		if data == "" || data == "null" {
			continue
		}
		decoded, _, err := unstructured.UnstructuredJSONScheme.Decode([]byte(data), nil, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, doc, err)
		}
		switch obj := decoded.(type) {
		case *unstructured.Unstructured:
			objects = append(objects, obj)
		case *unstructured.UnstructuredList:
			for i := range obj.Items {
				objects = append(objects, &obj.Items[i])
			}
		default:
			return nil, fmt.Errorf("%s: document %d: unexpected %T", name, doc, decoded)
		}
	}
}
