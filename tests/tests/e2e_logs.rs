//! The processes' logs as a log pipeline reads them (the counterpart of
//! upstream's contextual-logging check): after a claim's whole life on a
//! real containerd (prepare, a claim container and a shared one started,
//! the pod deleted, unprepare), every line of both logs is one JSON object
//! with no key twice at any depth, and the lines of an operation carry what
//! it is about: a prepare's and an unprepare's the claim's UID, a
//! container event's the container's id. Needs root and containerd, as
//! every `e2e_*` test.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod e2e_common;

use dra_cpu_tests::cri::spec::ContainerSpec;
use dra_cpu_tests::must::Must;
use dra_cpu_tests::node::layout::NodeOptions;
use dra_cpu_tests::node::pods::PodIdentity;
use dra_cpu_tests::node::read_back::{json_lines_in_span, json_span_field, log_line_problems};
use e2e_common::{node, shared_pod};

#[tokio::test]
async fn every_log_line_is_one_json_object_and_names_what_it_is_about() {
    let mut node = node(NodeOptions::default()).await;
    let (_shared, _shared_id) = shared_pod(&mut node, "logs-shared", 100).await;
    let pod = PodIdentity::new("logs");
    let claim = node
        .allocate_claim("logs-cpu", 1, &pod)
        .must("allocating the claim");
    let prepared = node.prepare(&claim).await.must("preparing the claim");
    let (running, id) = node
        .start_claim_container(&pod, &prepared, ContainerSpec::sleeper("app"))
        .await
        .must("the claim container on its CPU");
    node.delete_pod(&running)
        .await
        .must("deleting the claim pod");
    node.unprepare(&claim).await.must("unpreparing the claim");

    for (process, log) in [
        ("dra-plugin", node.dra_log()),
        ("nri-plugin", node.nri_log()),
    ] {
        assert!(!log.trim().is_empty(), "{process} logged nothing");
        let problems = log_line_problems(&log);
        assert!(
            problems.is_empty(),
            "{process}'s log is not one JSON object a line with unique keys:\n{}",
            problems.join("\n")
        );
    }

    let dra = node.dra_log();
    for span in ["prepare", "unprepare"] {
        let lines = json_lines_in_span(&dra, span);
        assert!(!lines.is_empty(), "no dra-plugin line inside a {span} span");
        for line in lines {
            assert_eq!(
                json_span_field(&line, span, "claim_uid").as_deref(),
                Some(claim.uid.as_str()),
                "a {span} line without the claim's UID: {line}"
            );
        }
    }
    // StartContainer logs in its span only for a container whose claim
    // asks for an isolated partition; CreateContainer always does.
    let nri = node.nri_log();
    for (span, required) in [("create_container", true), ("start_container", false)] {
        let lines = json_lines_in_span(&nri, span);
        let ours = lines
            .iter()
            .filter(|l| json_span_field(l, span, "container").as_deref() == Some(id.as_str()))
            .count();
        assert!(
            !required || ours > 0,
            "no nri-plugin line inside a {span} span of container {id}"
        );
        for line in &lines {
            assert!(
                json_span_field(line, span, "container").is_some(),
                "a {span} line without the container's id: {line}"
            );
        }
    }
}
