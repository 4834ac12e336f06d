//! The performance table: every row measures the product and its baseline in
//! the same run and compares the figure with the row's goal.
//!
//! The pure parts (percentiles, goals and verdicts, table layout) live here
//! and are tested in this file; the measurements live in the submodules and
//! run from the `perf-table` binary.

// Test support: a panic here fails the test or measurement that called it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod dra;
pub mod inproc;
pub mod node_rows;

use std::fmt;
use std::time::Duration;

/// A summary of timing samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub samples: usize,
    pub median: Duration,
    pub p99: Duration,
    pub min: Duration,
    pub max: Duration,
}

/// The nearest-rank percentile `p` (0 < p ≤ 100) of sorted samples.
fn nearest_rank(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Median (the lower middle for an even count, a value that was measured),
/// p99 (nearest rank), min and max. `None` without samples.
pub fn summarize(samples: &[Duration]) -> Option<Summary> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    Some(Summary {
        samples: sorted.len(),
        median: nearest_rank(&sorted, 50.0),
        p99: nearest_rank(&sorted, 99.0),
        min: sorted[0],
        max: sorted[sorted.len() - 1],
    })
}

/// A duration in the unit that keeps three significant digits readable.
pub fn human(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.1} µs", ns as f64 / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.1} ms", ns as f64 / 1e6)
    } else {
        format!("{:.1} s", ns as f64 / 1e9)
    }
}

/// Kibibytes as MiB with one decimal.
pub fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// What a row must achieve.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Goal {
    /// measured / baseline must not exceed this.
    RatioAtMost(f64),
    /// measured / baseline (or a throughput ratio) must reach this.
    RatioAtLeast(f64),
    /// The measured time must not exceed this.
    AtMost(Duration),
    /// Reported for the record; no goal was set.
    None,
}

impl fmt::Display for Goal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Goal::RatioAtMost(r) => write!(f, "≤ {r}× baseline"),
            Goal::RatioAtLeast(r) => write!(f, "≥ {r}×"),
            Goal::AtMost(d) => write!(f, "≤ {}", human(*d)),
            Goal::None => write!(f, "(report)"),
        }
    }
}

/// The outcome of one row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Miss,
    /// No goal: the figure is for the record.
    Info,
    /// The row could not be measured here; the text says why.
    NotMeasured(String),
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Pass => write!(f, "PASS"),
            Verdict::Miss => write!(f, "MISS"),
            Verdict::Info => write!(f, "info"),
            Verdict::NotMeasured(_) => write!(f, "not measured"),
        }
    }
}

/// Judge a figure: `ratio` for the ratio goals, `value` for absolute ones.
pub fn judge(goal: Goal, value: Duration, ratio: Option<f64>) -> Verdict {
    let pass = match (goal, ratio) {
        (Goal::RatioAtMost(limit), Some(r)) => r <= limit,
        (Goal::RatioAtLeast(limit), Some(r)) => r >= limit,
        (Goal::RatioAtMost(_) | Goal::RatioAtLeast(_), None) => {
            return Verdict::NotMeasured("no baseline to compare with".into())
        }
        (Goal::AtMost(limit), _) => value <= limit,
        (Goal::None, _) => return Verdict::Info,
    };
    if pass {
        Verdict::Pass
    } else {
        Verdict::Miss
    }
}

/// `a / b` as a ratio of durations; `None` when `b` is zero.
pub fn ratio(a: Duration, b: Duration) -> Option<f64> {
    let b = b.as_secs_f64();
    (b > 0.0).then(|| a.as_secs_f64() / b)
}

/// One line of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The row number and a letter for sub-rows, e.g. "1", "6b".
    pub id: String,
    pub what: String,
    pub goal: Goal,
    pub measured: String,
    pub baseline: String,
    pub ratio: Option<f64>,
    pub verdict: Verdict,
}

impl Row {
    /// A row that could not be measured, with the reason in the verdict.
    pub fn not_measured(id: &str, what: &str, goal: Goal, reason: impl Into<String>) -> Row {
        Row {
            id: id.into(),
            what: what.into(),
            goal,
            measured: "-".into(),
            baseline: "-".into(),
            ratio: None,
            verdict: Verdict::NotMeasured(reason.into()),
        }
    }

    /// A timed row compared with a timed baseline (medians), judged on the
    /// median ratio (ratio goals) or on `judged` (absolute goals).
    pub fn timed(
        id: &str,
        what: &str,
        goal: Goal,
        measured: &Summary,
        baseline: Option<(&str, &Summary)>,
        judged: Duration,
        show_p99: bool,
    ) -> Row {
        let r = baseline.and_then(|(_, b)| ratio(measured.median, b.median));
        Row {
            id: id.into(),
            what: what.into(),
            goal,
            measured: describe(measured, show_p99),
            baseline: match baseline {
                Some((name, b)) => format!("{name}: {}", describe(b, show_p99)),
                None => "-".into(),
            },
            ratio: r,
            verdict: judge(goal, judged, r),
        }
    }
}

/// "median 1.2 ms (p99 3.4 ms, n=200)".
pub fn describe(s: &Summary, show_p99: bool) -> String {
    if show_p99 {
        format!(
            "median {} p99 {} (n={})",
            human(s.median),
            human(s.p99),
            s.samples
        )
    } else {
        format!("median {} (n={})", human(s.median), s.samples)
    }
}

/// The whole table as GitHub-flavoured Markdown, then the reasons of rows
/// that were not measured.
pub fn render(rows: &[Row]) -> String {
    let mut out = String::from(
        "| # | what | goal | measured | baseline | ratio | verdict |\n|---|---|---|---|---|---|---|\n",
    );
    for row in rows {
        let ratio = row
            .ratio
            .map(|r| format!("{r:.2}×"))
            .unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            cell(&row.id),
            cell(&row.what),
            cell(&row.goal.to_string()),
            cell(&row.measured),
            cell(&row.baseline),
            ratio,
            row.verdict
        ));
    }
    let reasons: Vec<String> = rows
        .iter()
        .filter_map(|r| match &r.verdict {
            Verdict::NotMeasured(why) => Some(format!("- row {}: not measured: {}", r.id, why)),
            _ => None,
        })
        .collect();
    if !reasons.is_empty() {
        out.push('\n');
        out.push_str(&reasons.join("\n"));
        out.push('\n');
    }
    out
}

/// Table cells cannot hold `|` or line breaks.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// VmRSS of a process in KiB, from `/proc/<pid>/status`.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_rss(&status)
}

/// The `VmRSS:` line of a `/proc/<pid>/status` text, in KiB.
pub fn parse_vm_rss(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn summary_table() {
        let cases: &[(&[u64], u64, u64)] = &[
            (&[5], 5, 5),
            (&[1, 2], 1, 2),
            (&[3, 1, 2], 2, 3),
            (&[4, 1, 3, 2], 2, 4),
        ];
        for (samples, median, p99) in cases {
            let d: Vec<Duration> = samples.iter().map(|&n| us(n)).collect();
            let s = summarize(&d).expect("samples");
            assert_eq!(s.median, us(*median), "{samples:?}");
            assert_eq!(s.p99, us(*p99), "{samples:?}");
        }
        assert_eq!(summarize(&[]), None);
        // 1..=200: the 99th percentile is the 198th value.
        let d: Vec<Duration> = (1..=200).rev().map(us).collect();
        let s = summarize(&d).expect("samples");
        assert_eq!(
            (s.median, s.p99, s.min, s.max),
            (us(100), us(198), us(1), us(200))
        );
    }

    #[test]
    fn verdict_table() {
        let cases = [
            (Goal::RatioAtMost(1.5), us(1), Some(1.4), Verdict::Pass),
            (Goal::RatioAtMost(1.5), us(1), Some(1.6), Verdict::Miss),
            (Goal::RatioAtLeast(5.0), us(1), Some(5.0), Verdict::Pass),
            (Goal::RatioAtLeast(5.0), us(1), Some(4.9), Verdict::Miss),
            (Goal::AtMost(us(200)), us(200), None, Verdict::Pass),
            (Goal::AtMost(us(200)), us(201), Some(0.1), Verdict::Miss),
            (Goal::None, us(1), None, Verdict::Info),
        ];
        for (goal, value, r, want) in cases {
            assert_eq!(judge(goal, value, r), want, "{goal:?} {value:?} {r:?}");
        }
        assert!(matches!(
            judge(Goal::RatioAtMost(1.5), us(1), None),
            Verdict::NotMeasured(_)
        ));
    }

    #[test]
    fn human_units_table() {
        let cases = [
            (Duration::from_nanos(950), "950 ns"),
            (Duration::from_nanos(12_345), "12.3 µs"),
            (Duration::from_micros(12_345), "12.3 ms"),
            (Duration::from_micros(2_390), "2.4 ms"),
            (Duration::from_secs(12), "12.0 s"),
        ];
        for (d, want) in cases {
            assert_eq!(human(d), want);
        }
    }

    #[test]
    fn rendered_table_has_every_row_and_the_reasons() {
        let s = summarize(&[us(10), us(20), us(30)]).expect("samples");
        let b = summarize(&[us(10)]).expect("samples");
        let rows = vec![
            Row::timed(
                "1",
                "a|b",
                Goal::RatioAtMost(1.5),
                &s,
                Some(("floor", &b)),
                s.median,
                false,
            ),
            Row::not_measured("4", "containerd", Goal::RatioAtMost(1.05), "no runtime"),
        ];
        let text = render(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[2].starts_with("| 1 | a\\|b | ≤ 1.5× baseline | median 20.0 µs (n=3) | floor: median 10.0 µs (n=1) | 2.00× | MISS |"), "{text}");
        assert!(lines[3].ends_with("| - | not measured |"), "{text}");
        assert!(text.contains("- row 4: not measured: no runtime"), "{text}");
    }

    #[test]
    fn vm_rss_is_read_from_status_text() {
        let text = "Name:\tdra-plugin\nVmPeak:\t  9000 kB\nVmRSS:\t   12345 kB\nThreads:\t4\n";
        assert_eq!(parse_vm_rss(text), Some(12345));
        assert_eq!(parse_vm_rss("Name:\tx\n"), None);
        let own = rss_kib(std::process::id()).expect("own RSS");
        assert!(own > 0);
    }

    proptest! {
        #[test]
        fn median_and_p99_are_samples_in_order(v in proptest::collection::vec(0u64..1_000_000, 1..300)) {
            let d: Vec<Duration> = v.iter().map(|&n| Duration::from_nanos(n)).collect();
            let s = summarize(&d).expect("samples");
            prop_assert!(d.contains(&s.median));
            prop_assert!(d.contains(&s.p99));
            prop_assert!(s.min <= s.median && s.median <= s.p99 && s.p99 <= s.max);
            let below = d.iter().filter(|&&x| x <= s.median).count();
            prop_assert!(below * 2 >= d.len());
        }
    }
}
