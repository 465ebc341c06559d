//! Every relative link of the checked-in Markdown files resolves: the file or directory exists,
//! and a `#anchor` names a heading of the target Markdown file as GitHub forms anchors. No
//! network: links with a scheme (`https:`, `mailto:`) are not followed.
//!
//! Written here rather than with a Markdown crate: the docs use a small subset (ATX and setext
//! headings, inline links and images, reference definitions, code spans and fences, HTML
//! `href`/`id`), and the tests at the end pin each case the checker must get right.

use std::collections::{BTreeMap, HashSet};
use std::path::{Component, Path, PathBuf};

/// Directories never walked: build output and version control.
const SKIP_DIRS: &[&str] = &["target", ".git", "dist", ".local-cluster", "node_modules"];

#[test]
fn every_relative_link_and_anchor_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = markdown_files(root);
    assert!(
        files.iter().any(|f| f.ends_with("README.md")),
        "no README.md found under {}",
        root.display()
    );
    let broken = check(root, &files);
    assert!(
        broken.is_empty(),
        "{} broken link(s) in the Markdown files:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// Every `.md` file under `root`, outside [`SKIP_DIRS`], sorted.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if path.is_dir() {
                if !SKIP_DIRS.contains(&name.as_str()) {
                    stack.push(path);
                }
            } else if name.ends_with(".md") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// One line per broken link: `file:line: link: what is wrong`.
fn check(root: &Path, files: &[PathBuf]) -> Vec<String> {
    let mut anchors: BTreeMap<PathBuf, HashSet<String>> = BTreeMap::new();
    let mut broken = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap();
        let shown = file
            .strip_prefix(root)
            .unwrap_or(file)
            .display()
            .to_string();
        for link in parse(&text).links {
            if let Err(why) = resolve(root, file, &link.dest, &mut anchors) {
                broken.push(format!("{shown}:{}: ({}): {why}", link.line, link.dest));
            }
        }
    }
    broken
}

/// Checks one link destination written in `from`.
fn resolve(
    root: &Path,
    from: &Path,
    dest: &str,
    anchors: &mut BTreeMap<PathBuf, HashSet<String>>,
) -> Result<(), String> {
    if dest.is_empty() || has_scheme(dest) || dest.starts_with("//") {
        return Ok(());
    }
    if dest.starts_with('/') {
        return Err("a path from the site root: write it relative to this file".into());
    }
    let (path, fragment) = match dest.split_once('#') {
        Some((p, f)) => (p, Some(f)),
        None => (dest, None),
    };
    let path = path.split('?').next().unwrap_or_default();
    let target = if path.is_empty() {
        from.to_path_buf()
    } else {
        normalize(&from.parent().unwrap().join(percent_decode(path)))
    };
    let shown = target
        .strip_prefix(root)
        .unwrap_or(&target)
        .display()
        .to_string();
    if !target.exists() {
        return Err(format!("{shown} does not exist"));
    }
    let Some(fragment) = fragment else {
        return Ok(());
    };
    let fragment = percent_decode(fragment);
    if target.extension().is_some_and(|e| e == "md") {
        let known = anchors.entry(target.clone()).or_insert_with(|| {
            let text = std::fs::read_to_string(&target).unwrap_or_default();
            parse(&text).anchors
        });
        if known.contains(&fragment) {
            return Ok(());
        }
        let mut close: Vec<&String> = known
            .iter()
            .filter(|a| a.contains(&fragment) || fragment.contains(a.as_str()))
            .collect();
        close.sort();
        return Err(format!(
            "no heading of {shown} has the anchor #{fragment}{}",
            if close.is_empty() {
                String::new()
            } else {
                format!(" (close: {close:?})")
            }
        ));
    }
    // GitHub's line anchors of a source file: #L12 or #L12-L20.
    let lines = std::fs::read_to_string(&target)
        .map(|t| t.lines().count())
        .unwrap_or(0);
    let in_file = |l: &str| {
        l.strip_prefix('L')
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|n| n >= 1 && n <= lines)
    };
    let ok = match fragment.split_once('-') {
        Some((a, b)) => in_file(a) && in_file(b),
        None => in_file(&fragment),
    };
    if ok {
        Ok(())
    } else {
        Err(format!("#{fragment} is no line of {shown} ({lines} lines)"))
    }
}

fn has_scheme(dest: &str) -> bool {
    let Some((scheme, _)) = dest.split_once(':') else {
        return false;
    };
    !scheme.is_empty()
        && scheme.chars().next().unwrap().is_ascii_alphabetic()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
}

/// `a/./b/../c` as `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[derive(Debug)]
struct Link {
    line: usize,
    dest: String,
}

#[derive(Debug, Default)]
struct Parsed {
    links: Vec<Link>,
    anchors: HashSet<String>,
}

/// The links and the heading anchors of one Markdown text. Blocks (runs of lines between blank
/// lines, outside code fences) are read whole, so a link or code span may cross a line break.
fn parse(text: &str) -> Parsed {
    let mut parsed = Parsed::default();
    let mut slugs = Slugger::default();
    let mut fence: Option<(char, usize)> = None;
    let mut block: Vec<(usize, &str)> = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let number = i + 1;
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if let Some((ch, len)) = fence {
            let run = trimmed.chars().take_while(|&c| c == ch).count();
            if run >= len && trimmed[run..].trim().is_empty() {
                fence = None;
            }
            continue;
        }
        let opener = ['`', '~'].into_iter().find_map(|ch| {
            let run = trimmed.chars().take_while(|&c| c == ch).count();
            (indent <= 3 && run >= 3 && !(ch == '`' && trimmed[run..].contains('`')))
                .then_some((ch, run))
        });
        if let Some(open) = opener {
            flush(&mut block, &mut parsed);
            fence = Some(open);
            continue;
        }
        if trimmed.is_empty() {
            flush(&mut block, &mut parsed);
            continue;
        }
        if let Some(heading) = atx_heading(line) {
            flush(&mut block, &mut parsed);
            parsed.anchors.insert(slugs.slug(&heading_text(heading)));
            scan_links(heading, number, &mut parsed.links);
            continue;
        }
        // A setext underline turns the paragraph above it (one line here) into a heading.
        let underline = indent <= 3
            && !trimmed.is_empty()
            && (trimmed.trim_end().chars().all(|c| c == '=')
                || trimmed.trim_end().chars().all(|c| c == '-'));
        if underline && block.len() == 1 && !is_list_item(block[0].1) {
            let (start, above) = block.pop().unwrap();
            parsed
                .anchors
                .insert(slugs.slug(&heading_text(above.trim())));
            scan_links(above, start, &mut parsed.links);
            continue;
        }
        block.push((number, line));
    }
    flush(&mut block, &mut parsed);
    parsed
}

fn is_list_item(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with("- ") || t.starts_with("* ") || t.starts_with("+ ")
}

/// Reads one block: its reference definitions, links and HTML ids.
fn flush(block: &mut Vec<(usize, &str)>, parsed: &mut Parsed) {
    let Some(&(start, _)) = block.first() else {
        return;
    };
    // Reference definitions: `[label]: dest` at the start of a block, one per line.
    let mut rest = 0;
    for (number, line) in block.iter() {
        match reference_definition(line) {
            Some(dest) => parsed.links.push(Link {
                line: *number,
                dest,
            }),
            None => break,
        }
        rest += 1;
    }
    let text: Vec<&str> = block[rest..].iter().map(|(_, l)| *l).collect();
    let text = text.join("\n");
    scan_links(&text, start + rest, &mut parsed.links);
    for id in html_attributes(&strip_code_spans(&text), &["id", "name"]) {
        parsed.anchors.insert(id);
    }
    block.clear();
}

fn atx_heading(line: &str) -> Option<&str> {
    let trimmed = line.trim_start();
    if line.len() - trimmed.len() > 3 {
        return None;
    }
    let hashes = trimmed.chars().take_while(|&c| c == '#').count();
    if !(1..=6).contains(&hashes) {
        return None;
    }
    let rest = &trimmed[hashes..];
    if !rest.is_empty() && !rest.starts_with([' ', '\t']) {
        return None;
    }
    // An optional closing run of '#' preceded by a space.
    let rest = rest.trim();
    let closed = rest.trim_end_matches('#');
    Some(if closed.is_empty() || closed.ends_with([' ', '\t']) {
        closed.trim_end()
    } else {
        rest
    })
}

fn reference_definition(line: &str) -> Option<String> {
    let t = line.trim_start();
    if line.len() - t.len() > 3 || !t.starts_with('[') || t.starts_with("[^") {
        return None;
    }
    let close = t.find("]:")?;
    let dest = t[close + 2..].split_whitespace().next()?;
    Some(
        dest.trim_start_matches('<')
            .trim_end_matches('>')
            .to_string(),
    )
}

/// Inline links and images (`[text](dest "title")`, `![alt](<dest>)`) and HTML `href`/`src`
/// outside code spans; `line` is the line number of the text's first line.
fn scan_links(text: &str, line: usize, links: &mut Vec<Link>) {
    let text = strip_code_spans(text);
    let bytes = text.as_bytes();
    let line_of = |at: usize| line + text[..at].matches('\n').count();
    // Open brackets not yet closed: a `](` is a link only after an unescaped `[`.
    let mut open = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 1,
            b'[' => open += 1,
            b']' if open > 0 => {
                open -= 1;
                if bytes.get(i + 1) == Some(&b'(')
                    && let Some((dest, end)) = link_destination(&text[i + 2..])
                {
                    links.push(Link {
                        line: line_of(i),
                        dest,
                    });
                    i += 2 + end;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    for dest in html_attributes(&text, &["href", "src"]) {
        links.push(Link { line, dest });
    }
}

/// The destination at the start of `s` (just after `](`) and the length up to its `)`.
fn link_destination(s: &str) -> Option<(String, usize)> {
    let body = s.trim_start();
    let lead = s.len() - body.len();
    if let Some(inner) = body.strip_prefix('<') {
        let close = inner.find('>')?;
        let after = inner[close + 1..].find(')')?;
        return Some((inner[..close].to_string(), lead + 1 + close + 1 + after + 1));
    }
    let mut depth = 0usize;
    for (at, c) in body.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => return Some((body[..at].to_string(), lead + at + 1)),
            ')' => depth -= 1,
            c if c.is_whitespace() => {
                let after = body[at..].find(')')?;
                return Some((body[..at].to_string(), lead + at + after + 1));
            }
            _ => {}
        }
    }
    None
}

/// The text with every code span's content blanked (same length, newlines kept), so nothing in
/// a code span is taken for a link.
fn strip_code_spans(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = chars.clone();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|&&c| c == '`').count();
        let mut j = i + run;
        let mut closed = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let r = chars[j..].iter().take_while(|&&c| c == '`').count();
                if r == run {
                    closed = Some(j);
                    break;
                }
                j += r;
            } else {
                j += 1;
            }
        }
        match closed {
            Some(end) => {
                for c in &mut out[i + run..end] {
                    if *c != '\n' {
                        *c = ' ';
                    }
                }
                i = end + run;
            }
            None => i += run,
        }
    }
    out.into_iter().collect()
}

/// Values of `name="..."` attributes in HTML tags of the text.
fn html_attributes(text: &str, names: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for tag in text.split('<').skip(1) {
        let Some(tag) = tag.split('>').next() else {
            continue;
        };
        if !tag.starts_with(|c: char| c.is_ascii_alphabetic()) {
            continue;
        }
        for name in names {
            for quote in ['"', '\''] {
                let key = format!(" {name}={quote}");
                if let Some(at) = tag.find(&key) {
                    let value = &tag[at + key.len()..];
                    if let Some(end) = value.find(quote) {
                        out.push(value[..end].to_string());
                    }
                }
            }
        }
    }
    out
}

/// A heading's text as GitHub renders it: code spans keep their content, links their text,
/// emphasis markers go.
fn heading_text(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        let Some(close) = after.find("](") else {
            break;
        };
        let Some((_, end)) = link_destination(&after[close + 2..]) else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&after[..close]);
        rest = &after[close + 2 + end..];
    }
    text.push_str(rest);
    text
}

/// GitHub's anchors: lowercase; letters, digits, '-', '_' and spaces kept, each space made a
/// '-', the rest dropped; a repeated anchor gets `-1`, `-2`, ... in order.
#[derive(Default)]
struct Slugger {
    seen: HashSet<String>,
}

impl Slugger {
    fn slug(&mut self, text: &str) -> String {
        let base: String = text
            .trim()
            .to_lowercase()
            .chars()
            .filter(|&c| c.is_alphanumeric() || c == '-' || c == '_' || c == ' ')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut slug = base.clone();
        let mut n = 0;
        while !self.seen.insert(slug.clone()) {
            n += 1;
            slug = format!("{base}-{n}");
        }
        slug
    }
}

// The checker's own cases: each would let a broken link through, or fail a good one, if wrong.

fn anchors_of(text: &str) -> Vec<String> {
    let mut a: Vec<String> = parse(text).anchors.into_iter().collect();
    a.sort();
    a
}

fn dests_of(text: &str) -> Vec<String> {
    parse(text).links.into_iter().map(|l| l.dest).collect()
}

#[test]
fn anchors_are_formed_as_github_forms_them() {
    let text = "# kubectl-portalloc\n\
                ## `kubectl portalloc repair [--pool P] [--apply]`\n\
                ## The env follows the allocation: `spec.configMap`\n\
                ### 4. Requests per command\n\
                ## Packed placement (issue 22)\n\
                ## Tests\n\
                ## Tests\n\
                ## Tests ##\n\
                ## See [the design](design.md) & *more*\n\
                ## Über `port_range` → 2×\n\
                Setext\n\
                ------\n\
                #not-a-heading\n";
    assert_eq!(
        anchors_of(text),
        [
            "4-requests-per-command",
            "kubectl-portalloc",
            "kubectl-portalloc-repair---pool-p---apply",
            "packed-placement-issue-22",
            "see-the-design--more",
            "setext",
            "tests",
            "tests-1",
            "tests-2",
            "the-env-follows-the-allocation-specconfigmap",
            "über-port_range--2",
        ]
    );
}

#[test]
fn links_in_code_are_not_links_and_links_across_lines_are() {
    let text = "A [link](a.md#x) and `[not](code.md)` and ![img](img.png \"title\").\n\
                A [link across a\n\
                line](b.md) and [angle](<c d.md>).\n\
                \n\
                ```sh\n\
                [not](fenced.md)\n\
                ```\n\
                \n\
                ````md\n\
                ```\n\
                [still not](fenced.md)\n\
                ````\n\
                \n\
                [ref]: ref.md#y\n\
                <a href=\"html.md\">x</a> [web](https://example.com/(x)) \\[escaped](no.md)\n";
    assert_eq!(
        dests_of(text),
        [
            "a.md#x",
            "img.png",
            "b.md",
            "c d.md",
            "ref.md#y",
            "https://example.com/(x)",
            "html.md"
        ]
    );
}

#[test]
fn broken_files_and_anchors_are_reported_and_good_ones_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir(root.join("docs")).unwrap();
    std::fs::write(
        root.join("README.md"),
        "# Top\n\n## Install\n\n[ok](docs/a.md#usage) [ok](#install) [ok](docs/) [ok](docs/a.md)\n\
         [bad](docs/missing.md) [bad](docs/a.md#nope) [bad](#top-1) [web](https://x.invalid/y)\n\
         [ok](src.rs#L2) [bad](src.rs#L9)\n",
    )
    .unwrap();
    std::fs::write(root.join("src.rs"), "fn a() {}\nfn b() {}\n").unwrap();
    std::fs::write(
        root.join("docs/a.md"),
        "# A\n\n## Usage\n\n[ok](../README.md#install)\n",
    )
    .unwrap();
    let files = markdown_files(root);
    let broken = check(root, &files);
    assert_eq!(
        broken,
        [
            "README.md:6: (docs/missing.md): docs/missing.md does not exist",
            "README.md:6: (docs/a.md#nope): no heading of docs/a.md has the anchor #nope",
            "README.md:6: (#top-1): no heading of README.md has the anchor #top-1 (close: [\"top\"])",
            "README.md:7: (src.rs#L9): #L9 is no line of src.rs (2 lines)",
        ]
    );
}
