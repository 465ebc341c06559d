package main

// Objects to check, read as a client of the API server sees them: each YAML or JSON document
// through the unstructured JSON scheme (whole numbers as int64), Lists expanded into their items.

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

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
