//! What an error message a person reads must never hold: Rust debug text (`Status { .. }`,
//! `Some(..)`), the same sentence twice, kube's `Failed to parse` for a body that was not a
//! Status. Checked on every error path the bad-input tables and the RBAC tests walk.

/// Clauses shorter than this may repeat honestly (a name, "run the command again").
const LONGEST_HONEST_REPEAT: usize = 24;

/// Each way `text` fails the rules above, in words; empty when it keeps them.
pub fn defects(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    // `[A-Z][a-z]+ \{ `: a struct printed with {:?}.
    for (at, _) in text.match_indices(" { ") {
        let word = text[..at]
            .rsplit(|c: char| !c.is_ascii_alphanumeric())
            .next()
            .unwrap_or_default();
        let mut chars = word.chars();
        if chars.next().is_some_and(|c| c.is_ascii_uppercase())
            && chars.clone().next().is_some()
            && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_uppercase())
        {
            found.push(format!("Rust debug text `{word} {{ `"));
        }
    }
    for debug in [
        "Some(",
        "None)",
        "Failed to parse",
        "ApiError:",
        "HyperError:",
        "ServiceError:",
    ] {
        if text.contains(debug) {
            found.push(format!("`{debug}`"));
        }
    }
    for clause in text.split([':', '.', ';', '(', ')', '\n']).map(str::trim) {
        if clause.len() >= LONGEST_HONEST_REPEAT && text.matches(clause).count() > 1 {
            found.push(format!("said twice: {clause:?}"));
        }
    }
    found.sort();
    found.dedup();
    found
}

/// Panics naming what is wrong with `text` (`what` says where it came from).
pub fn assert_clean(what: &str, text: &str) {
    let found = defects(text);
    assert!(found.is_empty(), "{what}: {}:\n{text}", found.join(", "));
}

#[test]
fn debug_text_and_repeats_are_found_and_plain_messages_pass() {
    let leak = "error: pool describe: ApiError: forbidden: Forbidden (Status { status: Some(Failure), code: 403 })";
    let found = defects(leak);
    assert!(found.iter().any(|d| d.contains("Status { ")), "{found:?}");
    assert!(found.iter().any(|d| d.contains("Some(")), "{found:?}");
    let twice = "error: forbidden: you may not list services: services is forbidden: User \"u\" cannot list resource. Ask: services is forbidden: User \"u\" cannot list resource: Forbidden";
    assert!(
        defects(twice).iter().any(|d| d.starts_with("said twice")),
        "{twice}"
    );
    assert!(!defects("error: 404 page not found: Failed to parse error data").is_empty());
    let fine = "error: PortAllocation \"a\" not found in namespace \"ns\": list them with `kubectl portalloc get -A`";
    assert_eq!(defects(fine), Vec::<String>::new());
}
