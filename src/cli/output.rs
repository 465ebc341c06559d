//! `-o table|wide|json|yaml|name`, the way kubectl prints objects.

use std::io::{self, Write};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use tabled::Table;
use tabled::settings::{Padding, Style};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Table,
    Wide,
    Json,
    Yaml,
    Name,
}

/// Print objects: one object as itself, several as a `List`, as kubectl does.
pub fn print_objects<T: Serialize>(
    objects: &[T],
    format: OutputFormat,
    single: bool,
) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    let value = if single && objects.len() == 1 {
        serde_json::to_value(&objects[0])?
    } else {
        serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects, "metadata": {}})
    };
    match format {
        OutputFormat::Json => writeln!(out, "{}", serde_json::to_string_pretty(&value)?)?,
        OutputFormat::Yaml => write!(out, "{}", serde_yaml::to_string(&value)?)?,
        _ => unreachable!("tables and names are printed by print_table and print_names"),
    }
    Ok(())
}

/// Drop columns (by index, as in the row struct) that this format does not show.
pub fn print_rows_without(table: &mut Table, columns: &[usize]) -> anyhow::Result<()> {
    use tabled::settings::Remove;
    use tabled::settings::object::Columns;
    for &column in columns.iter().rev() {
        table.with(Remove::column(Columns::new(column..=column)));
    }
    print_table(table)
}

/// The last `rows` rows of a table whose columns are sized by all of its rows, without the
/// columns given (a watch prints each change as one row lined up with the table before it).
pub fn print_last_rows_without(
    table: &mut Table,
    columns: &[usize],
    rows: usize,
) -> anyhow::Result<()> {
    use tabled::settings::Remove;
    use tabled::settings::object::Columns;
    for &column in columns.iter().rev() {
        table.with(Remove::column(Columns::new(column..=column)));
    }
    table.with(Style::blank()).with(Padding::new(0, 2, 0, 0));
    let text = table.to_string();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = io::stdout().lock();
    for line in &lines[lines.len().saturating_sub(rows)..] {
        writeln!(out, "{}", line.trim_end())?;
    }
    out.flush()?;
    Ok(())
}

/// A kubectl-style table: no borders, two spaces between columns, upper-case headers.
pub fn print_table(table: &mut Table) -> anyhow::Result<()> {
    table.with(Style::blank()).with(Padding::new(0, 2, 0, 0));
    let text = table.to_string();
    let mut out = io::stdout().lock();
    for line in text.lines() {
        writeln!(out, "{}", line.trim_end())?;
    }
    out.flush()?;
    Ok(())
}

pub fn print_names(kind: &str, names: impl IntoIterator<Item = String>) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    for name in names {
        writeln!(out, "{kind}/{name}")?;
    }
    out.flush()?;
    Ok(())
}

/// kubectl's short age: 45s, 12m, 5h, 3d, 2y.
pub fn age(created: Option<&Time>) -> String {
    let Some(Time(created)) = created else {
        return "<unknown>".into();
    };
    let seconds = Timestamp::now()
        .as_second()
        .saturating_sub(created.as_second())
        .max(0);
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s if s < 2 * 365 * 86400 => format!("{}d", s / 86400),
        s => format!("{}y", s / (365 * 86400)),
    }
}

/// A usage bar like `[#####.....]` for terminals and logs alike.
pub fn bar(used: u32, size: u32, width: usize) -> String {
    let filled = if size == 0 {
        0
    } else {
        ((used as u64 * width as u64).div_ceil(size as u64) as usize).min(width)
    };
    format!("[{}{}]", "#".repeat(filled), ".".repeat(width - filled))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_round_up_so_any_use_shows() {
        assert_eq!(bar(0, 100, 10), "[..........]");
        assert_eq!(bar(1, 100, 10), "[#.........]");
        assert_eq!(bar(100, 100, 10), "[##########]");
        assert_eq!(bar(0, 0, 4), "[....]");
    }

    #[test]
    fn ages_read_like_kubectl() {
        let ago = |s: i64| Time(Timestamp::from_second(Timestamp::now().as_second() - s).unwrap());
        assert_eq!(age(Some(&ago(30))), "30s");
        assert_eq!(age(Some(&ago(600))), "10m");
        assert_eq!(age(Some(&ago(3 * 86400))), "3d");
        assert_eq!(age(None), "<unknown>");
    }
}

/// Colour, only on a terminal and never with `NO_COLOR` set (https://no-color.org).
#[derive(Clone, Copy, Debug, Default)]
pub struct Paint {
    enabled: bool,
}

impl Paint {
    pub fn for_stdout() -> Paint {
        use std::io::IsTerminal;
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Paint {
            enabled: !no_color && io::stdout().is_terminal(),
        }
    }

    fn wrap(&self, code: &str, text: &str) -> String {
        if self.enabled {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }

    pub fn warn(&self, text: &str) -> String {
        self.wrap("33", text)
    }

    pub fn phase(&self, phase: &str) -> String {
        match phase {
            "Allocated" => self.wrap("32", phase),
            "Failed" => self.wrap("31", phase),
            _ => self.wrap("33", phase),
        }
    }
}
