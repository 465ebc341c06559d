//! Kubernetes' `$(VAR)` expansion, as the kubelet applies it to a container's env values (against
//! the variables defined before) and to its command and args (against all of them).

use std::collections::HashMap;

/// `$(NAME)` becomes NAME's value when NAME is defined and stays as written otherwise; `$$` is a
/// literal `$`; any other `$` is kept.
pub fn expand(text: &str, vars: &HashMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(close) => {
                    let name = &inner[..close];
                    match vars.get(name) {
                        Some(value) => out.push_str(value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &inner[close + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = inner;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defined_undefined_and_escaped() {
        let vars = HashMap::from([
            ("A".to_string(), "x".to_string()),
            ("LWS_LEADER_ADDRESS".to_string(), "s-0.s.ns".to_string()),
        ]);
        assert_eq!(
            expand("--dist-init-addr $(LWS_LEADER_ADDRESS):$PORT", &vars),
            "--dist-init-addr s-0.s.ns:$PORT"
        );
        assert_eq!(expand("$(B) $$(A) $(A)$", &vars), "$(B) $(A) x$");
        assert_eq!(expand("${A} $(A", &vars), "${A} $(A");
    }
}
