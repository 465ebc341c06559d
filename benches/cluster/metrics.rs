//! Counting API requests with the API server's own `apiserver_request_total` counter, read from
//! `GET /metrics` with the admin identity before and after the operation measured.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use kube::Client;

/// (verb, group, resource, subresource) -> requests, summed over codes, scopes and versions.
/// Non-resource requests (`/apis`, `/version`, ...) have an empty resource and their path as the
/// subresource.
pub type Counts = BTreeMap<(String, String, String, String), f64>;

pub async fn scrape(client: &Client) -> anyhow::Result<Counts> {
    Ok(parse(&fetch(client).await?, "apiserver_request_total"))
}

/// The API server's whole `/metrics` text.
pub async fn fetch(client: &Client) -> anyhow::Result<String> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    Ok(client.request_text(request).await?)
}

/// The server's own time spent per request (`apiserver_request_duration_seconds`: sum and count),
/// by (verb, group, resource, subresource).
pub struct Durations {
    sums: Counts,
    counts: Counts,
}

pub async fn scrape_durations(client: &Client) -> anyhow::Result<Durations> {
    let text = fetch(client).await?;
    Ok(Durations {
        sums: parse(&text, "apiserver_request_duration_seconds_sum"),
        counts: parse(&text, "apiserver_request_duration_seconds_count"),
    })
}

/// How much one request kind's figure, (verb, group, resource, subresource), grew between two
/// scrapes.
pub fn grew(before: &Counts, after: &Counts, request: (&str, &str, &str, &str)) -> f64 {
    let (verb, group, resource, subresource) = request;
    let key = (
        verb.into(),
        group.into(),
        resource.into(),
        subresource.into(),
    );
    let at = |counts: &Counts| counts.get(&key).copied().unwrap_or(0.0);
    at(after) - at(before)
}

/// Mean server-side milliseconds and number of `verb resource[/subresource]` requests between
/// two scrapes.
pub fn mean_duration_ms(
    before: &Durations,
    after: &Durations,
    verb: &str,
    group: &str,
    resource: &str,
    subresource: &str,
) -> (f64, u64) {
    let request = (verb, group, resource, subresource);
    let count = grew(&before.counts, &after.counts, request);
    let seconds = grew(&before.sums, &after.sums, request);
    (seconds * 1e3 / count.max(1.0), count.round() as u64)
}

fn parse(text: &str, metric: &str) -> Counts {
    let prefix = format!("{metric}{{");
    let mut counts = Counts::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(prefix.as_str()) else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let labels = parse_labels(labels);
        let label = |name: &str| labels.get(name).cloned().unwrap_or_default();
        *counts
            .entry((
                label("verb"),
                label("group"),
                label("resource"),
                label("subresource"),
            ))
            .or_default() += value;
    }
    counts
}

/// `a="x",b="y\"z"` -> {a: x, b: y"z}
fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut chars = text.chars().peekable();
    loop {
        let name: String = chars.by_ref().take_while(|&c| c != '=').collect();
        if name.is_empty() || chars.next() != Some('"') {
            break;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => value.extend(chars.next()),
                '"' => break,
                c => value.push(c),
            }
        }
        labels.insert(name.trim_start_matches(',').to_string(), value);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    labels
}

/// Requests a client of ours can have made: anything in our API group, and discovery. Excludes
/// the API server's own background traffic (leases, endpoint reconciling) and `/metrics` itself.
fn relevant(key: &(String, String, String, String)) -> bool {
    let (_, group, resource, subresource) = key;
    group == "portalloc.dev"
        || (resource.is_empty()
            && ["/api", "/version", "/openapi"]
                .iter()
                .any(|p| subresource.starts_with(p)))
}

/// The relevant requests made between two scrapes, and a breakdown such as
/// `GET portpools, POST portallocations, PUT portpools/status x2`.
pub fn delta(before: &Counts, after: &Counts) -> (u64, String) {
    let mut total = 0u64;
    let mut parts = Vec::new();
    for (key, value) in after {
        let grew = (value - before.get(key).copied().unwrap_or(0.0)).round() as u64;
        if grew == 0 || !relevant(key) {
            continue;
        }
        total += grew;
        let (verb, _, resource, subresource) = key;
        let mut part = format!("{verb} ");
        if resource.is_empty() {
            part.push_str(subresource);
        } else {
            part.push_str(resource);
            if !subresource.is_empty() {
                let _ = write!(part, "/{subresource}");
            }
        }
        if grew > 1 {
            let _ = write!(part, " x{grew}");
        }
        parts.push(part);
    }
    (total, parts.join(", "))
}
