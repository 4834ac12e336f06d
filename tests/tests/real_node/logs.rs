//! The driver's logs as `kubectl logs` gives them on the real node, the
//! counterpart of upstream's contextual-logging audit (which reads the
//! driver pods' logs after its whole suite): after a claim's whole life
//! (a shared pod and a pod with a claim of one CPU, the claim pod deleted),
//! every line a prepare or an unprepare logged names its claim's UID and
//! every line of a container's creation names the container, in the chart's
//! default text format and in JSON; in JSON every line is one object with
//! no key twice at any depth. The logs hold every earlier scenario's lines
//! too, so the check covers whatever ran before on this driver pod.
//!
//! Upstream checks begin/end lines of each operation; here an operation is a
//! span, and a line names its operation by the span's fields.

use super::*;
use dra_cpu_tests::node::read_back::{
    json_lines_in_span, json_span_field, log_line_problems, text_span_fields,
};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Format {
    Text,
    Json,
}

impl Format {
    fn value(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Json => "json",
        }
    }
}

/// The value of `field` of span `span` on every line of `log` inside that
/// span (None where a line lacks the field).
fn span_values(log: &str, format: Format, span: &str, field: &str) -> Vec<Option<String>> {
    match format {
        Format::Json => json_lines_in_span(log, span)
            .iter()
            .map(|line| json_span_field(line, span, field))
            .collect(),
        Format::Text => {
            let key = format!("{field}=");
            log.lines()
                .filter_map(|line| text_span_fields(line, span))
                .map(|fields| {
                    fields
                        .split_whitespace()
                        .find_map(|kv| kv.strip_prefix(key.as_str()))
                        .filter(|v| !v.is_empty())
                        .map(str::to_string)
                })
                .collect()
        }
    }
}

/// A driver container's log, through the API server and kubelet.
fn driver_log(node: &RealNode, container: &str) -> String {
    node.kubectl(&[
        "logs",
        "-n",
        DRIVER_NAMESPACE,
        &driver_pod(node),
        "-c",
        container,
    ])
    .unwrap()
}

/// The chart's log format for both processes set to `format` by `helm
/// upgrade --reuse-values` (the config's checksum rolls the pod) where it
/// was another, put back to what it was when dropped.
struct LogFormatSet<'a> {
    node: &'a RealNode,
    before: Option<(String, String)>,
}

impl<'a> LogFormatSet<'a> {
    fn new(node: &'a RealNode, format: Format) -> Self {
        let values = chart_values(node);
        let of = |section: &str| {
            values[section]["logFormat"]
                .as_str()
                .unwrap_or("text")
                .to_string()
        };
        let before = (of("draPlugin"), of("nri"));
        let want = format.value();
        if before.0 == want && before.1 == want {
            return LogFormatSet { node, before: None };
        }
        set_log_format(node, want, want);
        LogFormatSet {
            node,
            before: Some(before),
        }
    }
}

impl Drop for LogFormatSet<'_> {
    fn drop(&mut self) {
        if let Some((dra_plugin, nri_plugin)) = &self.before {
            set_log_format(self.node, dra_plugin, nri_plugin);
        }
    }
}

fn set_log_format(node: &RealNode, dra_plugin: &str, nri_plugin: &str) {
    node.script(&[
        "helm",
        "upgrade",
        "dra-cpu",
        "charts/dra-cpu",
        "-n",
        DRIVER_NAMESPACE,
        "--reuse-values",
        "--set",
        &format!("draPlugin.logFormat={dra_plugin}"),
        "--set",
        &format!("nri.logFormat={nri_plugin}"),
        "--wait",
        "--timeout",
        "300s",
    ])
    .unwrap();
    wait_driver_ready(node);
}

/// A claim's whole life on the node; returns the claim's UID and its
/// container's id once dra-plugin has logged the claim's unprepare.
fn one_claims_life(node: &RealNode, namespace: &str, format: Format) -> (String, String) {
    let ns = TestNamespace::new(node, namespace).unwrap();
    ns.start_shared_and_claim_pods("claim", None, POD_START)
        .unwrap();
    let claims = node.get_json(&["resourceclaims", "-n", &ns.name]).unwrap();
    let uid = claims["items"][0]["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let container = node.container_id(&ns.name, "claim", "app").unwrap();
    node.kubectl(&["delete", "pod", "-n", &ns.name, "claim", "--wait=false"])
        .unwrap();
    node.wait_deleted(&ns.name, "claim", POD_START).unwrap();
    node.wait(
        &format!("dra-plugin's log of the unprepare of claim {uid}"),
        CPUSET_CHANGE,
        || {
            let log = driver_log(node, "dra-plugin");
            let values = span_values(&log, format, "unprepare", "claim_uid");
            if values.iter().any(|v| v.as_deref() == Some(uid.as_str())) {
                Ok(Ok(()))
            } else {
                Ok(Err(format!("{} unprepare lines", values.len())))
            }
        },
    )
    .unwrap();
    (uid, container)
}

/// Every line of `span` in `log` names its `field`, and one names `subject`.
fn assert_lines_name(
    log: &str,
    format: Format,
    process: &str,
    span: &str,
    field: &str,
    subject: &str,
) {
    let values = span_values(log, format, span, field);
    assert!(
        values.iter().any(|v| v.as_deref() == Some(subject)),
        "{process} ({format:?}): no line inside a {span} span with {field} {subject} among {} lines of that span",
        values.len()
    );
    let missing: Vec<String> = match format {
        Format::Text => log
            .lines()
            .filter(|line| {
                text_span_fields(line, span).is_some_and(|fields| {
                    !fields
                        .split_whitespace()
                        .any(|kv| kv.starts_with(&format!("{field}=")))
                })
            })
            .map(str::to_string)
            .collect(),
        Format::Json => json_lines_in_span(log, span)
            .into_iter()
            .filter(|line| json_span_field(line, span, field).is_none())
            .map(|line| line.to_string())
            .collect(),
    };
    assert!(
        missing.is_empty(),
        "{process} ({format:?}): lines inside a {span} span without its {field}:\n{}",
        missing.join("\n")
    );
}

fn audit(node: &RealNode, format: Format, claim_uid: &str, container: &str) {
    let dra = driver_log(node, "dra-plugin");
    let nri = driver_log(node, "nri-plugin");
    for (process, log) in [("dra-plugin", &dra), ("nri-plugin", &nri)] {
        assert!(!log.trim().is_empty(), "{process} logged nothing");
        match format {
            // Colour codes only on a terminal: a pod's stderr is a pipe.
            Format::Text => assert!(
                !log.contains('\u{1b}'),
                "{process}'s text log carries terminal escape codes"
            ),
            Format::Json => {
                let problems = log_line_problems(log);
                assert!(
                    problems.is_empty(),
                    "{process}'s log is not one JSON object a line with unique keys:\n{}",
                    problems.join("\n")
                );
            }
        }
    }
    for span in ["prepare", "unprepare"] {
        assert_lines_name(&dra, format, "dra-plugin", span, "claim_uid", claim_uid);
    }
    assert_lines_name(
        &nri,
        format,
        "nri-plugin",
        "create_container",
        "container",
        container,
    );
}

#[test]
#[ignore = "needs the real node: scripts/real-node-tests.sh"]
fn the_drivers_logs_name_the_claim_or_container_of_every_line_in_text_and_json() {
    let (_guard, node) = node();
    wait_driver_ready(&node);
    for format in [Format::Text, Format::Json] {
        let _set = LogFormatSet::new(&node, format);
        let (uid, container) = one_claims_life(&node, &format!("logs-{}", format.value()), format);
        audit(&node, format, &uid, &container);
    }
}
