// celcost --overlap-policy FILE: the runtime CEL cost of the pool overlap ValidatingAdmissionPolicy
// (portalloc-pool-overlap in rbac/portalloc-pool-overlap-policy.yaml).
//
// Its binding selects every PortPool as a param, so kube-apiserver evaluates the policy once per
// existing pool for each PortPool written, each evaluation with a budget of its own
// (RuntimeCELCostBudget; PerCallLimit per expression). This runs it as the admission plugin does
// (the same compiler, lazily composed variables, validator conditions and cost tracking) against
// 1,000 existing pools for a few writes: the heaviest (64 ranges, the most a pool has, against
// 1,000 pools of 64 ranges each, none shared), the common one (one range against 1,000 one-range
// pools), an update keeping ports it already shared, and writes it must refuse. For each it
// prints the heaviest evaluation's cost (against the budget; an expression over PerCallLimit
// fails its evaluation, which fails the run), the sum over all 1,000 (the work one write costs
// the API server) and the decision.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/google/cel-go/cel"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
)

const overlapPolicyName = "portalloc-pool-overlap"

var (
	poolGVK    = schema.GroupVersionKind{Group: "portalloc.dev", Version: "v1alpha1", Kind: "PortPool"}
	poolGVR    = schema.GroupVersionResource{Group: "portalloc.dev", Version: "v1alpha1", Resource: "portpools"}
	withParams = plugincel.OptionalVariableDeclarations{HasParams: true, HasAuthorizer: true}
	msgParams  = plugincel.OptionalVariableDeclarations{HasParams: true}
)

// The number of existing pools each write is checked against.
const existingPools = 1000

type portPool struct {
	name, protocol string
	ranges         []string
	allowOverlap   bool
}

func (p portPool) object() *unstructured.Unstructured {
	var ranges []interface{}
	for _, r := range p.ranges {
		ranges = append(ranges, r)
	}
	spec := map[string]interface{}{"ranges": ranges, "protocol": p.protocol}
	if p.allowOverlap {
		spec["allowOverlap"] = true
	}
	return &unstructured.Unstructured{Object: map[string]interface{}{
		"apiVersion": "portalloc.dev/v1alpha1",
		"kind":       "PortPool",
		"metadata":   map[string]interface{}{"name": p.name},
		"spec":       spec,
	}}
}

// ranges of n one-port-wide gaps: [first, first+width-1], then every `step` ports.
func spread(first, width, step, n int) []string {
	var out []string
	for i := 0; i < n; i++ {
		a := first + i*step
		if width == 1 {
			out = append(out, fmt.Sprint(a))
		} else {
			out = append(out, fmt.Sprintf("%d-%d", a, a+width-1))
		}
	}
	return out
}

type overlapScenario struct {
	title    string
	old, new *portPool
	existing []portPool
	deny     string
}

func overlapScenarios() []overlapScenario {
	// 1,000 pools of 64 ranges of 1 port, interleaved (pool i has ports 1000+i+1000k), and a
	// new pool of 64 ranges in the gaps none of them has.
	var wide []portPool
	for i := 0; i < existingPools; i++ {
		wide = append(wide, portPool{name: fmt.Sprintf("pool-%d", i), protocol: "TCP",
			ranges: spread(1000+i, 1, 1001, 64)})
	}
	var narrow []portPool
	for i := 0; i < existingPools; i++ {
		narrow = append(narrow, portPool{name: fmt.Sprintf("pool-%d", i), protocol: "TCP",
			ranges: []string{fmt.Sprintf("%d-%d", 1000+i*60, 1000+i*60+49)}})
	}
	gaps := portPool{name: "new", protocol: "TCP", ranges: spread(1000+1000, 1, 1001, 64)}
	one := portPool{name: "new", protocol: "TCP", ranges: []string{"61000-61099"}}
	clash := portPool{name: "new", protocol: "TCP", ranges: []string{"1010-1070"}}
	// An update of pool-0 (of the narrow ones) that shares 1010-1049 with... itself only: the
	// param of its own name is skipped; and one of pool-1 that keeps 1060-1069 shared with a
	// pool written before the policy and adds nothing.
	keptOld := portPool{name: "pool-1", protocol: "TCP", ranges: []string{"1040-1109"}}
	keptNew := portPool{name: "pool-1", protocol: "TCP", ranges: []string{"1040-1109"}, allowOverlap: false}
	widened := portPool{name: "pool-1", protocol: "TCP", ranges: []string{"1030-1109"}}
	udp := portPool{name: "new", protocol: "UDP", ranges: []string{"1000-60999"}}
	return []overlapScenario{
		{title: "64 ranges against 1,000 pools of 64 ranges each, none shared", new: &gaps, existing: wide},
		{title: "1 range against 1,000 one-range pools, none shared", new: &one, existing: narrow},
		{title: "an update that keeps the ports it already shared", old: &keptOld, new: &keptNew, existing: narrow},
		{title: "another protocol over every pool's ports", new: &udp, existing: narrow},
		{title: "1 range over parts of two pools", new: &clash, existing: narrow,
			deny: "PortPool new would share TCP ports 1010-1049 with PortPool pool-0 (ranges 1000-1049)"},
		{title: "an update that widens an old overlap", old: &keptOld, new: &widened, existing: narrow,
			deny: "PortPool pool-1 would share TCP ports 1030-1049 with PortPool pool-0"},
	}
}

func runOverlapPolicy(path string) {
	policy, err := readPolicyNamed(path, overlapPolicyName)
	if err != nil {
		fmt.Fprintf(os.Stderr, "celcost: %s: %v\n", path, err)
		os.Exit(2)
	}
	fmt.Printf("# ValidatingAdmissionPolicy %s: runtime cost per PortPool written against %d existing pools "+
		"(one evaluation per pool); limits: PerCallLimit %d per expression, RuntimeCELCostBudget %d per evaluation\n",
		overlapPolicyName, existingPools, celconfig.PerCallLimit, celconfig.RuntimeCELCostBudget)
	// Written as the API server of the policy's oldest Kubernetes (1.30) and of this one compile it.
	for _, v := range []*version.Version{version.MajorMinor(1, 30), environment.DefaultCompatibilityVersion()} {
		c, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(v))
		if err != nil {
			panic(err)
		}
		var vars []plugincel.NamedExpressionAccessor
		for _, x := range policy.Spec.Variables {
			vars = append(vars, &validating.Variable{Name: x.Name, Expression: x.Expression})
		}
		c.CompileAndStoreVariables(vars, withParams, environment.NewExpressions)
		check := func(what, text string, t *cel.Type, opts plugincel.OptionalVariableDeclarations) {
			if r := c.CompileCELExpression(expression{text, []*cel.Type{t}}, opts, environment.NewExpressions); r.Error != nil {
				fmt.Printf("# compatibility version %s: %s: %s\n", v, what, firstLine(r.Error.Error()))
				failed = true
			}
		}
		for _, x := range policy.Spec.Variables {
			check("variable "+x.Name, x.Expression, cel.AnyType, withParams)
		}
		for i, x := range policy.Spec.Validations {
			check(fmt.Sprintf("validation %d", i), x.Expression, cel.BoolType, withParams)
			check(fmt.Sprintf("message %d", i), x.MessageExpression, cel.StringType, msgParams)
		}
	}
	env := environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion())
	c, err := plugincel.NewCompositedCompiler(env)
	if err != nil {
		panic(err)
	}
	var vars []plugincel.NamedExpressionAccessor
	for _, v := range policy.Spec.Variables {
		vars = append(vars, &validating.Variable{Name: v.Name, Expression: v.Expression})
	}
	c.CompileAndStoreVariables(vars, withParams, environment.StoredExpressions)
	for _, s := range overlapScenarios() {
		evaluateOverlap(policy, c, s)
	}
	if failed {
		os.Exit(1)
	}
}

func evaluateOverlap(p *admissionregistrationv1.ValidatingAdmissionPolicy, c *plugincel.CompositedCompiler, s overlapScenario) {
	object := s.new.object()
	var old runtime.Object
	operation := admission.Create
	if s.old != nil {
		old = s.old.object()
		operation = admission.Update
	}
	attrs := admission.NewAttributesRecord(object, old, poolGVK, "", s.new.name, poolGVR, "",
		operation, nil, false, &user.DefaultInfo{Name: "someone", Groups: []string{"system:authenticated"}})
	versioned := &admission.VersionedAttributes{Attributes: attrs, VersionedKind: poolGVK,
		VersionedObject: object, VersionedOldObject: old}
	request := plugincel.CreateAdmissionRequest(attrs, metav1.GroupVersionResource(poolGVR), metav1.GroupVersionKind(poolGVK))
	var validations, messages []plugincel.ExpressionAccessor
	for _, v := range p.Spec.Validations {
		validations = append(validations, &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason})
		messages = append(messages, expression{v.MessageExpression, []*cel.Type{cel.StringType}})
	}
	validator := c.CompileCondition(validations, withParams, environment.StoredExpressions)
	messenger := c.CompileCondition(messages, msgParams, environment.StoredExpressions)
	budget := int64(celconfig.RuntimeCELCostBudget)
	var sum, heaviest int64
	denials := 0
	firstDenial := ""
	for _, existing := range s.existing {
		bindings := plugincel.OptionalVariableBindings{VersionedParams: existing.object(), Authorizer: rights{admin: true}}
		results, remaining, err := validator.ForInput(context.Background(), versioned, request, bindings, nil, budget)
		if err != nil {
			fmt.Printf("  ERROR against %s: %v\n", existing.name, err)
			failed = true
			return
		}
		cost := budget - remaining
		denied := false
		for i, r := range results {
			if r.Error != nil {
				fmt.Printf("  validation %d against %s: ERROR %s\n", i, existing.name, firstLine(r.Error.Error()))
				failed = true
				return
			}
			denied = denied || r.EvalResult.Value() != true
		}
		if denied {
			// The validator evaluates the message of a failed validation, from what is left.
			msgs, left, err := messenger.ForInput(context.Background(), versioned, request, bindings, nil, remaining)
			if err != nil || msgs[0].Error != nil {
				fmt.Printf("  message against %s: ERROR %v %v\n", existing.name, err, msgs[0].Error)
				failed = true
				return
			}
			cost += remaining - left
			denials++
			if firstDenial == "" {
				firstDenial = fmt.Sprint(msgs[0].EvalResult.Value())
			}
		}
		sum += cost
		if cost > heaviest {
			heaviest = cost
		}
	}
	decision := "admit"
	if denials > 0 {
		decision = fmt.Sprintf("deny (%d of %d pools): %s", denials, len(s.existing), firstDenial)
	}
	fmt.Printf("%s (%d ranges, %d existing pools)\n", s.title, len(s.new.ranges), len(s.existing))
	fmt.Printf("  heaviest evaluation %d (%s of RuntimeCELCostBudget); all %d evaluations %d; %s\n",
		heaviest, share(uint64(heaviest), celconfig.RuntimeCELCostBudget), len(s.existing), sum, decision)
	switch {
	case s.deny == "" && denials > 0:
		fmt.Printf("  UNEXPECTED: this write must be admitted\n")
		failed = true
	case s.deny != "" && !strings.Contains(firstDenial, s.deny):
		fmt.Printf("  UNEXPECTED: this write must be denied with %q\n", s.deny)
		failed = true
	}
}
