//! The admission policy that keeps two pools of one protocol from sharing a port
//! (rbac/portalloc-pool-overlap-policy.yaml, compiled in): `install` applies it, the chart and
//! deploy/ carry a copy.

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};

/// The policy and its binding as YAML, as checked in.
pub const POOL_OVERLAP_POLICY_YAML: &str =
    include_str!("../../rbac/portalloc-pool-overlap-policy.yaml");

/// The name of the policy and of its binding.
pub const POOL_OVERLAP_POLICY: &str = "portalloc-pool-overlap";

/// The policy and its binding, parsed.
pub fn pool_overlap_policy() -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    let mut docs = POOL_OVERLAP_POLICY_YAML.split("\n---\n");
    let policy = docs.next().expect("the policy document");
    let binding = docs.next().expect("the binding document");
    (
        serde_yaml::from_str(policy).expect("the checked-in policy parses"),
        serde_yaml::from_str(binding).expect("the checked-in binding parses"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_and_its_binding_parse_and_name_each_other() {
        let (policy, binding) = pool_overlap_policy();
        assert_eq!(policy.metadata.name.as_deref(), Some(POOL_OVERLAP_POLICY));
        let spec = binding.spec.expect("a binding spec");
        assert_eq!(spec.policy_name.as_deref(), Some(POOL_OVERLAP_POLICY));
        // Every PortPool is a param: the policy is evaluated once per other pool.
        let param_ref = spec.param_ref.expect("a paramRef");
        assert!(param_ref.selector.is_some() && param_ref.name.is_none());
        assert_eq!(
            param_ref.parameter_not_found_action.as_deref(),
            Some("Allow")
        );
        let kind = policy.spec.unwrap().param_kind.unwrap();
        assert_eq!(kind.kind.as_deref(), Some("PortPool"));
    }
}
