//! Prometheus' own Go text-format parser (`github.com/prometheus/common/expfmt`,
//! from Debian's packages) as a test oracle: `tests/src/prom-text-go` is
//! built once per test process and reads a `/metrics` body, so a test sees
//! the families, types, help strings and label names exactly as a Prometheus
//! server's text scrape would, not as a Rust re-implementation reads them.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// Go toolchains tried in order: the one `scripts/install-deps.sh`
/// installs, then whatever `go` is on PATH.
const GO_CANDIDATES: [&str; 2] = ["/usr/lib/go-1.24/bin/go", "go"];
/// Where Debian's Go source packages live (GOPATH mode).
const GOPATH: &str = "/usr/share/gocode";
const EXPFMT: &str = "/usr/share/gocode/src/github.com/prometheus/common/expfmt/text_parse.go";

/// One metric family as the Go parser read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Family {
    pub name: String,
    /// `counter`, `gauge`, `histogram`, `summary` or `untyped`.
    pub kind: String,
    pub help: String,
    /// Label names of its samples, sorted (a histogram's `le` excluded).
    pub labels: Vec<String>,
    pub series: usize,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum PromTextError {
    #[error("no Go toolchain (looked for {looked:?}); run scripts/install-deps.sh")]
    NoGo { looked: Vec<String> },
    #[error("Prometheus' expfmt sources are missing ({EXPFMT}); run scripts/install-deps.sh")]
    NoExpfmt,
    #[error("building the Prometheus text checker failed: {0}")]
    Build(String),
    #[error("the Prometheus Go parser refused the text: {0}")]
    Refused(String),
    #[error("running the Prometheus text checker: {0}")]
    Run(String),
}

impl PromTextError {
    /// The parser or its toolchain is not installed (as opposed to a build
    /// or parse failure): a test may skip outside CI.
    pub fn is_missing_tool(&self) -> bool {
        matches!(self, PromTextError::NoGo { .. } | PromTextError::NoExpfmt)
    }
}

fn source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/prom-text-go/main.go")
}

fn find_go() -> Result<String, PromTextError> {
    GO_CANDIDATES
        .iter()
        .find(|go| {
            Command::new(go)
                .arg("version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .map(|go| go.to_string())
        .ok_or_else(|| PromTextError::NoGo {
            looked: GO_CANDIDATES.iter().map(|s| s.to_string()).collect(),
        })
}

fn build() -> Result<PathBuf, PromTextError> {
    let go = find_go()?;
    if !Path::new(EXPFMT).exists() {
        return Err(PromTextError::NoExpfmt);
    }
    let dir = std::env::temp_dir().join(format!("dra-cpu-prom-text-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| PromTextError::Build(e.to_string()))?;
    let binary = dir.join("prom-text-check");
    // A cache shared by test processes keeps rebuilds to a link step.
    let cache = std::env::temp_dir().join("dra-cpu-go-cache");
    let output = Command::new(&go)
        .arg("build")
        .arg("-o")
        .arg(&binary)
        .arg(source())
        .env("GO111MODULE", "off")
        .env("GOPATH", GOPATH)
        .env("GOCACHE", &cache)
        .env("GOTOOLCHAIN", "local")
        .output()
        .map_err(|e| PromTextError::Build(format!("{go}: {e}")))?;
    if !output.status.success() {
        return Err(PromTextError::Build(
            String::from_utf8_lossy(&output.stderr).into_owned(),
        ));
    }
    Ok(binary)
}

fn checker() -> Result<&'static Path, PromTextError> {
    static CHECKER: OnceLock<Result<PathBuf, PromTextError>> = OnceLock::new();
    CHECKER
        .get_or_init(build)
        .as_ref()
        .map(PathBuf::as_path)
        .map_err(Clone::clone)
}

fn family_of(line: &str) -> Result<Family, PromTextError> {
    let bad = |what: &str| PromTextError::Run(format!("{what} in checker output line {line:?}"));
    let value: serde_json::Value = serde_json::from_str(line).map_err(|e| bad(&e.to_string()))?;
    let text = |key: &str| {
        value
            .get(key)
            .and_then(serde_json::Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| bad(key))
    };
    Ok(Family {
        name: text("name")?,
        kind: text("type")?,
        help: text("help")?,
        labels: value
            .get("labels")
            .and_then(serde_json::Value::as_array)
            .ok_or_else(|| bad("labels"))?
            .iter()
            .filter_map(|l| l.as_str().map(str::to_string))
            .collect(),
        series: value
            .get("series")
            .and_then(serde_json::Value::as_u64)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| bad("series"))?,
    })
}

/// Parse a `/metrics` body with Prometheus' Go parser; families by name.
pub fn parse(text: &str) -> Result<BTreeMap<String, Family>, PromTextError> {
    let checker = checker()?;
    let mut child = Command::new(checker)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| PromTextError::Run(e.to_string()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| PromTextError::Run(e.to_string()))?;
    }
    let output = child
        .wait_with_output()
        .map_err(|e| PromTextError::Run(e.to_string()))?;
    if !output.status.success() {
        return Err(PromTextError::Refused(
            String::from_utf8_lossy(&output.stderr).into_owned(),
        ));
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| family_of(line).map(|f| (f.name.clone(), f)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_go_parser_reads_families_and_refuses_bad_text() {
        let text = "# HELP a_total Things.\n# TYPE a_total counter\na_total{result=\"ok\"} 1\na_total{result=\"error\"} 0\n# HELP h Seconds.\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 1\nh_sum 0.5\nh_count 1\n";
        let families = match parse(text) {
            Ok(f) => f,
            Err(e) if e.is_missing_tool() => {
                crate::skip::skip_or_fail_in_ci(e);
                return;
            }
            Err(e) => panic!("{e}"),
        };
        assert_eq!(
            families.get("a_total"),
            Some(&Family {
                name: "a_total".into(),
                kind: "counter".into(),
                help: "Things.".into(),
                labels: vec!["result".into()],
                series: 2,
            })
        );
        assert_eq!(
            families.get("h").map(|f| f.kind.as_str()),
            Some("histogram")
        );
        assert_eq!(families.get("h").map(|f| f.labels.len()), Some(0));
        // A second TYPE line for one family is an error to Prometheus.
        let twice = "# TYPE a counter\n# TYPE a counter\na 1\n";
        assert!(matches!(parse(twice), Err(PromTextError::Refused(_))));
    }
}
