//! The table (docs/user/metrics.md) of every `/metrics` series, and the metric names a
//! Grafana dashboard's PromQL uses: both checked against what the running
//! binaries serve (`tests/tests/metrics_docs.rs`).
//!
//! The table sits between [`TABLE_BEGIN`] and [`TABLE_END`]; its rows are
//! generated from the families the processes serve (name, type, help as the
//! meaning, label names of the samples), so `DRA_CPU_UPDATE_METRICS_TABLE=1`
//! rewrites it from a run.

use crate::prom_text::Family;
use std::collections::{BTreeMap, BTreeSet};

pub const TABLE_BEGIN: &str = "<!-- metrics-table:begin (generated: DRA_CPU_UPDATE_METRICS_TABLE=1 cargo test -p dra-cpu-tests --test metrics_docs) -->";
pub const TABLE_END: &str = "<!-- metrics-table:end -->";
const HEADER: &str =
    "| series | type | labels | process | meaning |\n| --- | --- | --- | --- | --- |";

/// One documented series.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocRow {
    pub name: String,
    pub kind: String,
    pub labels: BTreeSet<String>,
    pub process: String,
    pub meaning: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocError {
    #[error("docs/user/metrics.md has no metrics table between {TABLE_BEGIN:?} and {TABLE_END:?}")]
    NoTable,
    #[error("docs/user/metrics.md table line {line}: {problem}: {text:?}")]
    BadRow {
        line: usize,
        problem: String,
        text: String,
    },
}

fn code(text: &str) -> String {
    text.trim().trim_matches('`').to_string()
}

/// The rows of the metrics page's table.
pub fn parse_table(readme: &str) -> Result<Vec<DocRow>, DocError> {
    let begin = readme.find(TABLE_BEGIN).ok_or(DocError::NoTable)?;
    let body = &readme[begin + TABLE_BEGIN.len()..];
    let end = body.find(TABLE_END).ok_or(DocError::NoTable)?;
    let mut rows = Vec::new();
    for (n, line) in body[..end].lines().enumerate() {
        let line = line.trim();
        if !line.starts_with('|') || line.starts_with("| series") || line.starts_with("| ---") {
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').collect();
        let [name, kind, labels, process, meaning] = cells.as_slice() else {
            return Err(DocError::BadRow {
                line: n,
                problem: format!("{} cells, want 5", cells.len()),
                text: line.to_string(),
            });
        };
        let labels = code(labels);
        rows.push(DocRow {
            name: code(name),
            kind: code(kind),
            labels: if labels == "-" {
                BTreeSet::new()
            } else {
                labels.split(',').map(code).collect()
            },
            process: code(process),
            meaning: meaning.trim().to_string(),
        });
    }
    Ok(rows)
}

/// The table for the families each process serves; labels already
/// documented are kept for families whose labelled series have no sample
/// yet (an error counter before the first error).
pub fn render_table(served: &[(&str, &BTreeMap<String, Family>)], documented: &[DocRow]) -> String {
    let known: BTreeMap<(&str, &str), &DocRow> = documented
        .iter()
        .map(|r| ((r.process.as_str(), r.name.as_str()), r))
        .collect();
    let mut out = String::from(HEADER);
    for (process, families) in served {
        for family in families.values() {
            let mut labels: BTreeSet<String> = family.labels.iter().cloned().collect();
            if let Some(row) = known.get(&(*process, family.name.as_str())) {
                labels.extend(row.labels.iter().cloned());
            }
            let labels = if labels.is_empty() {
                "-".to_string()
            } else {
                labels
                    .iter()
                    .map(|l| format!("`{l}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            out.push_str(&format!(
                "\n| `{}` | {} | {labels} | {process} | {} |",
                family.name,
                family.kind,
                family.help.replace('|', "\\|")
            ));
        }
    }
    out
}

/// `readme` with its metrics table replaced by `table`.
pub fn replace_table(readme: &str, table: &str) -> Result<String, DocError> {
    let begin = readme.find(TABLE_BEGIN).ok_or(DocError::NoTable)? + TABLE_BEGIN.len();
    let end = begin + readme[begin..].find(TABLE_END).ok_or(DocError::NoTable)?;
    Ok(format!("{}\n{table}\n{}", &readme[..begin], &readme[end..]))
}

/// What is wrong between the served families and the documented rows:
/// a served family without a row, or whose type, process or sample labels
/// the row does not match. Rows of families no process serves are reported
/// too (a renamed series leaves one behind).
pub fn mismatches(
    served: &[(&str, &BTreeMap<String, Family>)],
    documented: &[DocRow],
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for (process, families) in served {
        for family in families.values() {
            seen.insert((process.to_string(), family.name.clone()));
            let Some(row) = documented
                .iter()
                .find(|r| r.name == family.name && r.process == *process)
            else {
                problems.push(format!(
                    "{process} serves {} ({}) but the metrics page's table has no row for it",
                    family.name, family.kind
                ));
                continue;
            };
            if row.kind != family.kind {
                problems.push(format!(
                    "{}: the metrics page says {}, {process} serves a {}",
                    family.name, row.kind, family.kind
                ));
            }
            let undocumented: Vec<&String> = family
                .labels
                .iter()
                .filter(|l| !row.labels.contains(*l))
                .collect();
            if !undocumented.is_empty() {
                problems.push(format!(
                    "{}: labels {undocumented:?} are served but not on the metrics page",
                    family.name
                ));
            }
        }
    }
    for row in documented {
        if !seen.contains(&(row.process.clone(), row.name.clone())) {
            problems.push(format!(
                "the metrics page documents {} of {}, which does not serve it",
                row.name, row.process
            ));
        }
    }
    problems
}

/// `parsed` (Prometheus' parser's families) plus every family `text`
/// declares with `# HELP` / `# TYPE` but has no sample yet: the Go parser
/// drops those (a labelled counter before its first increment), yet they
/// are series of the process all the same.
pub fn with_declared(parsed: &BTreeMap<String, Family>, text: &str) -> BTreeMap<String, Family> {
    let mut all = parsed.clone();
    let mut help: BTreeMap<&str, &str> = BTreeMap::new();
    let mut kind: BTreeMap<&str, &str> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help.insert(name, text);
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, k) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            kind.insert(name, k.trim());
        }
    }
    for (name, k) in kind {
        all.entry(name.to_string()).or_insert_with(|| Family {
            name: name.to_string(),
            kind: k.to_string(),
            help: help.get(name).copied().unwrap_or("").to_string(),
            labels: Vec::new(),
            series: 0,
        });
    }
    all
}

/// PromQL keywords and aggregation modifiers that look like identifiers.
const PROMQL_WORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "and",
    "or",
    "unless",
    "atan2",
    "inf",
    "nan",
    // Aggregations, which may be followed by `by (...)` before their `(`.
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// The metric names a PromQL expression selects: identifiers that are not
/// function calls, keywords, label names inside `{...}` or grouping lists,
/// durations or strings. Good enough for dashboards; not a PromQL parser.
pub fn promql_metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    // Depth of `{...}` (label matchers) and whether the last word was a
    // grouping keyword whose `( ... )` lists labels.
    let mut in_braces = 0usize;
    let mut label_list = false;
    let mut in_label_list = false;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                // Skip a string literal.
                i += 1;
                while i < chars.len() && chars[i] != c {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
                continue;
            }
            '{' => in_braces += 1,
            '}' => in_braces = in_braces.saturating_sub(1),
            '[' => {
                // A range or subquery duration.
                while i < chars.len() && chars[i] != ']' {
                    i += 1;
                }
            }
            '(' if label_list => {
                in_label_list = true;
                label_list = false;
            }
            ')' if in_label_list => in_label_list = false,
            _ if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut j = i;
                while j < chars.len() && chars[j].is_whitespace() {
                    j += 1;
                }
                let call = chars.get(j) == Some(&'(');
                let lower = word.to_ascii_lowercase();
                if matches!(
                    lower.as_str(),
                    "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
                ) {
                    label_list = true;
                } else {
                    // Digits before it (`5m`, `1e3`) make it part of a number.
                    let in_number = start > 0 && chars[start - 1].is_ascii_digit();
                    let not_a_name = in_braces > 0
                        || in_label_list
                        || call
                        || in_number
                        || PROMQL_WORDS.contains(&lower.as_str());
                    if !not_a_name {
                        names.insert(word);
                    }
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    names
}

/// The family a sample name belongs to: itself, or for a histogram's
/// `_bucket`, `_sum` and `_count` series the histogram.
pub fn family_of<'a>(name: &'a str, families: &BTreeSet<&str>) -> Option<&'a str> {
    if families.contains(name) {
        return Some(name);
    }
    ["_bucket", "_sum", "_count"]
        .iter()
        .filter_map(|suffix| name.strip_suffix(suffix))
        .find(|base| families.contains(base))
}

/// Every PromQL `expr` in a Grafana dashboard JSON (panels, nested rows,
/// templating queries).
pub fn dashboard_exprs(dashboard: &serde_json::Value) -> Vec<String> {
    let mut exprs = Vec::new();
    let mut stack = vec![dashboard];
    while let Some(value) = stack.pop() {
        match value {
            serde_json::Value::Object(map) => {
                for (key, v) in map {
                    match (key.as_str(), v) {
                        ("expr", serde_json::Value::String(e)) => exprs.push(e.clone()),
                        // A variable's `label_values(selector, label)`:
                        // the selector is the PromQL, the label is not.
                        ("query", serde_json::Value::String(q)) if q.contains('(') => {
                            let selector = q
                                .strip_prefix("label_values(")
                                .and_then(|rest| rest.rsplit_once(','))
                                .map(|(selector, _)| selector.to_string());
                            exprs.push(selector.unwrap_or_else(|| q.clone()))
                        }
                        _ => stack.push(v),
                    }
                }
            }
            serde_json::Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    exprs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn family(name: &str, kind: &str, labels: &[&str]) -> Family {
        Family {
            name: name.into(),
            kind: kind.into(),
            help: format!("help of {name}"),
            labels: labels.iter().map(|l| l.to_string()).collect(),
            series: 1,
        }
    }

    fn served() -> BTreeMap<String, Family> {
        [
            family("a_total", "counter", &["reason"]),
            family("b_seconds", "histogram", &[]),
        ]
        .into_iter()
        .map(|f| (f.name.clone(), f))
        .collect()
    }

    fn readme(table: &str) -> String {
        format!("# x\n\n{TABLE_BEGIN}\n{table}\n{TABLE_END}\nafter\n")
    }

    #[test]
    fn a_generated_table_reads_back_and_matches() {
        let families = served();
        let served = [("dra-plugin", &families)];
        let documented = vec![DocRow {
            name: "a_total".into(),
            kind: "counter".into(),
            labels: ["operation".to_string()].into(),
            process: "dra-plugin".into(),
            meaning: String::new(),
        }];
        let table = render_table(&served, &documented);
        assert_eq!(
            table,
            "| series | type | labels | process | meaning |\n| --- | --- | --- | --- | --- |\n\
             | `a_total` | counter | `operation`, `reason` | dra-plugin | help of a_total |\n\
             | `b_seconds` | histogram | - | dra-plugin | help of b_seconds |"
        );
        let text = replace_table(&readme("old"), &table).expect("replace");
        assert!(text.ends_with(&format!("{TABLE_END}\nafter\n")), "{text}");
        let rows = parse_table(&text).expect("parse");
        assert_eq!(rows.len(), 2);
        assert!(
            mismatches(&served, &rows).is_empty(),
            "{:?}",
            mismatches(&served, &rows)
        );
    }

    #[test]
    fn every_kind_of_mismatch_is_named() {
        let families = served();
        let served = [("dra-plugin", &families)];
        let rows = parse_table(&readme(
            "| series | type | labels | process | meaning |\n| --- | --- | --- | --- | --- |\n\
             | `a_total` | gauge | - | dra-plugin | x |\n\
             | `gone_total` | counter | - | dra-plugin | x |",
        ))
        .expect("parse");
        let problems = mismatches(&served, &rows);
        assert_eq!(
            problems,
            [
                "a_total: the metrics page says gauge, dra-plugin serves a counter",
                "a_total: labels [\"reason\"] are served but not on the metrics page",
                "dra-plugin serves b_seconds (histogram) but the metrics page's table has no row for it",
                "the metrics page documents gone_total of dra-plugin, which does not serve it",
            ]
        );
        assert_eq!(parse_table("no table"), Err(DocError::NoTable));
        assert!(matches!(
            parse_table(&readme("| `a` | counter |")),
            Err(DocError::BadRow { .. })
        ));
    }

    #[test]
    fn promql_names() {
        let cases: &[(&str, &[&str])] = &[
            ("dra_cpu_exclusive_cpus", &["dra_cpu_exclusive_cpus"]),
            (
                "sum by (instance) (rate(dra_cpu_prepares_total{job=~\"dra.*\", result!=\"x\"}[5m]))",
                &["dra_cpu_prepares_total"],
            ),
            (
                "histogram_quantile(0.99, sum by (le, event) (rate(nri_plugin_reply_latency_seconds_bucket[$__rate_interval])))",
                &["nri_plugin_reply_latency_seconds_bucket"],
            ),
            (
                "a_total / on (instance) group_left (node) b_info offset 5m > 1e3 and bool c",
                &["a_total", "b_info", "c"],
            ),
            ("label_replace(up, \"x\", \"$1\", \"y\", \"(.*)\")", &["up"]),
        ];
        for (expr, want) in cases {
            let got = promql_metric_names(expr);
            let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
            assert_eq!(got, want, "{expr}");
        }
    }

    #[test]
    fn declared_families_without_samples_are_series_too() {
        let parsed = served();
        let text = "# HELP e_total Errors, by reason.\n# TYPE e_total counter\n\
                    # HELP a_total other help\n# TYPE a_total counter\na_total{reason=\"x\"} 1\n";
        let all = with_declared(&parsed, text);
        assert_eq!(all.len(), 3);
        assert_eq!(all["e_total"].kind, "counter");
        assert_eq!(all["e_total"].help, "Errors, by reason.");
        // What the parser read wins.
        assert_eq!(all["a_total"], parsed["a_total"]);
    }

    #[test]
    fn sample_names_map_to_their_family() {
        let families: BTreeSet<&str> = ["h_seconds", "c_total"].into();
        assert_eq!(family_of("h_seconds_bucket", &families), Some("h_seconds"));
        assert_eq!(family_of("h_seconds_count", &families), Some("h_seconds"));
        assert_eq!(family_of("c_total", &families), Some("c_total"));
        assert_eq!(family_of("c_total_bucket", &families), Some("c_total"));
        assert_eq!(family_of("nope", &families), None);
    }

    #[test]
    fn dashboard_exprs_are_found_at_any_depth() {
        let dashboard = serde_json::json!({
            "panels": [
                {"targets": [{"expr": "a"}]},
                {"type": "row", "panels": [{"targets": [{"expr": "b"}]}]}
            ],
            "templating": {"list": [{"query": "label_values(c, instance)"}, {"query": "plain"}]}
        });
        let mut exprs = dashboard_exprs(&dashboard);
        exprs.sort();
        assert_eq!(exprs, ["a", "b", "c"]);
    }
}
