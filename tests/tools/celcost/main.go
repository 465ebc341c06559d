// Command celcost prints the API server's own static (estimated) CEL cost of every
// x-kubernetes-validations rule and messageExpression in CustomResourceDefinitions, computed with
// the code kube-apiserver runs when a CRD is created (k8s.io/apiextensions-apiserver, pinned in
// go.mod): the same schema walk and cardinality (pkg/apis/apiextensions/validation, CELSchemaContext),
// the same compiler and cost estimator (pkg/apiserver/schema/cel.Compile) and the same limits.
//
//	celcost [FILE...]    FILE "-" or none: stdin; YAML (several documents allowed) or JSON
//
// One line per expression, in schema order (properties sorted by name):
//
//	CRD  VERSION  PATH  EXPR  TEXT  COST  CARDINALITY  COST×CARD  LIMIT  RESULT
//
// PATH is the data path of the schema node the rule sits on (".spec.ranges[*]": items of a list,
// ".spec.labels.*": values of a map). COST is CompilationResult.MaxCost (the estimated worst-case
// cost of one evaluation); CARDINALITY is how many times the rule may run per object: the product
// of maxItems/maxProperties of the lists and maps above it, or, when one of them is unbounded, the
// estimate from the node's minimum serialized size (3 MiB request / (size+1), marked "~").
// The apiserver checks COST×CARD of a rule, but the cost of a messageExpression alone (it runs only
// when its rule fails; it is not multiplied by cardinality), against StaticEstimatedCostLimit, and
// the sum of both over one version's schema against StaticEstimatedCRDCostLimit; a totals line
// per CRD version follows its rules. Versions with identical schemas are one schema to the
// apiserver (it hoists it to spec.validation) and are printed as one, VERSION "a,b".
//
// Last, every CRD is also put through validation.ValidateCustomResourceDefinition, the apiserver's
// create-time validation, to cross-check: any error it reports is printed.
//
// Exit status: 0 all within limits, 1 a cost over a limit, a rule that does not compile or a CRD
// the apiserver would refuse, 2 unreadable input.
//
//	celcost --policy FILE
//
// instead runs the tenancy ValidatingAdmissionPolicy of FILE on synthetic writes and prints its
// runtime costs (policy.go).
//
//	celcost --overlap-policy FILE
//
// runs the pool overlap ValidatingAdmissionPolicy of FILE on synthetic PortPool writes against
// 1,000 existing pools and prints its runtime costs (overlap.go).
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/install"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	apiservercel "k8s.io/apiserver/pkg/cel"
	"k8s.io/apiserver/pkg/cel/environment"
)

// The limits: static ones the apiserver checks when a CRD is written, runtime ones (shown for
// reference) it enforces while validating an object.
const (
	exprLimit    = validation.StaticEstimatedCostLimit    // per expression: rule cost × cardinality
	crdLimit     = validation.StaticEstimatedCRDCostLimit // per CRD version schema: sum of the above
	perCallLimit = celconfig.PerCallLimit                 // runtime, one evaluation of one rule
)

var (
	scheme  = runtime.NewScheme()
	decoder runtime.Decoder
	// The CEL environment the apiserver compiles new CRD expressions in: the base environment at
	// the default compatibility version (its binary version 1.36 minus 3), NewExpressions flavor.
	envSet    *environment.EnvSet
	envLoader = cel.NewExpressionsEnvLoader()
	out       = tabwriter.NewWriter(os.Stdout, 0, 8, 2, ' ', 0)
	failed    bool // some cost over a limit, some rule not compiling, or a CRD refused
)

func main() {
	install.Install(scheme) // apiextensions internal + v1 + v1beta1, with defaults and conversions
	decoder = serializer.NewCodecFactory(scheme).UniversalDeserializer()
	compat := environment.DefaultCompatibilityVersion()
	envSet = environment.MustBaseEnvSet(compat)

	if len(os.Args) == 3 && os.Args[1] == "--policy" {
		runPolicy(os.Args[2])
		return
	}
	if len(os.Args) == 3 && os.Args[1] == "--overlap-policy" {
		runOverlapPolicy(os.Args[2])
		return
	}
	files := os.Args[1:]
	if len(files) == 0 {
		files = []string{"-"}
	}
	var crds []*apiextensions.CustomResourceDefinition
	for _, f := range files {
		c, err := readCRDs(f)
		if err != nil {
			fmt.Fprintf(os.Stderr, "celcost: %s: %v\n", f, err)
			os.Exit(2)
		}
		crds = append(crds, c...)
	}

	fmt.Printf("# CEL environment: NewExpressions, compatibility version %s\n", compat)
	fmt.Printf("# limits: StaticEstimatedCostLimit %d per expression, StaticEstimatedCRDCostLimit %d per CRD version; "+
		"runtime: PerCallLimit %d per evaluation, RuntimeCELCostBudget %d per object\n",
		exprLimit, crdLimit, perCallLimit, celconfig.RuntimeCELCostBudget)
	fmt.Fprintln(out, "CRD\tVERSION\tPATH\tEXPR\tTEXT\tCOST\tCARDINALITY\tCOST×CARD\tLIMIT\tRESULT")
	for _, crd := range crds {
		if crd.Spec.Validation != nil { // one schema for all versions (see package comment)
			var names []string
			for _, v := range crd.Spec.Versions {
				names = append(names, v.Name)
			}
			report(crd.Name, strings.Join(names, ","), crd.Spec.Validation)
		}
		for _, v := range crd.Spec.Versions {
			if v.Schema != nil {
				report(crd.Name, v.Name, v.Schema)
			}
		}
	}
	out.Flush()

	// Cross-check with the apiserver's whole create-time validation of each CRD.
	for _, crd := range crds {
		errs := validation.ValidateCustomResourceDefinition(context.Background(), crd)
		for _, e := range errs {
			fmt.Printf("# %s: apiserver validation: %v\n", crd.Name, e)
			failed = true
		}
		if len(errs) == 0 {
			fmt.Printf("# %s: apiserver validation (ValidateCustomResourceDefinition): OK\n", crd.Name)
		}
	}
	if failed {
		os.Exit(1)
	}
}

// readCRDs decodes the CustomResourceDefinitions in a YAML or JSON stream (other kinds are
// skipped with a note), defaults them and converts them to the internal version the apiserver
// validates, prepared as on create (status cleared, storage version recorded).
func readCRDs(name string) ([]*apiextensions.CustomResourceDefinition, error) {
	var in io.Reader = os.Stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		in = f
	}
	var crds []*apiextensions.CustomResourceDefinition
	docs := utilyaml.NewYAMLReader(bufio.NewReader(in))
	for {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			return crds, nil
		} else if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(doc)) == 0 || string(bytes.TrimSpace(doc)) == "null" {
			continue
		}
		var meta metav1.TypeMeta
		if err := utilyaml.Unmarshal(doc, &meta); err != nil {
			return nil, err
		}
		if meta.Kind != "CustomResourceDefinition" {
			fmt.Fprintf(os.Stderr, "celcost: %s: skipping %s %s\n", name, meta.APIVersion, meta.Kind)
			continue
		}
		obj, _, err := decoder.Decode(doc, nil, nil)
		if err != nil {
			return nil, err
		}
		scheme.Default(obj)
		crd := &apiextensions.CustomResourceDefinition{}
		if err := scheme.Convert(obj, crd, nil); err != nil {
			return nil, err
		}
		// As the registry's PrepareForCreate does.
		crd.Status = apiextensions.CustomResourceDefinitionStatus{}
		crd.Generation = 1
		for _, v := range crd.Spec.Versions {
			if v.Storage {
				crd.Status.StoredVersions = []string{v.Name}
				break
			}
		}
		crds = append(crds, crd)
	}
}

// report prints the rules of one version's schema and their total.
func report(crdName, version string, v *apiextensions.CustomResourceValidation) {
	if v.OpenAPIV3Schema == nil {
		return
	}
	root := validation.RootCELContext(v.OpenAPIV3Schema)
	walk(crdName, version, "", v.OpenAPIV3Schema, root)
	total := root.TotalCost.Total
	fmt.Fprintf(out, "%s\t%s\t(total)\t\t\t\t\t%d\t%d\t%s\n",
		crdName, version, total, crdLimit, share(total, crdLimit))
}

// walk visits the schema as ValidateCustomResourceDefinitionOpenAPISchema does: rules are only
// honoured under properties, additionalProperties and items (allOf, anyOf, oneOf, not get no CEL
// context there), and each child context multiplies the cardinality by its parent's
// maxItems/maxProperties.
func walk(crdName, version, path string, s *apiextensions.JSONSchemaProps, ctx *validation.CELSchemaContext) {
	if s == nil {
		return
	}
	if len(s.XValidations) > 0 {
		rules(crdName, version, path, s, ctx)
	}
	if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
		child := s.AdditionalProperties.Schema
		walk(crdName, version, path+".*", child, ctx.ChildAdditionalPropertiesContext(child))
	}
	names := make([]string, 0, len(s.Properties))
	for name := range s.Properties {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		child := s.Properties[name]
		walk(crdName, version, path+"."+name, &child, ctx.ChildPropertyContext(&child, name))
	}
	if s.Items != nil {
		walk(crdName, version, path+"[*]", s.Items.Schema, ctx.ChildItemsContext(s.Items.Schema))
		for i := range s.Items.JSONSchemas {
			child := &s.Items.JSONSchemas[i]
			walk(crdName, version, fmt.Sprintf("%s[%d]", path, i), child, ctx.ChildItemsContext(child))
		}
	}
}

// rules compiles the x-kubernetes-validations of one schema node the apiserver's way, prints
// one line per rule and messageExpression and adds their costs to the CRD version's total.
func rules(crdName, version, path string, s *apiextensions.JSONSchemaProps, ctx *validation.CELSchemaContext) {
	if path == "" {
		path = "."
	}
	line := func(expr, text, cost, card string, product uint64, result string) {
		fmt.Fprintf(out, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n",
			crdName, version, path, expr, short(text), cost, card, product, exprLimit, result)
	}
	typeInfo, err := ctx.TypeInfo()
	if err == nil && typeInfo == nil {
		err = errors.New("no type information")
	}
	var results []cel.CompilationResult
	if err == nil {
		results, err = cel.Compile(typeInfo.Schema, typeInfo.DeclType, perCallLimit, envSet, envLoader)
	}
	if err != nil {
		line("rule", s.XValidations[0].Rule, "-", "-", 0, "ERROR: "+firstLine(err.Error()))
		failed = true
		return
	}
	for i, cr := range results {
		rule := s.XValidations[i]
		// Cardinality as getExpressionCost takes it: the product of the bounds above, or the
		// compiler's size-based estimate when some list or map above is unbounded.
		card, cardText := cr.MaxCardinality, fmt.Sprintf("~%d", cr.MaxCardinality)
		if ctx.MaxCardinality != nil {
			card, cardText = *ctx.MaxCardinality, fmt.Sprint(*ctx.MaxCardinality)
		} else if cr.Error != nil { // not estimated; the cost is 0
			cardText = "-"
		}
		cost := mul(cr.MaxCost, card)
		ctx.TotalCost.ObserveExpressionCost(nil, cost)
		line("rule", rule.Rule, fmt.Sprint(cr.MaxCost), cardText, cost, verdict(cr.MaxCost, cost, cr.Error))
		if rule.MessageExpression == "" {
			continue
		}
		if cr.Error != nil { // the apiserver stops at the rule's error
			line("message", rule.MessageExpression, "-", "-", 0, "not compiled (rule error)")
			continue
		}
		// A messageExpression's cost is checked and summed alone, without the cardinality.
		msgCost := cr.MessageExpressionMaxCost
		if cr.MessageExpression != nil {
			ctx.TotalCost.ObserveExpressionCost(nil, msgCost)
		}
		line("message", rule.MessageExpression, fmt.Sprint(msgCost), "(1)", msgCost,
			verdict(msgCost, msgCost, cr.MessageExpressionError))
	}
}

// verdict is the RESULT column: an error or a cost over StaticEstimatedCostLimit fails; an
// estimated single-evaluation cost over the runtime PerCallLimit is only a warning (a worst-case
// object could fail at runtime, but the apiserver accepts the CRD).
func verdict(callCost, cost uint64, err *apiservercel.Error) string {
	switch {
	case err != nil:
		failed = true
		return "ERROR: " + firstLine(err.Error())
	case callCost > perCallLimit && cost <= exprLimit:
		return share(cost, exprLimit) + ", warning: one call may exceed PerCallLimit"
	}
	return share(cost, exprLimit)
}

// share is "ok (12.34%)" of the limit, or "OVER LIMIT (2.5x)" (and then the run fails).
func share(cost, limit uint64) string {
	if cost <= limit {
		return fmt.Sprintf("ok (%.2f%%)", 100*float64(cost)/float64(limit))
	}
	failed = true
	if factor := float64(cost) / float64(limit); factor <= 100 {
		return fmt.Sprintf("OVER LIMIT (%.1fx)", factor)
	}
	return "OVER LIMIT (>100x)"
}

// firstLine keeps a compiler error's first line (the rest points at the column).
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// mul multiplies with the apiserver's overflow guard (saturating at MaxUint64).
func mul(cost, card uint64) uint64 {
	if cost == 0 {
		return 0
	}
	if ^uint64(0)/cost < card {
		return ^uint64(0)
	}
	return cost * card
}

// short flattens whitespace and cuts an expression to 60 characters.
func short(s string) string {
	r := []rune(strings.Join(strings.Fields(s), " "))
	if len(r) > 60 {
		return string(r[:57]) + "..."
	}
	return string(r)
}
