//! Every relative link of the checked-in Markdown files resolves: the file or directory exists,
//! and a `#anchor` names a heading of the target Markdown file as GitHub forms anchors. No
//! network: links with a scheme (`https:`, `mailto:`) are not followed.
//!
//! The Markdown is read by `pulldown-cmark` (CommonMark with GitHub's tables, footnotes and
//! strikethrough), so code spans, fences, escapes and headings are what a renderer sees; HTML
//! `href`/`src` and `id`/`name` attributes are read from its HTML events. The tests at the end
//! pin each case the checker must get right.

use std::collections::{BTreeMap, HashSet};
use std::path::{Component, Path, PathBuf};

use pulldown_cmark::{Event, LinkType, Options, Parser, Tag, TagEnd};

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

/// The links (in the order they stand) and the heading anchors of one Markdown text.
fn parse(text: &str) -> Parsed {
    let options = Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS;
    let parser = Parser::new_ext(text, options).into_offset_iter();
    let mut reader = Reader::default();
    // Every definition counts, used or not; the links that use one are not counted again.
    for (_, def) in parser.reference_definitions().iter() {
        reader.links.push((def.span.start, def.dest.to_string()));
    }
    for (event, range) in parser {
        reader.read(event, range.start);
    }
    reader.links.sort_by_key(|(at, _)| *at);
    let lines = LineStarts::new(text);
    Parsed {
        links: reader
            .links
            .into_iter()
            .map(|(at, dest)| Link {
                line: lines.line_of(at),
                dest,
            })
            .collect(),
        anchors: reader.anchors,
    }
}

/// What the events of one text add up to: link destinations by byte offset, anchors.
#[derive(Default)]
struct Reader {
    links: Vec<(usize, String)>,
    anchors: HashSet<String>,
    slugs: Slugger,
    /// The text of the heading being read.
    heading: Option<String>,
    /// The HTML block being read, from its offset: its lines come as events of their own and a
    /// tag may span them.
    html_block: Option<(usize, String)>,
}

impl Reader {
    fn read(&mut self, event: Event<'_>, at: usize) {
        match event {
            Event::Start(Tag::Link {
                link_type,
                dest_url,
                ..
            })
            | Event::Start(Tag::Image {
                link_type,
                dest_url,
                ..
            }) if is_written_here(link_type) => self.links.push((at, dest_url.to_string())),
            Event::Start(Tag::Heading { .. }) => self.heading = Some(String::new()),
            Event::End(TagEnd::Heading(_)) => {
                let heading = self.heading.take().unwrap_or_default();
                self.anchors.insert(self.slugs.slug(&heading));
            }
            // A heading's text as GitHub renders it: code spans keep their content, links
            // their text, emphasis markers go.
            Event::Text(text) | Event::Code(text) => {
                if let Some(heading) = &mut self.heading {
                    heading.push_str(&text);
                }
            }
            Event::SoftBreak | Event::HardBreak => {
                if let Some(heading) = &mut self.heading {
                    heading.push(' ');
                }
            }
            Event::Start(Tag::HtmlBlock) => self.html_block = Some((at, String::new())),
            Event::Html(html) => {
                if let Some((_, block)) = &mut self.html_block {
                    block.push_str(&html);
                }
            }
            Event::End(TagEnd::HtmlBlock) => {
                if let Some((start, block)) = self.html_block.take() {
                    self.read_html(&block, start);
                }
            }
            Event::InlineHtml(html) => self.read_html(&html, at),
            _ => {}
        }
    }

    fn read_html(&mut self, html: &str, at: usize) {
        for dest in html_attributes(html, &["href", "src"]) {
            self.links.push((at, dest));
        }
        self.anchors.extend(html_attributes(html, &["id", "name"]));
    }
}

/// Whether a link's destination is written where the link stands: not a use of a reference
/// definition (the definition is checked on its own line), nor an e-mail address.
fn is_written_here(link_type: LinkType) -> bool {
    matches!(link_type, LinkType::Inline | LinkType::Autolink)
}

/// Byte offsets to 1-based line numbers.
struct LineStarts(Vec<usize>);

impl LineStarts {
    fn new(text: &str) -> LineStarts {
        let starts = std::iter::once(0).chain(text.match_indices('\n').map(|(at, _)| at + 1));
        LineStarts(starts.collect())
    }

    fn line_of(&self, at: usize) -> usize {
        self.0.partition_point(|&start| start <= at)
    }
}

/// Values of `name="..."` (or `'...'`) attributes in the HTML tags of the text.
fn html_attributes(html: &str, names: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for tag in html.split('<').skip(1) {
        let Some(tag) = tag.split('>').next() else {
            continue;
        };
        if !tag.starts_with(|c: char| c.is_ascii_alphabetic()) {
            continue;
        }
        // Attributes may stand on lines of their own.
        let tag = tag.replace(['\n', '\t'], " ");
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
                #not-a-heading\n\
                \n\
                <a id=\"custom\"></a>\n\
                \n\
                <div\n\
                  name=\"legacy\">x</div>\n";
    assert_eq!(
        anchors_of(text),
        [
            "4-requests-per-command",
            "custom",
            "kubectl-portalloc",
            "kubectl-portalloc-repair---pool-p---apply",
            "legacy",
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
                <a href=\"html.md\">x</a> [web](https://example.com/(x)) \\[escaped](no.md)\n\
                \n\
                Uses of [ref] and [ref][] are checked at the definition; <john@example.org> is mail.\n\
                \n\
                | a | [in a table](t.md) |\n\
                |---|---|\n\
                \n\
                A note[^1].\n\
                \n\
                [^1]: Not a [reference](f.md) definition.\n";
    assert_eq!(
        dests_of(text),
        [
            "a.md#x",
            "img.png",
            "b.md",
            "c d.md",
            "ref.md#y",
            "html.md",
            "https://example.com/(x)",
            "t.md",
            "f.md",
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
         [ok](src.rs#L2) [bad](src.rs#L9)\n\
         [bad, once][gone] and [bad, once][gone]\n\n[gone]: docs/gone.md\n",
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
            "README.md:10: (docs/gone.md): docs/gone.md does not exist",
        ]
    );
}
