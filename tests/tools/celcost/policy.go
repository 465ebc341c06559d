// celcost --policy FILE: the runtime CEL cost of the tenancy ValidatingAdmissionPolicy
// (portalloc-pool-holders in rbac/portalloc-tenancy-policy.yaml).
//
// kube-apiserver estimates no cost when a ValidatingAdmissionPolicy is written; it enforces, while
// admitting a request, PerCallLimit on each expression it evaluates (each variable is one) and
// RuntimeCELCostBudget on all of them together (the messageExpressions, which it evaluates for
// every request, from what the validations left). Exceeding either denies the request
// (failurePolicy: Fail). So this runs the policy as the admission plugin does (k8s.io/apiserver's
// admission/plugin/cel and policy/validating: the same compiler, lazily composed variables,
// validator and cost tracking) on synthetic PortPoolShard status writes: the heaviest a shard of
// 256 ports takes, and some that must be refused. For each it prints the cost of every variable
// (each evaluated once, in order: an upper bound, as the plugin skips those no validation reaches),
// validation and messageExpression, the total the plugin charges, and the decision.
//
// Exit status 1 when an expression does not compile (in the environment of the policy's oldest
// Kubernetes, 1.30, or of this one), an evaluation fails (a per-call limit exceeded is one), the
// total exceeds the budget, or a decision is not the expected one.
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
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/version"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/cel/environment"
)

const policyName = "portalloc-pool-holders"

var (
	shardGVK  = schema.GroupVersionKind{Group: "portalloc.dev", Version: "v1alpha1", Kind: "PortPoolShard"}
	shardGVR  = schema.GroupVersionResource{Group: "portalloc.dev", Version: "v1alpha1", Resource: "portpoolshards"}
	withAuthz = plugincel.OptionalVariableDeclarations{HasAuthorizer: true}
	noAuthz   = plugincel.OptionalVariableDeclarations{}
)

// expression is a CEL expression to compile with the given result types.
type expression struct {
	text  string
	types []*cel.Type
}

func (e expression) GetExpression() string    { return e.text }
func (e expression) ReturnTypes() []*cel.Type { return e.types }

// rights answers the policy's authorizer checks: a pool administrator may update shards (and
// PortAllocations everywhere); a tenant may update PortAllocations in its namespaces.
type rights struct {
	admin      bool
	namespaces []string
}

func (r rights) Authorize(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	allowed := r.admin
	if !allowed && a.GetResource() == "portallocations" && a.GetVerb() == "update" {
		for _, ns := range r.namespaces {
			allowed = allowed || ns == a.GetNamespace()
		}
	}
	if allowed {
		return authorizer.DecisionAllow, "", nil
	}
	return authorizer.DecisionNoOpinion, "", nil
}

type holder struct{ uid, owner, ports string }

// scenario is one status write: the shard's holders before and after, as whom, and whether the
// policy must admit it (deny: a text the denial contains).
type scenario struct {
	title         string
	before, after []holder
	as            rights
	deny          string
}

func runPolicy(path string) {
	policy, err := readPolicy(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "celcost: %s: %v\n", path, err)
		os.Exit(2)
	}
	fmt.Printf("# ValidatingAdmissionPolicy %s: runtime cost per request; limits: PerCallLimit %d per "+
		"expression, RuntimeCELCostBudget %d per request\n", policyName, celconfig.PerCallLimit,
		celconfig.RuntimeCELCostBudget)
	for _, v := range []*version.Version{version.MajorMinor(1, 30), environment.DefaultCompatibilityVersion()} {
		for _, e := range compileErrors(policy, v) {
			fmt.Printf("# compatibility version %s: %s\n", v, e)
			failed = true
		}
	}
	for _, s := range scenarios() {
		evaluate(policy, s)
	}
	if failed {
		os.Exit(1)
	}
}

func readPolicy(path string) (*admissionregistrationv1.ValidatingAdmissionPolicy, error) {
	return readPolicyNamed(path, policyName)
}

// readPolicyNamed is the ValidatingAdmissionPolicy `name` of the YAML documents in `path`.
func readPolicyNamed(path, name string) (*admissionregistrationv1.ValidatingAdmissionPolicy, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	docs := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		var p admissionregistrationv1.ValidatingAdmissionPolicy
		if err := docs.Decode(&p); err != nil {
			return nil, fmt.Errorf("no ValidatingAdmissionPolicy %s: %w", name, err)
		}
		if p.Kind == "ValidatingAdmissionPolicy" && p.Name == name {
			return &p, nil
		}
	}
}

// compiler holds the policy's variables, compiled as the plugin compiles them.
func compiler(p *admissionregistrationv1.ValidatingAdmissionPolicy, env *environment.EnvSet, mode environment.Type) *plugincel.CompositedCompiler {
	c, err := plugincel.NewCompositedCompiler(env)
	if err != nil {
		panic(err)
	}
	var vars []plugincel.NamedExpressionAccessor
	for _, v := range p.Spec.Variables {
		vars = append(vars, &validating.Variable{Name: v.Name, Expression: v.Expression})
	}
	c.CompileAndStoreVariables(vars, withAuthz, mode)
	return c
}

// compileErrors compiles every expression as kube-apiserver of compatibility version `v` does
// when the policy is written (NewExpressions).
func compileErrors(p *admissionregistrationv1.ValidatingAdmissionPolicy, v *version.Version) []string {
	c := compiler(p, environment.MustBaseEnvSet(v), environment.NewExpressions)
	var errs []string
	check := func(what string, e expression, opts plugincel.OptionalVariableDeclarations) {
		if r := c.CompileCELExpression(e, opts, environment.NewExpressions); r.Error != nil {
			errs = append(errs, fmt.Sprintf("%s: %s", what, firstLine(r.Error.Error())))
		}
	}
	for _, x := range p.Spec.Variables {
		check("variable "+x.Name, expression{x.Expression, []*cel.Type{cel.AnyType}}, withAuthz)
	}
	for i, x := range p.Spec.Validations {
		check(fmt.Sprintf("validation %d", i), expression{x.Expression, []*cel.Type{cel.BoolType}}, withAuthz)
		if x.MessageExpression != "" {
			check(fmt.Sprintf("message %d", i), expression{x.MessageExpression, []*cel.Type{cel.StringType}}, noAuthz)
		}
	}
	return errs
}

func shardObject(holders []holder) *unstructured.Unstructured {
	var hs []interface{}
	for _, h := range holders {
		hs = append(hs, map[string]interface{}{"uid": h.uid, "owner": h.owner, "ports": h.ports})
	}
	return &unstructured.Unstructured{Object: map[string]interface{}{
		"apiVersion": "portalloc.dev/v1alpha1",
		"kind":       "PortPoolShard",
		"metadata":   map[string]interface{}{"name": "gpu-118"},
		"spec": map[string]interface{}{
			"pool": "gpu", "poolUID": "u", "index": int64(118), "ranges": []interface{}{"30208-30463"},
		},
		"status": map[string]interface{}{"holders": hs},
	}}
}

// evaluate prints the cost of each expression of the policy for `s`, the total the plugin
// charges, and the decision.
func evaluate(p *admissionregistrationv1.ValidatingAdmissionPolicy, s scenario) {
	before, after := shardObject(s.before), shardObject(s.after)
	attrs := admission.NewAttributesRecord(after, before, shardGVK, "", "gpu-118", shardGVR, "status",
		admission.Update, nil, false, &user.DefaultInfo{Name: "someone", Groups: []string{"system:authenticated"}})
	versioned := &admission.VersionedAttributes{Attributes: attrs, VersionedKind: shardGVK,
		VersionedObject: after, VersionedOldObject: before}
	request := plugincel.CreateAdmissionRequest(attrs, metav1.GroupVersionResource(shardGVR), metav1.GroupVersionKind(shardGVK))
	bindings := plugincel.OptionalVariableBindings{Authorizer: s.as}
	budget := int64(celconfig.RuntimeCELCostBudget)
	// What one set of expressions costs in a context of its own, and their results.
	run := func(c *plugincel.CompositedCompiler, es []plugincel.ExpressionAccessor, opts plugincel.OptionalVariableDeclarations,
		b plugincel.OptionalVariableBindings) ([]plugincel.EvaluationResult, int64) {
		results, remaining, err := c.CompileCondition(es, opts, environment.StoredExpressions).ForInput(
			context.Background(), versioned, request, b, nil, budget)
		if err != nil {
			fmt.Printf("    ERROR %v\n", err)
			failed = true
			return nil, budget
		}
		return results, budget - remaining
	}
	c := compiler(p, environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()), environment.StoredExpressions)
	fmt.Printf("%s (%d -> %d holder entries, %d bytes of ports)\n", s.title, len(s.before), len(s.after), textSize(s.after))

	// Each variable once, in order, in one context: the cost of each alone.
	var names []string
	var each []plugincel.ExpressionAccessor
	for _, v := range p.Spec.Variables {
		names = append(names, "variable "+v.Name)
		each = append(each, expression{"variables." + v.Name, []*cel.Type{cel.AnyType}})
	}
	var spent int64
	for i := range each {
		results, total := run(c, each[:i+1], withAuthz, bindings)
		if results == nil {
			return
		}
		reportCost(names[i], total-spent, results[i])
		spent = total
	}
	// The validations, then the messages, as the validator evaluates them.
	var validations, messages []plugincel.ExpressionAccessor
	for i, v := range p.Spec.Validations {
		validations = append(validations, &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason})
		var m plugincel.ExpressionAccessor // none: a placeholder, as the validator has
		if v.MessageExpression != "" {
			m = expression{v.MessageExpression, []*cel.Type{cel.StringType}}
			r, cost := run(c, []plugincel.ExpressionAccessor{m}, noAuthz, plugincel.OptionalVariableBindings{})
			if r != nil {
				reportCost(fmt.Sprintf("message %d", i), cost, r[0])
			}
		}
		messages = append(messages, m)
	}
	results, validationCost := run(c, validations, withAuthz, bindings)
	msgs, messageCost := run(c, messages, noAuthz, plugincel.OptionalVariableBindings{})
	total := validationCost + messageCost
	verdict := share(uint64(total), celconfig.RuntimeCELCostBudget)

	// The decision.
	denial := ""
	for i, r := range results {
		if r.Error != nil {
			fmt.Printf("    validation %d: ERROR %s\n", i, firstLine(r.Error.Error()))
			failed = true
			continue
		}
		if r.EvalResult.Value() != true {
			message := p.Spec.Validations[i].Message
			if msgs != nil && msgs[i].Error == nil && msgs[i].EvalResult != nil {
				message = fmt.Sprint(msgs[i].EvalResult.Value())
			}
			denial += message + " | "
		}
	}
	decision := "admit"
	if denial != "" {
		decision = "deny: " + strings.TrimSuffix(denial, " | ")
	}
	fmt.Printf("  total %d (validations %d, messages %d): %s; %s\n", total, validationCost, messageCost, verdict, decision)
	switch {
	case s.deny == "" && denial != "":
		fmt.Printf("  UNEXPECTED: this write must be admitted\n")
		failed = true
	case s.deny != "" && !strings.Contains(denial, s.deny):
		fmt.Printf("  UNEXPECTED: this write must be denied with %q\n", s.deny)
		failed = true
	}
}

// reportCost prints one expression's cost against PerCallLimit, or its error (which fails the run).
func reportCost(name string, cost int64, r plugincel.EvaluationResult) {
	if r.Error != nil {
		fmt.Printf("    %-26s ERROR %s\n", name, firstLine(r.Error.Error()))
		failed = true
		return
	}
	fmt.Printf("    %-26s %9d  %s\n", name, cost, share(uint64(cost), celconfig.PerCallLimit))
}

func textSize(hs []holder) int {
	n := 0
	for _, h := range hs {
		n += len(h.ports)
	}
	return n
}

// scenarios are writes to the shard of window 118 (ports 30208-30463) of pool gpu.
func scenarios() []scenario {
	const first = 30208
	tenant := rights{namespaces: []string{"tenant-a"}}
	port := func(i int) string { return fmt.Sprint(first + i) }
	one := func(i int, ns string) holder {
		return holder{fmt.Sprintf("uid-%s-%d", ns, i), fmt.Sprintf("%s/p%d", ns, i), "web.http=" + port(i)}
	}
	// 255 one-port entries of another tenant: the most entries a window holds.
	var others []holder
	for i := 0; i < 255; i++ {
		others = append(others, one(i, "tenant-b"))
	}
	plus := func(hs []holder, more ...holder) []holder { return append(append([]holder{}, hs...), more...) }
	// Every entry of a full window of tenant-a's, before and after each moves to the next port.
	var all, moved []holder
	for i := 0; i < 256; i++ {
		all = append(all, one(i, "tenant-a"))
		h := one(i, "tenant-a")
		h.ports = "web.http=" + port((i+1)%256)
		moved = append(moved, h)
	}
	var ports []string
	for i := 0; i < 256; i++ {
		ports = append(ports, port(i))
	}
	half := func(from int) string { return "web.http=" + strings.Join(ports[from:from+128], ",") }
	// Entries an owner of many replicas writes: an index per replica, `-` for the other windows'.
	var dashes []holder
	for i := 0; i < 10; i++ {
		dashes = append(dashes, holder{fmt.Sprintf("uid-d%d", i), fmt.Sprintf("tenant-b/d%d", i),
			"web.http=" + strings.Repeat("-,", 6000) + port(i)})
	}
	a := func(ports string) holder { return holder{"uid-a", "tenant-a/a", ports} }
	return []scenario{
		{title: "a tenant allocates the last free port of a window of 255 one-port entries",
			before: others, after: plus(others, a("web.http="+port(255))), as: tenant},
		{title: "a tenant writes another tenant's port into its own entry, there",
			before: others, after: plus(others, a("web.http="+port(7))), as: tenant,
			deny: "this update lists port 30215 of PortAllocation tenant-a/a, which PortAllocation tenant-b/p7 holds"},
		{title: "... as a pool administrator (repair)",
			before: others, after: plus(others, a("web.http="+port(7))), as: rights{admin: true}},
		{title: "a block over another tenant's port",
			before: others[:20], after: plus(others[:20], a("web.nixl="+port(30)+"-"+port(40)+",-,"+port(5)+"-"+port(9))), as: tenant,
			deny: "this update lists port 30213 of PortAllocation tenant-a/a, which PortAllocation tenant-b/p5 holds"},
		{title: "another tenant's port behind leading zeros",
			before: others[:20], after: plus(others[:20], a("web.http=000"+port(7))), as: tenant,
			deny: "which PortAllocation tenant-b/p7 holds"},
		{title: "an entry under another entry's UID",
			before: others[:20], after: plus(others[:20], holder{"uid-tenant-b-3", "tenant-a/spoof", ""}), as: tenant,
			deny: "the entry of tenant-a/spoof has UID uid-tenant-b-3, as the entry of tenant-b/p3 does"},
		{title: "an entry that does not decode (a group twice)",
			before: others[:20], after: plus(others[:20], a("x.y="+port(100)+" x.y="+port(101))), as: tenant,
			deny: "the entry of tenant-a/a does not read as holdings"},
		{title: "an owner of all 256 ports of a window releases one",
			before: []holder{a("web.http=" + strings.Join(ports, ","))},
			after:  []holder{a("web.http=" + strings.Join(ports[:255], ","))}, as: tenant},
		{title: "two owners of 128 ports each swap them (sync --all)",
			before: []holder{{"uid-1", "tenant-a/one", half(0)}, {"uid-2", "tenant-a/two", half(128)}},
			after:  []holder{{"uid-1", "tenant-a/one", half(128)}, {"uid-2", "tenant-a/two", half(0)}}, as: tenant},
		{title: "all 256 entries of a full window change (sync --all)",
			before: all, after: moved, as: tenant},
		{title: "10 entries of 6000 indices each (replicas in other windows), a tenant allocates",
			before: dashes, after: plus(dashes, a("web.http="+strings.Repeat("-,", 6000)+port(100))), as: tenant},
		{title: "8 new entries in two namespaces (sync --all -A)",
			before: others[:20], after: plus(others[:20], one(100, "tenant-a"), one(101, "tenant-a"), one(102, "tenant-a"),
				one(103, "tenant-a"), one(104, "tenant-c"), one(105, "tenant-c"), one(106, "tenant-c"), one(107, "tenant-c")),
			as: rights{namespaces: []string{"tenant-a", "tenant-c"}}},
	}
}
