//! One bad-input case (a command line, maybe a manifest on stdin, and what the refusal must say)
//! and the check of one run against it.

use crate::support::cli::Run;

pub struct Case {
    pub what: &'static str,
    pub args: Vec<String>,
    pub stdin: Option<String>,
    pub code: i32,
    /// Each must appear in the error line.
    pub needles: Vec<String>,
}

impl Case {
    /// The same case without `-n` (its documents name their namespaces).
    pub fn without_namespace_flag(self) -> Case {
        let mut args = self.args;
        if let Some(at) = args.iter().position(|a| a == "-n") {
            args.drain(at..=at + 1);
        }
        Case { args, ..self }
    }

    /// The same case with `input` on stdin.
    pub fn with_stdin(self, input: String) -> Case {
        Case {
            stdin: Some(input),
            ..self
        }
    }
}

pub fn case(what: &'static str, args: &[&str], code: i32, needles: &[&str]) -> Case {
    Case {
        what,
        args: args.iter().map(|s| s.to_string()).collect(),
        stdin: None,
        code,
        needles: needles.iter().map(|s| s.to_string()).collect(),
    }
}

/// `create -f -` with `text` on stdin.
pub fn manifest(what: &'static str, ns: &str, text: String, code: i32, needles: &[&str]) -> Case {
    case(what, &["create", "-f", "-", "-n", ns], code, needles).with_stdin(text)
}

/// Whether `run` refused as `case` expects: its exit code, and one `error: ` line that holds
/// every needle.
pub fn check(case: &Case, run: &Run) -> Result<(), String> {
    if run.code != case.code {
        return Err(format!("expected exit {}, got {}", case.code, run.code));
    }
    // The manifest reader notes each document of another kind it skips, on a line of its own.
    let lines: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| !l.contains(": skipping "))
        .collect();
    let line = match (case.code, lines.as_slice()) {
        // clap's usage errors: the first line names the problem, usage follows.
        (2, [first, ..]) => *first,
        (_, [only]) => *only,
        _ => return Err("the message must be exactly one line".into()),
    };
    if !line.starts_with("error: ") {
        return Err("the message must start with \"error: \"".into());
    }
    let defects = crate::support::error_text::defects(line);
    if !defects.is_empty() {
        return Err(format!("not product text: {}", defects.join(", ")));
    }
    for needle in &case.needles {
        if !line.contains(needle.as_str()) {
            return Err(format!("{needle:?} not in the message"));
        }
    }
    Ok(())
}
