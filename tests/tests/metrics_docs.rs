//! Every series both processes serve on `/metrics` is documented in the
//! metrics page's table (docs/user/metrics.md), and every metric the chart's Grafana dashboard
//! queries is served. Runs the built `dra-plugin` and `nri-plugin`
//! (`cargo build -p dra-plugin -p nri-plugin` first) against the fake API
//! server, and reads their `/metrics` with Prometheus' own Go parser.
//!
//! `DRA_CPU_UPDATE_METRICS_TABLE=1` rewrites that table from the run
//! (labels of series without samples yet are kept from the page).

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use dra_cpu_tests::apiserver::FakeApiServer;
use dra_cpu_tests::metrics_doc::{
    dashboard_exprs, family_of, mismatches, parse_table, promql_metric_names, render_table,
    replace_table, with_declared,
};
use dra_cpu_tests::metrics_golden;
use dra_cpu_tests::node::layout::binary_candidates;
use dra_cpu_tests::prom_text::{self, Family};
use dra_cpu_tests::skip::skip_or_fail_in_ci;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);
/// The page with the table of every series.
const METRICS_PAGE: &str = "docs/user/metrics.md";
const DASHBOARD: &str = "charts/dra-cpu/dashboards/dra-cpu.json";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn binary(name: &str, env: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"));
    let looked = binary_candidates(name, std::env::var(env).ok().as_deref(), &target);
    looked
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "no {name} binary (looked at {looked:?}): cargo build -p dra-plugin -p nri-plugin"
            )
        })
}

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(addr).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    if !response.starts_with("HTTP/1.1 200") {
        return None;
    }
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
}

/// Kills the processes when the test ends, however it ends.
struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn metrics_of(addr: SocketAddr, what: &str, processes: &mut Processes) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(body) = get(addr, "/metrics") {
            return body;
        }
        for child in &mut processes.0 {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("a process exited ({status}) before {what} served /metrics");
            }
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not serve /metrics within {WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn parse(text: &str, what: &str) -> Option<BTreeMap<String, Family>> {
    match prom_text::parse(text) {
        Ok(families) => Some(with_declared(&families, text)),
        Err(e) if e.is_missing_tool() => {
            skip_or_fail_in_ci(e);
            None
        }
        Err(e) => panic!("{what}'s /metrics: {e}"),
    }
}

#[test]
fn readme_documents_every_series_and_the_dashboard_queries_only_served_ones() {
    let dir = tempfile::Builder::new()
        .prefix("dcpu-metrics")
        .tempdir_in("/tmp")
        .expect("temp dir");
    let api = FakeApiServer::start().expect("fake API server");
    api.insert_node("node-a").expect("node");
    let (dra_addr, nri_addr) = (free_addr(), free_addr());
    let state = dir.path().join("state");
    let socket = state.join("coordination.sock");
    let cdi = dir.path().join("cdi");
    let mut processes = Processes(Vec::new());
    let log = |name: &str| {
        std::fs::File::create(dir.path().join(name))
            .map(Stdio::from)
            .expect("log file")
    };
    processes.0.push(
        Command::new(binary("dra-plugin", "DRA_PLUGIN_BIN"))
            .arg("run")
            .args(["--node-name", "node-a", "--sysfs-root", "/"])
            .arg("--kubeconfig")
            .arg(api.kubeconfig_path())
            .arg("--kubelet-root-dir")
            .arg(dir.path().join("kubelet"))
            .arg("--state-dir")
            .arg(&state)
            .arg("--cdi-dir")
            .arg(&cdi)
            .arg(format!("--metrics-address={dra_addr}"))
            .env_remove("NODE_NAME")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log("dra-plugin.log"))
            .spawn()
            .expect("spawn dra-plugin"),
    );
    processes.0.push(
        Command::new(binary("nri-plugin", "NRI_PLUGIN_BIN"))
            .arg("--nri-socket")
            .arg(dir.path().join("no-runtime.sock"))
            .arg("--coordination-socket")
            .arg(&socket)
            .arg("--cdi-dir")
            .arg(&cdi)
            .args(["--sysfs-root", "/"])
            .arg(format!("--metrics-address={nri_addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log("nri-plugin.log"))
            .spawn()
            .expect("spawn nri-plugin"),
    );
    let dra_text = metrics_of(dra_addr, "dra-plugin", &mut processes);
    let nri_text = metrics_of(nri_addr, "nri-plugin", &mut processes);
    drop(processes);
    // Before any parsing: the names a scraper sees, as the golden files
    // keep them (`tests/golden/`, written from every family populated).
    for (process, text) in [("dra-plugin", &dra_text), ("nri-plugin", &nri_text)] {
        if let Err(problems) = metrics_golden::check_served(process, text) {
            panic!("{problems}");
        }
    }
    let Some(dra) = parse(&dra_text, "dra-plugin") else {
        return;
    };
    let Some(nri) = parse(&nri_text, "nri-plugin") else {
        return;
    };
    let served = [("dra-plugin", &dra), ("nri-plugin", &nri)];

    let readme_path = repo().join(METRICS_PAGE);
    let readme = std::fs::read_to_string(&readme_path).expect(METRICS_PAGE);
    let documented = parse_table(&readme).expect("metrics page table");
    if std::env::var_os("DRA_CPU_UPDATE_METRICS_TABLE").is_some() {
        let table = render_table(&served, &documented);
        let updated = replace_table(&readme, &table).expect("replace the table");
        std::fs::write(&readme_path, updated).expect("write the metrics page");
        eprintln!("rewrote the metrics table of {}", readme_path.display());
    }
    let readme = std::fs::read_to_string(&readme_path).expect(METRICS_PAGE);
    let documented = parse_table(&readme).expect("metrics page table");
    let problems = mismatches(&served, &documented);
    assert!(
        problems.is_empty(),
        "metrics page table (regenerate with DRA_CPU_UPDATE_METRICS_TABLE=1):\n{}",
        problems.join("\n")
    );

    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join(DASHBOARD)).expect("dashboard file"),
    )
    .expect("dashboard JSON");
    let families: BTreeSet<&str> = dra.keys().chain(nri.keys()).map(String::as_str).collect();
    let exprs = dashboard_exprs(&dashboard);
    assert!(
        exprs.len() >= 4,
        "the dashboard has {} queries",
        exprs.len()
    );
    let mut unknown = Vec::new();
    for expr in &exprs {
        let names = promql_metric_names(expr);
        assert!(!names.is_empty(), "no metric in {expr:?}");
        for name in names {
            if family_of(&name, &families).is_none() {
                unknown.push(format!("{name} (in {expr:?})"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "the dashboard queries metrics no process serves:\n{}",
        unknown.join("\n")
    );
}
