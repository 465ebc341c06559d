//! Unit tests of `error`: kube errors rendered once, in words.

use super::*;

fn status(code: u16, reason: &str, message: &str) -> kube::Error {
    kube::Error::Api(Box::new(Status {
        code,
        reason: reason.into(),
        message: message.into(),
        ..Default::default()
    }))
}

fn target() -> Target {
    Target {
        verb: "update",
        resource: "portallocations.portalloc.dev".into(),
        kind: "PortAllocation",
        name: Some("a".into()),
        namespace: Some("ns".into()),
    }
}

#[test]
fn a_conflict_names_the_object_and_says_a_rerun_is_safe() {
    let err = KubeError::from_kube(
        status(409, "Conflict", "the object has been modified"),
        target(),
    );
    assert_eq!(err.kind(), ApiErrorKind::Conflict);
    assert_eq!(err.code(), Some(409));
    assert!(matches!(err.kube_error(), Some(kube::Error::Api(_))));
    let text = err.to_string();
    assert!(
        text.starts_with("PortAllocation \"a\" in namespace \"ns\" was changed by another client"),
        "{text}"
    );
    assert!(
        text.ends_with("running the command again is safe"),
        "{text}"
    );
    // AlreadyExists is a 409 too, but not one a rerun fixes.
    let exists = KubeError::from_kube(status(409, "AlreadyExists", "already exists"), target());
    assert_eq!(exists.kind(), ApiErrorKind::Other);
}

#[test]
fn a_missing_object_differs_from_a_missing_resource_and_takes_a_hint() {
    let mut gone = Status {
        code: 404,
        reason: "NotFound".into(),
        message: "portallocations.portalloc.dev \"a\" not found".into(),
        ..Default::default()
    };
    gone.details = Some(serde_json::from_value(serde_json::json!({"name": "a"})).unwrap());
    let err = KubeError::from_kube(kube::Error::Api(Box::new(gone)), target())
        .with_hint(": list them with `kubectl portalloc get -A`");
    assert_eq!(err.kind(), ApiErrorKind::NotFound);
    assert_eq!(
        err.to_string(),
        "PortAllocation \"a\" not found in namespace \"ns\": list them with `kubectl portalloc get -A`"
    );
    let unknown = KubeError::from_kube(status(404, "", "404 page not found"), target());
    assert_eq!(unknown.kind(), ApiErrorKind::CrdsMissing);
}

/// Rust debug text, kube's variant names, or the same clause twice.
fn assert_product(text: &str) {
    for leak in [
        "Status {",
        "Some(",
        "ApiError",
        "Failed to parse",
        ": Forbidden",
        ": NotFound",
    ] {
        assert!(!text.contains(leak), "{leak:?} in {text}");
    }
    for clause in text.split([':', '.', '(', ')']).map(str::trim) {
        assert!(
            clause.len() < 20 || text.matches(clause).count() == 1,
            "said twice: {clause:?} in {text}"
        );
    }
}

#[test]
fn forbidden_says_the_server_once_and_names_the_role_that_grants_it() {
    let message = "customresourcedefinitions.apiextensions.k8s.io \"portpools.portalloc.dev\" is \
                   forbidden: User \"u\" cannot patch resource \"customresourcedefinitions\" in API \
                   group \"apiextensions.k8s.io\" at the cluster scope";
    let target = Target {
        verb: "patch",
        resource: "customresourcedefinitions.apiextensions.k8s.io".into(),
        kind: "CustomResourceDefinition",
        name: Some("portpools.portalloc.dev".into()),
        namespace: None,
    };
    let err = KubeError::from_kube(status(403, "Forbidden", message), target);
    let text = err.to_string();
    assert_eq!(
        text,
        "forbidden: you may not patch customresourcedefinitions.apiextensions.k8s.io: User \"u\" \
         cannot patch resource \"customresourcedefinitions\" in API group \"apiextensions.k8s.io\" \
         at the cluster scope. ClusterRole portalloc-admin (rbac/portalloc-admin.yaml) grants it: \
         ask a cluster administrator to bind it to you cluster-wide (a ClusterRoleBinding)"
    );
    assert_product(&text);
    // Through the CLI's renderer, which walks the causes: still once.
    let wrapped = anyhow::Error::new(err).context("installing");
    let top: &(dyn std::error::Error + 'static) = wrapped.as_ref();
    assert_product(&error_chain(top));

    let none = KubeError::from_kube(
        status(
            403,
            "Forbidden",
            "pods is forbidden: User \"u\" cannot deletecollection resource \"pods\" in API group \"\" in the namespace \"ns\"",
        ),
        target_in("deletecollection", "pods", "ns"),
    );
    assert!(
        none.to_string()
            .contains("No role of kubectl-portalloc grants it"),
        "{none}"
    );
}

fn target_in(verb: &'static str, resource: &str, ns: &str) -> Target {
    Target {
        verb,
        resource: resource.into(),
        kind: "PortAllocation",
        name: Some("simple".into()),
        namespace: Some(ns.into()),
    }
}

#[test]
fn a_missing_namespace_is_named_as_such() {
    let mut gone = Status {
        code: 404,
        reason: "NotFound".into(),
        message: "namespaces \"missing-ns\" not found".into(),
        ..Default::default()
    };
    gone.details = Some(
        serde_json::from_value(serde_json::json!({"name": "missing-ns", "kind": "namespaces"}))
            .unwrap(),
    );
    let err = KubeError::from_kube(
        kube::Error::Api(Box::new(gone)),
        target_in("create", "portallocations.portalloc.dev", "missing-ns"),
    )
    .with_hint(": list them with `kubectl portalloc get -A`");
    assert_eq!(err.kind(), ApiErrorKind::NotFound);
    let text = err.to_string();
    assert!(
        text.starts_with("namespace \"missing-ns\" does not exist")
            && text.contains("kubectl create namespace missing-ns"),
        "{text}"
    );
    assert!(
        !text.contains("PortAllocation \"simple\" not found"),
        "{text}"
    );
}

#[test]
fn a_request_with_no_answer_names_the_server() {
    let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
    let err = kube::Error::Service(Box::new(Unreachable {
        server: "https://10.0.0.1:6443".into(),
        source: Box::new(refused),
    }));
    let text = KubeError::from_kube(err, target()).to_string();
    assert!(
        text.starts_with("the API server at https://10.0.0.1:6443 is unavailable")
            && text.contains("connection refused")
            && text.contains("--context"),
        "{text}"
    );
    assert_product(&text);
}

#[test]
fn a_kube_error_in_a_chain_is_put_in_words() {
    // A body that was not a Status, as kube reports it.
    let page = status(404, "Failed to parse error data", "404 page not found");
    assert_eq!(render_kube_error(&page), "404 page not found");
    assert_product(&error_chain(&page));
    let mut listed = status(
        403,
        "Forbidden",
        "services is forbidden: User \"u\" cannot list",
    );
    if let kube::Error::Api(s) = &mut listed {
        s.status = Some(kube::core::response::StatusSummary::Failure);
    }
    // An error around it that prints it with its own text, as kube_runtime's do.
    #[derive(Debug, thiserror::Error)]
    #[error("failed to perform initial object list: {0}")]
    struct Around(#[source] kube::Error);
    let text = error_chain(&Around(listed));
    assert_eq!(
        text,
        "failed to perform initial object list: services is forbidden: User \"u\" cannot list"
    );
}

#[test]
fn retry_after_comes_from_the_status_details() {
    let mut busy = Status {
        code: 429,
        message: "too many requests".into(),
        ..Default::default()
    };
    busy.details =
        Some(serde_json::from_value(serde_json::json!({"retryAfterSeconds": 2})).unwrap());
    let err = kube::Error::Api(Box::new(busy));
    assert_eq!(server_retry_after(&err), Some(Duration::from_secs(2)));
    assert_eq!(server_retry_after(&status(409, "Conflict", "x")), None);
}
