package main

// Health checks configured in the argocd-cm ConfigMap, read as Argo CD's settings manager reads
// the split keys
//
//	resource.customizations.<type>.<group>_<Kind>   (or .<Kind> for the core group)
//
// and applied as gitops-engine's GetResourceHealth applies them: an object being deleted (and
// not held by Argo CD's hook finalizer) is Progressing "Pending deletion" before any script runs;
// otherwise the script for the object's group/kind runs, with the standard libraries only if
// resource.customizations.useOpenLibs.<group_kind> is true. A script error is Unknown health
// with the error as message. Objects with no script get no health (Argo CD's built-in checks
// cover no custom resources of ours, and wildcard keys are not supported here).

import (
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

const customizationsPrefix = "resource.customizations."

type override struct {
	healthLua   string
	useOpenLibs bool
}

// parseArgoCDCM returns the health overrides by "group/Kind" key from an argocd-cm ConfigMap.
func parseArgoCDCM(cm *unstructured.Unstructured) (map[string]override, error) {
	if cm.GetKind() != "ConfigMap" {
		return nil, fmt.Errorf("expected a ConfigMap, got %s", cm.GetKind())
	}
	data, _, err := unstructured.NestedStringMap(cm.Object, "data")
	if err != nil {
		return nil, fmt.Errorf("ConfigMap %s: data: %w", cm.GetName(), err)
	}
	overrides := map[string]override{}
	for key, value := range data {
		if !strings.HasPrefix(key, customizationsPrefix) {
			continue
		}
		parts := strings.SplitN(key, ".", 4)
		if len(parts) < 4 {
			continue
		}
		gk, err := overrideKey(parts[3])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		entry := overrides[gk]
		switch parts[2] {
		case "health":
			entry.healthLua = value
		case "useOpenLibs":
			if entry.useOpenLibs, err = strconv.ParseBool(value); err != nil {
				return nil, fmt.Errorf("%s: %w", key, err)
			}
		case "actions", "ignoreDifferences", "ignoreResourceUpdates", "knownTypeFields":
			// Valid in argocd-cm, irrelevant to health.
		default:
			return nil, fmt.Errorf("%s: resource customization type %q is not one Argo CD knows", key, parts[2])
		}
		overrides[gk] = entry
	}
	return overrides, nil
}

// overrideKey turns "group_Kind" into "group/Kind" and "Kind" into "Kind", as Argo CD does.
func overrideKey(groupKind string) (string, error) {
	if strings.Contains(groupKind, "*") {
		return "", fmt.Errorf("wildcard keys are not supported by this runner")
	}
	parts := strings.Split(groupKind, "_")
	switch {
	case len(parts) == 2:
		return parts[0] + "/" + parts[1], nil
	case len(parts) == 1 && groupKind != "":
		return groupKind, nil
	}
	return "", fmt.Errorf("group kind should be <group>_<Kind> or <Kind>, got %q", groupKind)
}

// healthFromOverrides is the health Argo CD shows for obj given the argocd-cm overrides.
// found is false when no script applies (Argo CD shows no health then).
func healthFromOverrides(obj *unstructured.Unstructured, overrides map[string]override) (health Health, found bool, err error) {
	if obj.GetDeletionTimestamp() != nil && !hasHookFinalizer(obj) {
		return Health{Status: "Progressing", Message: "Pending deletion"}, true, nil
	}
	gvk := obj.GroupVersionKind()
	key := gvk.Kind
	if gvk.Group != "" {
		key = gvk.Group + "/" + gvk.Kind
	}
	entry, ok := overrides[key]
	if !ok || entry.healthLua == "" {
		return Health{}, false, nil
	}
	health, err = runHealthScript(obj.Object, entry.healthLua, entry.useOpenLibs)
	if err != nil {
		return Health{Status: "Unknown", Message: err.Error()}, true, err
	}
	return health, true, nil
}

func hasHookFinalizer(obj *unstructured.Unstructured) bool {
	for _, f := range obj.GetFinalizers() {
		if f == "argocd.argoproj.io/hook-finalizer" {
			return true
		}
	}
	return false
}
